#!/usr/bin/env bash
# Builds the pinned test clients into bin/: crictl and critest from test/tools, the kubelet from
# test/tools/kubelet (a module of its own: k8s.io/kubernetes pins its staging modules with replace
# directives that crictl's module must not inherit), containerd with its runc shim and ctr from
# test/tools/containerd (the passthrough runtime of the tests), and the control plane of
# hack/cluster.sh: kube-apiserver, kube-controller-manager, kube-scheduler, kube-proxy and kubectl from
# test/tools/kubelet, etcd from test/tools/etcd, and the cluster DNS: a CoreDNS with only the plugins
# the cluster uses, from the main package of test/tools/coredns.
# With arguments, only the tools named (control-plane is all of the cluster's; coredns alone works too).
# A stamp per binary records the version it was built from, so a repeat run is a no-op.
# COCOON_CRI_TOOLS_CACHE: where built tools are kept across checkouts (~/.cache/cocoon-cri/tools).
set -euo pipefail
cd "$(dirname "$0")/.."
bin="$PWD/bin"
mkdir -p "$bin"

# pinned MODULE_DIR MODULE prints the version of MODULE that MODULE_DIR's go.mod pins.
pinned() {
  local v
  v=$(cd "$1" && go list -m -f '{{.Version}}' "$2")
  [ -n "$v" ] || { echo "build-tools: $2 is not pinned in $1/go.mod" >&2; exit 1; }
  echo "$v"
}

# Built tools are kept per build (name, version, Go, the module's go.sum and the flags) in a cache
# outside the checkout, so a fresh clone links them instead of building them again.
cache=${COCOON_CRI_TOOLS_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/cocoon-cri/tools}
mkdir -p "$cache"

# build NAME VERSION MODULE_DIR PACKAGE GO_ARGS... runs `go GO_ARGS -trimpath -o bin/NAME PACKAGE`
# in MODULE_DIR unless bin/NAME was already built from VERSION, or the cache has that build.
build() {
  local name=$1 version=$2 dir=$3 pkg=$4
  shift 4
  if [ -x "$bin/$name" ] && [ "$(cat "$bin/.$name.version" 2>/dev/null)" = "$version" ]; then
    return
  fi
  local key
  key=$( (echo "$name $version $pkg $*"; go env GOVERSION; cat "$dir/go.sum") | sha256sum | cut -c1-16)
  local cached="$cache/$name-$version-$key"
  if [ ! -x "$cached" ]; then
    echo "build-tools: building $name $version"
    (cd "$dir" && go "$@" -trimpath -o "$cached.tmp" "$pkg")
    mv -f "$cached.tmp" "$cached"
  fi
  ln -f "$cached" "$bin/$name" 2>/dev/null || cp -f "$cached" "$bin/$name"
  echo "$version" > "$bin/.$name.version"
}

# build_coredns builds the cluster DNS, about 3 minutes on a cold build cache (client-go is most of
# it). The main package is ours, not CoreDNS's, so the version carries a hash of it: a plugin added
# there rebuilds the binary. No VCS stamp: the package sits in this repository, whose state must
# not change the build.
build_coredns() {
  local v
  v=$(pinned test/tools/coredns github.com/coredns/coredns)
  v="$v+$(sha256sum test/tools/coredns/main.go | cut -c1-12)"
  build coredns "$v" test/tools/coredns . build -buildvcs=false -ldflags "-s -w"
}

tools=("$@")
[ ${#tools[@]} -gt 0 ] || tools=(crictl critest kubelet containerd control-plane)
for tool in "${tools[@]}"; do
  case $tool in
    crictl|critest)
      v=$(pinned test/tools sigs.k8s.io/cri-tools)
      v=${v#v}
      ld="-X sigs.k8s.io/cri-tools/pkg/version.Version=$v"
      if [ "$tool" = crictl ]; then
        build crictl "$v" test/tools sigs.k8s.io/cri-tools/cmd/crictl build -ldflags "$ld"
      else
        build critest "$v" test/tools sigs.k8s.io/cri-tools/cmd/critest test -c -ldflags "$ld"
      fi
      ;;
    kubelet|control-plane)
      # The kubelet takes about 10 minutes on a cold build cache; the control plane and kubectl,
      # which share most of its packages, about 8 more.
      v=$(pinned test/tools/kubelet k8s.io/kubernetes)
      minor=${v#v1.}
      minor=${minor%%.*}
      ld="-s -w -X k8s.io/component-base/version.gitVersion=$v -X k8s.io/component-base/version.gitMajor=1 -X k8s.io/component-base/version.gitMinor=$minor"
      if [ "$tool" = kubelet ]; then
        build kubelet "$v" test/tools/kubelet k8s.io/kubernetes/cmd/kubelet build -ldflags "$ld"
      else
        for cmd in kube-apiserver kube-controller-manager kube-scheduler kube-proxy kubectl; do
          build "$cmd" "$v" test/tools/kubelet "k8s.io/kubernetes/cmd/$cmd" build -ldflags "$ld"
        done
        v=$(pinned test/tools/etcd go.etcd.io/etcd/server/v3)
        build etcd "$v" test/tools/etcd go.etcd.io/etcd/server/v3 build -ldflags "-s -w"
        build_coredns
      fi
      ;;
    coredns)
      build_coredns
      ;;
    containerd)
      # About 3 minutes on a cold build cache. The shim must sit beside containerd: the tests put
      # bin/ first on containerd's PATH.
      v=$(pinned test/tools/containerd github.com/containerd/containerd/v2)
      ld="-s -w -X github.com/containerd/containerd/v2/version.Version=$v"
      for cmd in containerd containerd-shim-runc-v2 ctr; do
        build "$cmd" "$v" test/tools/containerd "github.com/containerd/containerd/v2/cmd/$cmd" build -tags no_btrfs -ldflags "$ld"
      done
      ;;
    *)
      echo "build-tools: unknown tool $tool (crictl, critest, kubelet, containerd, control-plane, coredns)" >&2
      exit 1
      ;;
  esac
done
