package cocoonsim

import (
	"context"
	"crypto/rand"
	"fmt"
	"time"

	"github.com/spf13/cobra"

	"github.com/cocoonstack/cocoon-cri/pkg/cocoon"
	"github.com/cocoonstack/cocoon-cri/test/cocoonsim/guest"
)

// cocoon v0.5's `vm reseed` (cmd/vm/reseed.go): fresh entropy for the guest's CRNG, and with
// --machine-id a new /etc/machine-id, through cocoon-agent. A clone runs it by itself, best effort.
const (
	reseedEntropyBytes   = 32
	reseedAttempts       = 3
	reseedRetryDelay     = 2 * time.Second
	reseedAttemptTimeout = 4 * time.Second
)

func (a *app) reseedCommand() *cobra.Command {
	cmd := &cobra.Command{
		Use:   "reseed VM",
		Short: "Force a CRNG reseed inside the guest (fresh entropy over vsock)",
		Args:  cobra.ExactArgs(1),
		RunE:  a.vmReseed,
	}
	cmd.Flags().Bool("machine-id", false, "also regenerate /etc/machine-id (use after clone, not restore)")
	return cmd
}

func (a *app) vmReseed(cmd *cobra.Command, args []string) error {
	machineID, _ := cmd.Flags().GetBool("machine-id")
	vm, err := a.resolveRunningVM(cmd, "reseed", args[0])
	if err != nil {
		return err
	}
	return reseedVM(cmd.Context(), vm, machineID)
}

// reseedVM retries only a failed dial (the agent listens again shortly after a resume); an
// agent's answer is final.
func reseedVM(ctx context.Context, vm *cocoon.VM, machineID bool) error {
	vsock := vsockSocket(vm)
	if vsock == "" {
		return fmt.Errorf("reseed: %w (recreate the VM to enable agent reseed)", errVsockNotConfigured)
	}
	entropy := make([]byte, reseedEntropyBytes)
	if _, err := rand.Read(entropy); err != nil {
		return fmt.Errorf("reseed: generate entropy: %w", err)
	}
	var dialErr error
	for attempt := 1; attempt <= reseedAttempts; attempt++ {
		attemptCtx, cancel := context.WithTimeout(ctx, reseedAttemptTimeout)
		conn, err := dialHybridVsock(attemptCtx, vsock, guest.AgentPort)
		if err != nil {
			cancel()
			dialErr = err
			if attempt < reseedAttempts {
				select {
				case <-ctx.Done():
					return ctx.Err()
				case <-time.After(reseedRetryDelay):
				}
			}
			continue
		}
		err = guest.Reseed(attemptCtx, conn, entropy, machineID)
		_ = conn.Close()
		cancel()
		if err != nil {
			return fmt.Errorf("reseed: %w", err)
		}
		return nil
	}
	return fmt.Errorf("reseed: dial agent: %w", dialErr)
}

// reseedAfterClone is v0.5's clone epilogue: a clone gets its own machine-id if its agent
// answers; a failure is a warning and the clone stands. The clone's in-process record lacks its
// sockets, so the record is read again first.
func (a *app) reseedAfterClone(ctx context.Context, b *backend, vm *cocoon.VM) {
	if !a.profile.Agent || vm.Config.Windows {
		return
	}
	logger := a.log.with("cmd.vm.reseed")
	if stored, err := b.inspect(ctx, vm.ID); err == nil {
		vm = stored
	}
	if vsockSocket(vm) == "" {
		logger.Warnf("skip reseed for %s: no vsock; this clone keeps the snapshot's CRNG state — recreate the VM to enable the agent", vm.ID)
		return
	}
	if err := reseedVM(ctx, vm, true); err != nil {
		logger.Warnf("reseed signal failed (agent >= v0.1.6 required): %v; run 'cocoon vm reseed %s' after fixing", err, vm.ID)
	}
}
