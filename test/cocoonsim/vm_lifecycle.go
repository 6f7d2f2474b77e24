package cocoonsim

import (
	"context"
	"errors"
	"fmt"
	"os"
	"time"

	"github.com/spf13/cobra"

	"github.com/cocoonstack/cocoon-cri/pkg/cocoon"
)

// gracefulStopPoll is how often a graceful stop checks whether the guest has powered off.
const gracefulStopPoll = 500 * time.Millisecond

func (a *app) vmStart(cmd *cobra.Command, args []string) error {
	backends, err := allBackends(a.conf, a.log)
	if err != nil {
		return err
	}
	order, routed, err := routeRefs(cmd.Context(), backends, args)
	if err != nil {
		return err
	}
	for _, b := range order {
		a.recoverNetworks(cmd.Context(), b, routed[b])
	}
	return a.batchRouted(cmd, "start", "started", order, routed, func(b *backend, refs []string) ([]string, error) {
		return b.start(cmd.Context(), refs)
	})
}

func (a *app) vmStop(cmd *cobra.Command, args []string) error {
	force, _ := cmd.Flags().GetBool("force")
	timeout, _ := cmd.Flags().GetInt("timeout")
	if force {
		a.conf.StopTimeoutSeconds = stopTimeoutForce
	} else if timeout > 0 {
		a.conf.StopTimeoutSeconds = timeout
	}
	backends, err := allBackends(a.conf, a.log)
	if err != nil {
		return err
	}
	order, routed, err := routeRefs(cmd.Context(), backends, args)
	if err != nil {
		return err
	}
	return a.batchRouted(cmd, "stop", "stopped", order, routed, func(b *backend, refs []string) ([]string, error) {
		return b.stop(cmd.Context(), refs)
	})
}

// batchRouted runs a start/stop per backend and prints {"succeeded":[...]} with -o json, but
// only when every ref succeeded (cocoon's batchRoutedCmd).
func (a *app) batchRouted(cmd *cobra.Command, name, pastTense string, order []*backend, routed map[*backend][]string, fn func(*backend, []string) ([]string, error)) error {
	logger := a.log.with("cmd." + name)
	jsonOut := wantJSON(cmd)
	var done []string
	var lastErr error
	for _, b := range order {
		ids, err := fn(b, routed[b])
		if !jsonOut {
			for _, id := range ids {
				logger.Infof("%s: %s", pastTense, id)
			}
		}
		done = append(done, ids...)
		if err != nil {
			lastErr = err
		}
	}
	if lastErr != nil {
		return fmt.Errorf("%s: %w", name, lastErr)
	}
	if jsonOut {
		return outputJSON(cmd.OutOrStdout(), cocoon.BatchResult{Succeeded: done})
	}
	if len(done) == 0 {
		logger.Infof("no VMs %s", pastTense)
	}
	return nil
}

func (a *app) vmRM(cmd *cobra.Command, args []string) error {
	logger := a.log.with("cmd.vm.rm")
	force, _ := cmd.Flags().GetBool("force")
	backends, err := allBackends(a.conf, a.log)
	if err != nil {
		return err
	}
	order, routed, err := routeRefs(cmd.Context(), backends, args)
	if err != nil {
		return err
	}
	jsonOut := wantJSON(cmd)
	var deleted []string
	var lastErr error
	for _, b := range order {
		ids, err := b.delete(cmd.Context(), routed[b], force)
		if !jsonOut {
			for _, id := range ids {
				logger.Infof("deleted VM: %s", id)
			}
		}
		deleted = append(deleted, ids...)
		if err != nil {
			lastErr = err
		}
	}
	if len(deleted) > 0 {
		if err := a.releaseNetworks(cmd.Context(), deleted); err != nil {
			return err
		}
	}
	if lastErr != nil {
		return fmt.Errorf("rm: %w", lastErr)
	}
	if jsonOut {
		return outputJSON(cmd.OutOrStdout(), cocoon.BatchResult{Succeeded: deleted})
	}
	if len(deleted) == 0 {
		logger.Infof("no VMs deleted")
	}
	return nil
}

// start launches a hypervisor for each ref; VMs already running count as started.
func (b *backend) start(ctx context.Context, refs []string) ([]string, error) {
	ids, err := b.resolveRefs(ctx, refs)
	if err != nil {
		return nil, err
	}
	started, err := b.forEachVM(ctx, ids, "Start", b.startOne)
	if markErr := b.batchMarkStarted(ctx, started); markErr != nil {
		b.log.with("cloudhypervisor.Start").Warnf("batch state update: %v", markErr)
	}
	return started, err
}

