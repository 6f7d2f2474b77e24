# cocoon-cri. `make demo` runs a VM pod on the cocoon simulator through crictl; `make test` runs
# every test. Both set up what they need (Debian packages, the test tools) on the first run.

GO        ?= go
BIN       := $(CURDIR)/bin
VERSION   ?= $(shell ./hack/version.sh)
LDFLAGS   := -X main.version=$(VERSION)

# Where `make install` puts things (GNU conventions: DESTDIR is a staging root, PREFIX the tree
# the binary lives in). The configuration and the unit are not under PREFIX: the unit runs
# /usr/local/bin/cocoon-cri --config /etc/cocoon-cri/config.yaml, and install rewrites those two
# paths in it when BINDIR or SYSCONFDIR differ.
PREFIX         ?= /usr/local
DESTDIR        ?=
BINDIR         ?= $(PREFIX)/bin
DATADIR        ?= $(PREFIX)/share
SYSCONFDIR     ?= /etc
SYSTEMDUNITDIR ?= /etc/systemd/system
# `make release` writes DIST/cocoon-cri-VERSION-linux-ARCH.tar.gz and its .sha256.
DIST           ?= $(BIN)/release
ARCH           ?= $(shell $(GO) env GOARCH)

.PHONY: all build cocoon-cri install release setup tools test test-unit vet fmt-check demo cluster bench clean

all: build

build: cocoon-cri
	$(GO) build -o $(BIN)/cocoon-sim ./test/cocoonsim/cmd/cocoon-sim
	$(GO) build -o $(BIN)/mktestimage ./test/cmd/mktestimage
	$(GO) build -o $(BIN)/cocoon-cluster ./test/cmd/cocoon-cluster

# The daemon alone: what install and release ship.
cocoon-cri:
	$(GO) build -ldflags "$(LDFLAGS)" -o $(BIN)/cocoon-cri ./cmd/cocoon-cri

# The binary, the systemd unit, the configuration (never overwriting /etc/cocoon-cri/config.yaml
# or /etc/crictl.yaml), and the shipped defaults and manifests under DATADIR/cocoon-cri.
install: cocoon-cri
	BIN='$(BIN)' DESTDIR='$(DESTDIR)' PREFIX='$(PREFIX)' BINDIR='$(BINDIR)' DATADIR='$(DATADIR)' \
		SYSCONFDIR='$(SYSCONFDIR)' SYSTEMDUNITDIR='$(SYSTEMDUNITDIR)' ./hack/install.sh install

# The same files as `make install DESTDIR=... PREFIX=/usr/local`, in a tarball to unpack over /
# on a node without Go, and a sha256sum file beside it.
release: cocoon-cri
	BIN='$(BIN)' DIST='$(DIST)' VERSION='$(VERSION)' ARCH='$(ARCH)' ./hack/install.sh release

# Debian packages the simulator and tests rely on, the real guest (a Debian kernel under QEMU) the
# data-path tests boot, and a mkfs.erofs with --tar for OCI VM image pulls; each only when missing.
setup:
	./hack/setup.sh
	./hack/setup-realguest.sh
	./hack/setup-erofs.sh

# crictl and critest (pinned in test/tools/go.mod), the kubelet, the control plane and kubectl
# (test/tools/kubelet/go.mod), etcd (test/tools/etcd/go.mod), the cluster's CoreDNS
# (test/tools/coredns) and containerd with its runc shim and ctr (test/tools/containerd/go.mod),
# built once per version.
tools:
	./hack/build-tools.sh

vet:
	$(GO) vet ./...

fmt-check:
	@out=$$(gofmt -l $$(git ls-files '*.go')); if [ -n "$$out" ]; then echo "not gofmt-clean:"; echo "$$out"; exit 1; fi

# Every test, with the race detector. The end-to-end suites drive bin/crictl, bin/critest,
# bin/kubelet and kubectl (hack/cluster.sh) against cocoon-cri on the simulator, with
# bin/containerd as the passthrough runtime. They take about 13 minutes on a 2-core machine with
# the tools built; the timeouts leave room for a slow day within CI's 90. The end-to-end package
# runs after the others, not beside the simulator's tests: each runs VMs and daemons of its own,
# and together they once loaded a slow machine's two cores past what its waits allowed. Both
# halves run, and either failing fails the target.
test: setup tools fmt-check vet
	@status=0; \
	COCOON_CRI_BIN=$(BIN) $(GO) test -race -count=1 -timeout 30m $$($(GO) list ./... | grep -v '/test/e2e$$') || status=1; \
	COCOON_CRI_BIN=$(BIN) $(GO) test -race -count=1 -timeout 45m ./test/e2e || status=1; \
	exit $$status

# The demo needs only crictl of the tools.
demo: setup build
	./hack/build-tools.sh crictl
	./hack/demo.sh

# The product's tests without the end-to-end suites and the simulator's own (which run VMs, in
# network namespaces): under a minute on 2 cores, no tools needed. Tests that need root (network
# namespaces, cgroups) skip themselves without it.
test-unit: fmt-check vet
	$(GO) test -race -count=1 $$($(GO) list ./... | grep -v -e /test/e2e -e /test/cocoonsim)

# A Kubernetes with cocoon-cri as its runtime, for kubectl (NODES=2 or 3 for more nodes);
# hack/cluster.sh down ends it.
NODES ?= 1
cluster:
	./hack/cluster.sh up --nodes $(NODES)

# Benchmarks (Go benchmarks, and critest -benchmark against a real containerd and through
# cocoon-cri), written to docs/performance.md. Run on an idle machine.
bench: setup tools build
	./hack/bench.sh

clean:
	rm -rf $(BIN)
