package vmruntime

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/cocoonstack/cocoon-cri/pkg/cocoon"
	"github.com/cocoonstack/cocoon-cri/pkg/store"
)

// OrphanPolicy is what the startup reconcile does with a VM that carries cocoon-cri's naming but
// that no record claims (a state database lost or restored from a backup, a VM made by hand).
type OrphanPolicy string

const (
	// OrphanAlert logs each orphan as a warning and counts it in the metrics; nothing is removed.
	OrphanAlert OrphanPolicy = "alert"
	// OrphanDestroy removes orphans (vm rm --force).
	OrphanDestroy OrphanPolicy = "destroy"
	// OrphanKeep leaves orphans alone and only mentions them at debug level.
	OrphanKeep OrphanPolicy = "keep"
)

// ParseOrphanPolicy checks a policy name.
func ParseOrphanPolicy(s string) (OrphanPolicy, error) {
	switch p := OrphanPolicy(s); p {
	case OrphanAlert, OrphanDestroy, OrphanKeep:
		return p, nil
	}
	return "", fmt.Errorf("orphan policy %q: want alert, destroy or keep", s)
}

// Recover brings the records in line with the node after a restart, before the CRI is served: a
// RunPodSandbox that a crash interrupted is rolled back; running containers are checked against
// cocoon's records (adopted when their VM runs, recorded exited when it died meanwhile) and their
// streams picked up; orphan VMs meet the orphan policy; network leftovers of sandboxes that have
// no record are removed. Nothing here fails the start: a roll-back that fails (a broken CNI DEL)
// keeps its record, which holds the pod's name, and is retried in the background while the CRI is
// served; the rest is retried by the periodic sweep or the next start.
func (s *Runtime) Recover(ctx context.Context) error {
	for _, sb := range s.store.Sandboxes.List(func(sb *store.Sandbox) bool { return sb.State == store.SandboxCreating }) {
		s.log.Info("rolling back an interrupted RunPodSandbox", "sandbox", sb.ID, "name", sb.Name)
		if err := s.rollbackSandbox(ctx, sb); err != nil {
			s.log.Error("rolling back an interrupted RunPodSandbox failed; retrying in the background (the pod's name stays taken until then)",
				"sandbox", sb.ID, "name", sb.Name, "err", err)
			go s.retryRollback(ctx, sb.ID)
		}
	}
	vms, err := s.cocoon.VMList(ctx)
	if err != nil {
		s.log.Warn("cannot list cocoon's VMs: running containers are checked by the periodic sweep", "err", err)
	} else {
		s.recoverHibernations(ctx, vms)
		s.recoverPools(ctx, vms)
		s.watcher.checkRunning(ctx, vms)
		s.handleOrphans(ctx, vms)
	}
	for _, c := range s.store.Containers.List(func(c *store.Container) bool { return c.State == store.ContainerRunning }) {
		s.resumeIO(ctx, c)
	}
	s.removeCutShortCheckpoints(ctx)
	s.removeForkLeftovers(ctx)
	known := map[string]bool{}
	for _, sb := range s.store.Sandboxes.List(nil) {
		known[sb.ID] = true
	}
	for _, id := range s.poolNetworks() {
		known[id] = true
	}
	removed, err := s.net.RemoveLeftovers(ctx, known)
	for _, what := range removed {
		s.log.Info("removed a network leftover of a sandbox with no record", "what", what)
	}
	if err != nil {
		s.log.Warn("removing network leftovers failed; the next start retries", "err", err)
	}
	return ctx.Err()
}

// Roll-back retries back off from rollbackRetryFirst to rollbackRetryMax.
const (
	rollbackRetryFirst = time.Second
	rollbackRetryMax   = 30 * time.Second
)

// retryRollback rolls back a sandbox left creating until it works or ctx ends.
func (s *Runtime) retryRollback(ctx context.Context, id string) {
	wait := rollbackRetryFirst
	for {
		select {
		case <-ctx.Done():
			return
		case <-time.After(wait):
		}
		if done := s.rollbackOnce(ctx, id); done {
			return
		}
		wait = min(2*wait, rollbackRetryMax)
	}
}

