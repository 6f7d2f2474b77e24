package cocoonsim

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"path/filepath"
	"strings"
	"sync"
	"time"

	"github.com/cocoonstack/cocoon-cri/pkg/cocoon"
	"github.com/cocoonstack/cocoon-cri/test/cocoonsim/guest"
)

// Runtime file names inside a VM's run directory.
const (
	apiSocketName   = "api.sock"
	consoleSockName = "console.sock"
	cmdlineFileName = "cmdline"
)

// backendKind is what differs between cocoon's two hypervisor backends on disk.
type backendKind struct {
	typ     string // JSON "hypervisor" value
	dir     string // directory under root/run/log dirs (no hyphen)
	pidFile string
	logFile string
}

var (
	kindCH = backendKind{typ: cocoon.HypervisorCloudHypervisor, dir: "cloudhypervisor", pidFile: "ch.pid", logFile: "cloud-hypervisor.log"}
	kindFC = backendKind{typ: cocoon.HypervisorFirecracker, dir: "firecracker", pidFile: "fc.pid", logFile: "firecracker.log"}
)

// tapQueues is the virtio-net queue count of the backend's TAPs: Firecracker opens a TAP
// single-queue (one TX+RX pair), cloud-hypervisor one pair per vCPU (0: derived from the vCPUs).
func (k backendKind) tapQueues() int {
	if k == kindFC {
		return 2
	}
	return 0
}

// backend is one hypervisor backend's index and directories.
type backend struct {
	kind backendKind
	conf *Config
	log  *logger
	db   jsonDB[vmIndex]
}

// newBackend opens a backend and, like cocoon, creates its db, run and log directories.
func newBackend(conf *Config, log *logger, kind backendKind) (*backend, error) {
	b := &backend{kind: kind, conf: conf, log: log}
	dbDir := filepath.Join(conf.RootDir, kind.dir, "db")
	b.db = jsonDB[vmIndex]{path: filepath.Join(dbDir, "vms.json"), lockPath: filepath.Join(dbDir, "vms.lock")}
	if err := ensureDirs(dbDir, b.runDir(), b.logDir()); err != nil {
		return nil, fmt.Errorf("init %s: ensure dirs: %w", kind.typ, err)
	}
	return b, nil
}

// allBackends opens both backends, in cocoon's order (cloud-hypervisor, then firecracker).
func allBackends(conf *Config, log *logger) ([]*backend, error) {
	var out []*backend
	for _, kind := range []backendKind{kindCH, kindFC} {
		b, err := newBackend(conf, log, kind)
		if err != nil {
			return nil, err
		}
		out = append(out, b)
	}
	return out, nil
}

func (b *backend) runDir() string { return filepath.Join(b.conf.RunDir, b.kind.dir) }
func (b *backend) logDir() string { return filepath.Join(b.conf.LogDir, b.kind.dir) }

func (b *backend) vmRunDir(id string) string { return filepath.Join(b.runDir(), id) }
func (b *backend) vmLogDir(id string) string { return filepath.Join(b.logDir(), id) }

func (b *backend) pidFilePath(runDir string) string { return filepath.Join(runDir, b.kind.pidFile) }

func (b *backend) binaryName() string {
	if b.kind == kindFC {
		return filepath.Base(b.conf.FCBinary)
	}
	return filepath.Base(b.conf.CHBinary)
}

func (b *backend) terminateGrace() time.Duration {
	return time.Duration(b.conf.terminateGraceSeconds()) * time.Second
}

func apiSocketPath(runDir string) string   { return filepath.Join(runDir, apiSocketName) }
func consoleSockPath(runDir string) string { return filepath.Join(runDir, consoleSockName) }

// runtimeFiles are removed before a start and after a stop.
func (b *backend) runtimeFiles() []string {
	if b.kind == kindFC {
		return []string{apiSocketName, b.kind.pidFile, consoleSockName, guest.VsockSocketName}
	}
	return []string{apiSocketName, b.kind.pidFile, consoleSockName, cmdlineFileName}
}

// withRunningVM calls fn with the hypervisor PID if the record's pid file still names a live
// hypervisor process for this VM; otherwise it returns errVMNotRunning.
func (b *backend) withRunningVM(ctx context.Context, rec *vmRecord, fn func(pid int) error) error {
	pid, err := readPIDFile(b.pidFilePath(rec.RunDir))
	if err != nil && !errors.Is(err, fs.ErrNotExist) {
		b.log.with(b.kind.typ+".WithRunningVM").Warnf("read PID file: %v", err)
	}
	if !verifyProcessCmdline(pid, b.binaryName(), apiSocketPath(rec.RunDir)) {
		return errVMNotRunning
	}
	return fn(pid)
}

// forEachVM runs fn for every ID concurrently (bounded by pool_size), best effort, and returns
// the IDs that succeeded in input order plus the joined failures, as cocoon's ForEachVM.
func (b *backend) forEachVM(ctx context.Context, ids []string, op string, fn func(context.Context, string) error) ([]string, error) {
	errs := make([]error, len(ids))
	sem := make(chan struct{}, max(b.conf.PoolSize, 1))
	var wg sync.WaitGroup
	for i, id := range ids {
		wg.Go(func() {
			sem <- struct{}{}
			defer func() { <-sem }()
			errs[i] = fn(ctx, id)
		})
	}
	wg.Wait()
	var succeeded []string
	var failed []error
	logger := b.log.with(b.kind.typ + "." + op)
	for i, id := range ids {
		if errs[i] != nil {
			err := fmt.Errorf("item %s: %w", id, errs[i])
			logger.Warnf("%s: %v", op, err)
			failed = append(failed, err)
			continue
		}
		succeeded = append(succeeded, id)
	}
	return succeeded, errors.Join(failed...)
}

// resolveVMOwner finds the one backend that knows ref.
func resolveVMOwner(ctx context.Context, backends []*backend, ref string) (*backend, error) {
	var matches []*backend
	for _, b := range backends {
		_, err := b.inspect(ctx, ref)
		switch {
		case err == nil:
			matches = append(matches, b)
		case errors.Is(err, errVMNotFound):
		default:
			return nil, fmt.Errorf("inspect %s in %s: %w", ref, b.kind.typ, err)
		}
	}
	switch len(matches) {
	case 0:
		return nil, fmt.Errorf("vm %s: %w", ref, errVMNotFound)
	case 1:
		return matches[0], nil
	default:
		names := make([]string, len(matches))
		for i, b := range matches {
			names[i] = b.kind.typ
		}
		return nil, fmt.Errorf("vm %s: %w (backends: %s)", ref, errVMAmbiguous, strings.Join(names, ", "))
	}
}

// routeRefs groups refs by owning backend, failing on the first unknown ref.
func routeRefs(ctx context.Context, backends []*backend, refs []string) ([]*backend, map[*backend][]string, error) {
	routed := map[*backend][]string{}
	var order []*backend
	for _, ref := range refs {
		owner, err := resolveVMOwner(ctx, backends, ref)
		if err != nil {
			return nil, nil, err
		}
		if _, seen := routed[owner]; !seen {
			order = append(order, owner)
		}
		routed[owner] = append(routed[owner], ref)
	}
	return order, routed, nil
}

// reconcileState is cocoon's ReconcileState: a running record whose PID is gone is shown as
// "stopped (stale)".
func reconcileState(vm *cocoon.VM) cocoon.VMState {
	if vm.State == cocoon.VMStateRunning && !isProcessAlive(vm.PID) {
		return cocoon.VMStateStale
	}
	return vm.State
}