func (b *backend) startOne(ctx context.Context, id string) error {
	rec, err := b.loadRecord(ctx, id)
	if err != nil {
		return err
	}
	switch runErr := b.withRunningVM(ctx, &rec, func(int) error { return nil }); {
	case runErr == nil:
		return nil // already running
	case !errors.Is(runErr, errVMNotRunning):
		return fmt.Errorf("reconcile running VM %s: %w", id, runErr)
	}
	if err := ensureDirs(rec.RunDir, rec.LogDir); err != nil {
		return fmt.Errorf("ensure dirs: %w", err)
	}
	b.cleanupRuntimeFiles(rec.RunDir)
	if err := validateStorageConfigs(rec.StorageConfigs); err != nil {
		b.markError(ctx, id)
		return fmt.Errorf("storage invariants violated: %w", err)
	}
	if b.kind == kindFC {
		if err := b.fcStart(ctx, &rec); err != nil {
			b.markError(ctx, id)
			return fmt.Errorf("launch VM: %w", err)
		}
		return nil
	}
	args := b.buildVMConfig(&rec).Args(apiSocketPath(rec.RunDir))
	b.saveCmdline(rec.RunDir, args)
	if _, err := b.launch(ctx, &rec, args); err != nil {
		b.markError(ctx, id)
		return fmt.Errorf("launch VM: %w", err)
	}
	return nil
}

// stop shuts each VM down and marks the ones that stopped (or were not running) stopped.
func (b *backend) stop(ctx context.Context, refs []string) ([]string, error) {
	ids, err := b.resolveRefs(ctx, refs)
	if err != nil {
		return nil, err
	}
	stopped, err := b.forEachVM(ctx, ids, "Stop", b.stopOne)
	if markErr := b.updateStates(ctx, stopped, cocoon.VMStateStopped); markErr != nil {
		b.log.with("cloudhypervisor.Stop").Warnf("batch state update: %v", markErr)
	}
	return stopped, err
}

// stopOne: --force and cloud-hypervisor's direct-boot VMs get vm.shutdown (cloud-hypervisor
// only) then SIGTERM/SIGKILL; UEFI VMs get the ACPI power button, Firecracker VMs Ctrl-Alt-Del,
// and up to stop_timeout_seconds to power off before that.
func (b *backend) stopOne(ctx context.Context, id string) error {
	rec, err := b.loadRecord(ctx, id)
	if err != nil {
		return err
	}
	sock := apiSocketPath(rec.RunDir)
	timeout := time.Duration(b.conf.StopTimeoutSeconds) * time.Second
	stopErr := b.withRunningVM(ctx, &rec, func(pid int) error {
		terminate := func() error { return terminateProcess(ctx, pid, b.binaryName(), sock, b.terminateGrace()) }
		var ask func(context.Context) error
		if b.kind == kindFC {
			ask = fcCtrlAltDel(newFCClient(sock))
		} else {
			hc := newCHClient(sock)
			terminate = func() error { return b.forceTerminate(ctx, hc, id, sock, pid) }
			ask = hc.powerButton
			if rec.BootConfig.directBoot() {
				ask = nil
			}
		}
		if ask == nil || timeout < 0 {
			return terminate()
		}
		return b.gracefulStop(ctx, ask, terminate, id, pid, timeout)
	})
	if stopErr != nil && !errors.Is(stopErr, errVMNotRunning) {
		b.markError(ctx, id)
		return stopErr
	}
	b.cleanupRuntimeFiles(rec.RunDir)
	return nil
}

// gracefulStop asks the guest to power off and gives it timeout before terminate.
func (b *backend) gracefulStop(ctx context.Context, ask func(context.Context) error, terminate func() error, id string, pid int, timeout time.Duration) error {
	logger := b.log.with(b.kind.typ + ".GracefulStop")
	if err := ask(ctx); err != nil {
		logger.Warnf("shutdown signal %s: %v — escalating", id, err)
		return terminate()
	}
	if waitFor(ctx, timeout, gracefulStopPoll, func() (bool, error) { return !isProcessAlive(pid), nil }) == nil {
		return nil
	}
	if ctx.Err() != nil {
		return ctx.Err()
	}
	logger.Warnf("VM %s did not shut down within %s, escalating", id, timeout)
	return terminate()
}

func (b *backend) forceTerminate(ctx context.Context, hc *chClient, id, sock string, pid int) error {
	if err := hc.shutdown(ctx); err != nil {
		b.log.with("cloudhypervisor.forceTerminate").Warnf("vm.shutdown %s: %v", id, err)
	}
	return terminateProcess(ctx, pid, b.binaryName(), sock, b.terminateGrace())
}

// delete removes VMs: a running VM needs force (and is then stopped first); run and log dirs go
// before the record, so a failed cleanup can be retried.
func (b *backend) delete(ctx context.Context, refs []string, force bool) ([]string, error) {
	ids, err := b.resolveRefs(ctx, refs)
	if err != nil {
		return nil, err
	}
	return b.forEachVM(ctx, ids, "Delete", func(ctx context.Context, id string) error {
		rec, err := b.loadRecord(ctx, id)
		if err != nil {
			return err
		}
		if err := b.withRunningVM(ctx, &rec, func(int) error {
			if !force {
				return fmt.Errorf("running (force required)")
			}
			return b.stopOne(ctx, id)
		}); err != nil && !errors.Is(err, errVMNotRunning) {
			return fmt.Errorf("stop before delete: %w", err)
		}
		if err := errors.Join(os.RemoveAll(rec.RunDir), os.RemoveAll(rec.LogDir)); err != nil {
			return fmt.Errorf("cleanup VM dirs: %w", err)
		}
		return b.deleteRecord(ctx, id)
	})
}