// rollbackOnce is one try, under the sandbox's lock; it reports whether nothing is left to do.
func (s *Runtime) rollbackOnce(ctx context.Context, id string) bool {
	unlock := s.locks.Lock(id)
	defer unlock()
	sb, err := s.store.Sandboxes.Get(id)
	if err != nil || sb.State != store.SandboxCreating {
		return true
	}
	if err := s.rollbackSandbox(ctx, sb); err != nil {
		s.log.Warn("rolling back an interrupted RunPodSandbox failed again", "sandbox", id, "err", err)
		return false
	}
	s.log.Info("rolled back an interrupted RunPodSandbox", "sandbox", id, "name", sb.Name)
	return true
}

// handleOrphans applies the orphan policy to VMs named like cocoon-cri's that no container record
// claims, by ID or by name (a start that a crash cut short has the name but no ID).
func (s *Runtime) handleOrphans(ctx context.Context, vms []cocoon.VM) {
	claimed := map[string]bool{}
	for _, c := range s.store.Containers.List(nil) {
		claimed[c.VM.ID], claimed[c.VM.Name] = true, true
	}
	for _, pv := range s.store.PoolVMs.List(nil) {
		claimed[pv.Name] = true
	}
	var orphans []cocoon.VM
	for _, vm := range vms {
		if strings.HasPrefix(vm.Config.Name, VMNamePrefix) && !claimed[vm.ID] && !claimed[vm.Config.Name] {
			orphans = append(orphans, vm)
		}
	}
	left := len(orphans)
	for _, vm := range orphans {
		log := s.log.With("vm", vm.Config.Name, "vmID", vm.ID, "state", vm.State, "policy", s.cfg.OrphanPolicy)
		switch s.cfg.OrphanPolicy {
		case OrphanDestroy:
			if err := s.cocoon.VMRemove(ctx, vm.ID, true); err != nil && !errors.Is(err, cocoon.ErrNotFound) {
				log.Error("removing an orphan VM failed", "err", err)
				continue
			}
			left--
			log.Warn("removed an orphan VM: it has cocoon-cri's naming but no record")
		case OrphanKeep:
			log.Debug("orphan VM kept: it has cocoon-cri's naming but no record")
		default:
			log.Warn("orphan VM: it has cocoon-cri's naming but no record; remove it with cocoon vm rm, or start cocoon-cri with --orphan-policy destroy")
		}
	}
	if s.cfg.Metrics != nil {
		s.cfg.Metrics.Orphans(left)
	}
}

// resumeIO picks up a running container's streams after a restart: the console (and with it the
// log) is the VM's and goes on, and so does a command launched detached, which is followed again.
// A command that ran in a session of the old cocoon-cri ended with it, and its exit status is
// lost: the container exits, and its VM stops, so the kubelet restarts it the usual way.
func (s *Runtime) resumeIO(ctx context.Context, c *store.Container) {
	sb, err := s.store.Sandboxes.Get(c.SandboxID)
	if err != nil {
		return
	}
	if len(mainCommand(c.Config.Msg)) == 0 || c.MainDetached {
		s.startIO(sb, c)
		return
	}
	unlock := s.locks.Lock(sb.ID)
	defer unlock()
	if err := s.powerOff(ctx, sb, c, mainExitStopTimeout); err != nil && !errors.Is(err, cocoon.ErrNotFound) {
		s.log.Error("stopping the VM of a command lost in a restart failed", "container", c.ID, "err", err)
	}
	if err := s.recordExit(c, exitStatus{code: killedExitCode, reason: reasonMainProcessLost,
		message: "cocoon-cri restarted while the command ran; its exit status is unknown"}); err != nil {
		s.log.Error("recording a lost command failed", "container", c.ID, "err", err)
	}
}

// reasonMainProcessLost: the container's command was cut off by a restart of cocoon-cri, or was
// gone from its guest when followed again.
const reasonMainProcessLost = "MainProcessLost"
