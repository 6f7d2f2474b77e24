package vmruntime

import (
	"context"
	"errors"
	"fmt"
	"net"
	"strings"
	"sync"
	"time"

	"github.com/cocoonstack/cocoon-cri/pkg/cocoon"
	"github.com/cocoonstack/cocoon-cri/pkg/store"
	"github.com/cocoonstack/cocoon-cri/pkg/vmstats"
	"github.com/cocoonstack/cocoon-cri/tapmanager"
)

// Hibernation (docs/hibernation.md): a running container's VM that has been idle for its pod's
// hibernate-after period is saved whole by cocoon (vm hibernate) and its hypervisor ends; the
// container stays RUNNING. Its first use wakes it (vm restore): an exec, ExecSync, attach or
// port-forward waits for the wake, and a packet to the pod, seen on the pod interface in the VM's
// namespace, starts one.

const (
	// hibernationSnapshotPrefix names the snapshots hibernations keep.
	hibernationSnapshotPrefix = "cri-hib-"
	// idleTick is how often the use of the VMs that may hibernate is looked at.
	idleTick = time.Second
	// idleCPUShare is the CPU below which a guest counts as idle: 5% of one vCPU.
	idleCPUShare = 0.05
	// hibernateRetryMin and hibernateRetryMax pace the retries of a hibernation that failed.
	hibernateRetryMin = time.Minute
	hibernateRetryMax = 30 * time.Minute
	// wakeTimeout bounds a wake that nobody waits for (one a packet started).
	wakeTimeout = 2 * time.Minute
)

// idleTracker is what is known in memory about the use of each running container whose pod may
// hibernate. Its lock is never held across a cocoon call or a sandbox lock.
type idleTracker struct {
	mu sync.Mutex
	by map[string]*idleState // by container ID
}

// idleState is one container's use.
type idleState struct {
	// inUse counts the streams and ExecSyncs in flight; lastUse is when the last one ended.
	inUse   int
	lastUse time.Time
	// lastActive is when the VM was last seen in use; the idle period counts from it.
	lastActive time.Time
	// cpuNanos is the hypervisor's CPU time at the last look, of the process started at cpuStart.
	cpuNanos, cpuStart uint64
	cpuAt              time.Time
	// traffic watches the pod interface while the VM holds it (in the VM's namespace).
	traffic tapmanager.Traffic
	// busy: a hibernation or wake is under way. cancelWait ends the wait for a packet.
	busy       bool
	cancelWait context.CancelFunc
	// refused says why this VM cannot hibernate, once found; it is never tried again.
	refused string
	// failures counts the hibernations that failed in a row, and retryAt says when to try again.
	failures int
	retryAt  time.Time
	lastErr  string
}

func (t *idleTracker) get(id string, now time.Time) *idleState {
	if t.by == nil {
		t.by = map[string]*idleState{}
	}
	st := t.by[id]
	if st == nil {
		st = &idleState{lastActive: now}
		t.by[id] = st
	}
	return st
}

// drop forgets a container, closing its watch and ending its wait.
func (t *idleTracker) drop(id string) {
	t.mu.Lock()
	st := t.by[id]
	delete(t.by, id)
	t.mu.Unlock()
	if st != nil {
		st.closeWatch()
	}
}

// dropAll forgets every container.
func (t *idleTracker) dropAll() {
	t.mu.Lock()
	all := t.by
	t.by = nil
	t.mu.Unlock()
	for _, st := range all {
		st.closeWatch()
	}
}

func (st *idleState) closeWatch() {
	if st.cancelWait != nil {
		st.cancelWait()
		st.cancelWait = nil
	}
	if st.traffic != nil {
		st.traffic.Close() //nolint:errcheck
		st.traffic = nil
	}
}

// RunHibernation looks at the use of the VMs that may hibernate every idleTick until ctx ends,
// hibernates those idle for their pod's period, and waits for the traffic that wakes the
// hibernated ones.
func (s *Runtime) RunHibernation(ctx context.Context) {
	t := time.NewTicker(idleTick)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
			for _, id := range s.lookAtIdleVMs(ctx) {
				go s.hibernateIdle(ctx, id)
			}
		}
	}
}

// lookAtIdleVMs is one look at every running container whose pod may hibernate. It returns the
// containers idle for their pod's period, for hibernateIdle.
func (s *Runtime) lookAtIdleVMs(ctx context.Context) (idle []string) {
	now := s.nowFunc()
	watched := map[string]bool{}
	for _, c := range s.store.Containers.List(func(c *store.Container) bool { return c.State == store.ContainerRunning }) {
		sb, err := s.store.Sandboxes.Get(c.SandboxID)
		// An operator may hibernate a pod without a period (cocoon-cri pod hibernate).
		if err != nil || sb.VM.HibernateAfter <= 0 && !c.VM.Hibernated() {
			continue
		}
		watched[c.ID] = true
		if c.VM.Hibernated() {
			s.awaitTraffic(ctx, sb, c)
			continue
		}
		if s.idleFor(sb, c, now) >= sb.VM.HibernateAfter {
			idle = append(idle, c.ID)
		}
	}
	s.idle.mu.Lock()
	var gone []string
	for id := range s.idle.by {
		if !watched[id] {
			gone = append(gone, id)
		}
	}
	s.idle.mu.Unlock()
	for _, id := range gone {
		s.idle.drop(id)
	}
	return idle
}

// idleFor updates what is known of an awake VM's use and says how long it has been idle; 0 when it
// is in use, cannot hibernate, or waits for a retry.
func (s *Runtime) idleFor(sb *store.Sandbox, c *store.Container, now time.Time) time.Duration {
	s.idle.mu.Lock()
	st := s.idle.get(c.ID, now)
	if st.refused != "" || st.busy || now.Before(st.retryAt) {
		s.idle.mu.Unlock()
		return 0
	}
	needsWatch := st.traffic == nil
	s.idle.mu.Unlock()

	// Read outside the tracker's lock: a socket and /proc files.
	var watch tapmanager.Traffic
	if needsWatch {
		watch = s.openTrafficWatch(sb, c)
	}
	proc, procErr := vmstats.ReadProcess(procRoot, c.VM.PID)

	s.idle.mu.Lock()
	defer s.idle.mu.Unlock()
	if s.idle.by[c.ID] != st {
		if watch != nil {
			watch.Close() //nolint:errcheck
		}
		return 0
	}
	if watch != nil {
		st.traffic = watch
	}
	active := st.inUse > 0 || st.lastUse.After(st.lastActive) || s.settingUpGuest(c.ID)
	if st.traffic != nil {
		seen, err := st.traffic.Seen()
		if err != nil {
			s.log.Warn("reading the pod's traffic failed; it counts as used", "container", c.ID, "err", err)
		}
		active = active || seen || err != nil
	}
	// A hypervisor that cannot be read has no CPU to count: the VM watcher looks after one that
	// ended.
	if procErr == nil {
		if st.cpuStart == proc.StartTicks && !st.cpuAt.IsZero() {
			elapsed := now.Sub(st.cpuAt)
			active = active || float64(proc.CPUNanos-st.cpuNanos) >= idleCPUShare*float64(elapsed)
		} else {
			active = true // the first look at this hypervisor: nothing to compare with yet
		}
		st.cpuNanos, st.cpuStart, st.cpuAt = proc.CPUNanos, proc.StartTicks, now
	}
	if active {
		st.lastActive = now
		return 0
	}
	return now.Sub(st.lastActive)
}

// settingUpGuest says whether the guest's set-up for the pod is still under way: it runs commands
// in the guest, which a hibernation would cut.
func (s *Runtime) settingUpGuest(containerID string) bool {
	cio := s.ioOf(containerID)
	if cio == nil {
		return false
	}
	select {
	case <-cio.setUp:
		return false
	default:
		return true
	}
}

// openTrafficWatch opens the watch of the pod interface in the VM's namespace; nil (the pod's
// traffic then keeps nothing awake) when the VM has no namespace of its own or the pod no
// address.
func (s *Runtime) openTrafficWatch(sb *store.Sandbox, c *store.Container) tapmanager.Traffic {
	ip := podIPv4(sb)
	if c.VM.NetNS == "" || ip == nil {
		return nil
	}
	w, err := s.net.WatchTraffic(c.VM.NetNS, ip)
	if err != nil {
		s.log.Warn("the pod's traffic cannot be watched: it neither keeps the VM awake nor wakes it", "container", c.ID, "err", err)
		return nil
	}
	return w
}

func podIPv4(sb *store.Sandbox) net.IP {
	if sb.Network == nil {
		return nil
	}
	for _, a := range sb.Network.IPs {
		if ip := net.ParseIP(a).To4(); ip != nil {
			return ip
		}
	}
	return nil
}

// hibernateIdle hibernates a container's VM that was found idle, unless a use began meanwhile.
func (s *Runtime) hibernateIdle(ctx context.Context, containerID string) {
	s.idle.mu.Lock()
	st := s.idle.by[containerID]
	if st == nil || st.busy || st.inUse > 0 {
		s.idle.mu.Unlock()
		return
	}
	st.busy = true
	s.idle.mu.Unlock()
	err := s.Hibernate(ctx, containerID)
	s.idle.mu.Lock()
	defer s.idle.mu.Unlock()
	st.busy = false
	if err == nil || errors.Is(err, errNothingToDo) {
		st.failures, st.lastErr = 0, ""
		return
	}
	var refusal *hibernationRefusal
	if errors.As(err, &refusal) {
		st.refused = refusal.why
		s.log.Info("this VM does not hibernate", "container", containerID, "why", refusal.why)
		return
	}
	st.failures++
	backoff := min(hibernateRetryMin<<min(st.failures-1, 5), hibernateRetryMax)
	st.retryAt, st.lastErr = s.nowFunc().Add(backoff), err.Error()
	s.log.Warn("the VM could not hibernate; it runs on and the hibernation is tried again later", "container", containerID, "retryIn", backoff, "err", err)
}

// errNothingToDo: the container is no longer running awake.
var errNothingToDo = errors.New("the container does not run awake")

// hibernationRefusal is a reason a VM can never hibernate.
type hibernationRefusal struct{ why string }

func (r *hibernationRefusal) Error() string { return "cannot hibernate: " + r.why }

// Hibernate saves a running container's VM and ends its hypervisor; the container stays RUNNING.
func (s *Runtime) Hibernate(ctx context.Context, containerID string) error {
	c, sb, unlock, err := s.lockContainer(containerID)
	if err != nil {
		return err
	}
	defer unlock()
	if c.State != store.ContainerRunning || c.VM.Hibernated() || c.VM.ID == "" {
		return errNothingToDo
	}
	if s.settingUpGuest(c.ID) {
		// The set-up would wait for the hibernated guest until it gave up.
		return unavailable("the guest of container %s is still being set up for its pod, which a hibernation would cut: try again once it is over", c.ID)
	}
	if why := s.cannotHibernate(ctx, c); why != "" {
		return &hibernationRefusal{why}
	}
	name, err := snapshotName(hibernationSnapshotPrefix, c.ID)
	if err != nil {
		return err
	}
	start := s.nowFunc()
	// The session that follows a detached command ends first: the command runs on in the saved
	// guest, and the wake follows it again.
	follow := s.followGateOf(c.ID)
	if err := follow.pause(ctx); err != nil {
		follow.resume()
		return err
	}
	if _, err := s.store.Containers.Modify(c.ID, func(r *store.Container) error {
		r.VM.Hibernation = store.Hibernation{Snapshot: name}
		return nil
	}); err != nil {
		follow.resume()
		return fmt.Errorf("record the hibernation: %w", err)
	}
	if err := s.cocoonFor(sb).VMHibernate(ctx, c.VM.ID, name); err != nil {
		s.forgetHibernation(ctx, c.ID, name)
		follow.resume()
		if s.cfg.Metrics != nil {
			s.cfg.Metrics.HibernationFailed(s.nowFunc().Sub(start))
		}
		if why := refusedByCocoon(err); why != "" {
			return &hibernationRefusal{why}
		}
		return fmt.Errorf("hibernate VM %s: %w", c.VM.ID, err)
	}
	hib, err := s.store.Containers.Modify(c.ID, func(r *store.Container) error {
		r.VM.Hibernation.Since = s.now()
		r.VM.PID, r.VM.PIDStart = 0, 0
		return nil
	})
	if err != nil {
		return fmt.Errorf("record the VM hibernated: %w", err)
	}
	s.stats.forget(c.ID)
	took := s.nowFunc().Sub(start)
	if s.cfg.Metrics != nil {
		s.cfg.Metrics.Hibernated(took)
	}
	s.log.Info("the idle VM hibernated", "container", c.ID, "vm", c.VM.ID, "snapshot", name, "took", took)
	s.awaitTraffic(ctx, sb, hib)
	return nil
}

// cannotHibernate says why a VM can never hibernate, or "".
func (s *Runtime) cannotHibernate(ctx context.Context, c *store.Container) string {
	caps, err := s.cocoon.Capabilities(ctx)
	switch {
	case err != nil:
		return "" // cocoon's own answer decides
	case !caps.Hibernate:
		return noHibernate(caps)
	case c.VM.Share.Attached:
		return "its volumes are shared with the guest over virtio-fs, and cocoon cannot save a VM with a share attached"
	case len(mainCommand(c.Config.Msg)) > 0 && !c.MainDetached:
		return "its command runs in a session of cocoon-cri's, which a hibernation would cut " +
			"(it has a terminal or stdin, or its guest cannot run it apart: Windows, or no setsid or mkfifo)"
	}
	return ""
}

// refusedByCocoon says why cocoon will never hibernate this VM, or "" for a failure worth a retry.
func refusedByCocoon(err error) string {
	var ce *cocoon.CommandError
	switch {
	case errors.Is(err, cocoon.ErrInUse):
		return "cocoon refuses: " + err.Error()
	case errors.As(err, &ce) && strings.Contains(ce.Message, "does not support hibernate"):
		return "its hypervisor cannot hibernate: " + ce.Message
	}
	return ""
}

// forgetHibernation clears a hibernation that did not happen, and deletes its snapshot should
// cocoon have kept one.
func (s *Runtime) forgetHibernation(ctx context.Context, containerID, snapshot string) {
	s.removeSnapshot(ctx, snapshot, "a failed hibernation")
	if _, err := s.store.Containers.Modify(containerID, func(r *store.Container) error {
		r.VM.Hibernation = store.Hibernation{}
		return nil
	}); err != nil {
		s.log.Error("clearing a failed hibernation failed", "container", containerID, "err", err)
	}
}

// awaitTraffic makes sure a hibernated container's pod interface is watched for the packet that
// wakes it.
func (s *Runtime) awaitTraffic(ctx context.Context, sb *store.Sandbox, c *store.Container) {
	s.idle.mu.Lock()
	st := s.idle.get(c.ID, s.nowFunc())
	if st.cancelWait != nil || st.busy {
		s.idle.mu.Unlock()
		return
	}
	watch := st.traffic
	st.traffic = nil
	// The wait outlives the call that hibernated the VM (an operator's RPC, one look at the VMs):
	// it ends with a wake, the container's end, or the runtime's (Shutdown).
	ctx = context.WithoutCancel(ctx)
	waitCtx, cancel := context.WithCancel(ctx)
	st.cancelWait = cancel
	s.idle.mu.Unlock()

	if watch == nil {
		if watch = s.openTrafficWatch(sb, c); watch == nil {
			return // the wait stays marked, so it is not tried at every look
		}
	}
	go func() {
		defer watch.Close() //nolint:errcheck
		if err := watch.WaitForUse(waitCtx); err != nil {
			return
		}
		s.log.Info("traffic to the pod wakes its VM", "container", c.ID)
		wakeCtx, cancelWake := context.WithTimeout(ctx, wakeTimeout)
		defer cancelWake()
		if err := s.Wake(wakeCtx, c.ID); err != nil {
			s.log.Warn("waking the VM for the pod's traffic failed", "container", c.ID, "err", err)
		}
	}()
}

// Wake resumes a hibernated container's VM; nothing happens to one that is awake.
func (s *Runtime) Wake(ctx context.Context, containerID string) error {
	c, sb, unlock, err := s.lockContainer(containerID)
	if err != nil {
		return err
	}
	defer unlock()
	if c.State != store.ContainerRunning || !c.VM.Hibernated() {
		return nil
	}
	start := s.nowFunc()
	snap := c.VM.Hibernation.Snapshot
	cc := s.cocoonFor(sb)
	if err := cc.VMRestore(ctx, c.VM.ID, snap); err != nil {
		return fmt.Errorf("wake VM %s from snapshot %s: %w", c.VM.ID, snap, err)
	}
	vm, err := cc.VMInspect(ctx, c.VM.ID)
	if err != nil {
		return fmt.Errorf("inspect the woken VM %s: %w", c.VM.ID, err)
	}
	if err := s.recordWoken(sb, c, vm); err != nil {
		return err
	}
	// Before the use that woke it: the guest resumed at the time it hibernated.
	s.stepGuestClock(ctx, sb, c)
	s.removeSnapshot(ctx, snap, "a hibernation")
	took := s.nowFunc().Sub(start)
	if s.cfg.Metrics != nil {
		s.cfg.Metrics.Woke(took)
	}
	s.log.Info("the VM woke", "container", c.ID, "vm", c.VM.ID, "pid", vm.PID, "took", took)
	return nil
}

// recordWoken puts a woken VM's new hypervisor into the pod's cgroup and records it awake.
func (s *Runtime) recordWoken(sb *store.Sandbox, c *store.Container, vm *cocoon.VM) error {
	if _, _, err := s.placeVM(sb, c, vm.PID); err != nil {
		return err
	}
	if err := s.setOOMScoreAdj(c, vm.PID); err != nil {
		s.log.Warn("the woken VM keeps the OOM score cocoon gave it", "container", c.ID, "err", err)
	}
	pidStart, _ := vmstats.StartTicks(procRoot, vm.PID)
	if _, err := s.store.Containers.Modify(c.ID, func(r *store.Container) error {
		r.VM.PID, r.VM.PIDStart, r.VM.APISocket = vm.PID, pidStart, vm.SocketPath
		r.VM.Hibernation = store.Hibernation{}
		return nil
	}); err != nil {
		return fmt.Errorf("record the VM awake: %w", err)
	}
	s.idle.mu.Lock()
	if st := s.idle.by[c.ID]; st != nil {
		st.closeWatch()
		st.lastActive = s.nowFunc()
	}
	s.idle.mu.Unlock()
	if cio := s.ioOf(c.ID); cio != nil && cio.resumeGuest != nil {
		cio.resumeGuest()
	}
	s.followGateOf(c.ID).resume()
	return nil
}

// followGateOf is the gate of the session that follows the container's detached command; one
// that gates nothing when there is none.
func (s *Runtime) followGateOf(containerID string) *followGate {
	if cio := s.ioOf(containerID); cio != nil && cio.main != nil {
		return &cio.main.follow
	}
	return &followGate{}
}

// inUse marks a use of the container's VM that lasts until the returned release, waking the VM
// first when it hibernates. Uses keep it from hibernating.
func (s *Runtime) inUse(ctx context.Context, containerID string) (release func(), err error) {
	s.idle.mu.Lock()
	st := s.idle.get(containerID, s.nowFunc())
	st.inUse++
	s.idle.mu.Unlock()
	release = func() {
		s.idle.mu.Lock()
		defer s.idle.mu.Unlock()
		st.inUse--
		st.lastUse = s.nowFunc()
	}
	c, err := s.store.Containers.Get(containerID)
	if err != nil || !c.VM.Hibernated() {
		return release, nil
	}
	if err := s.Wake(ctx, containerID); err != nil {
		release()
		return nil, unavailable("container %s hibernates and could not be woken: %v", containerID, err)
	}
	return release, nil
}

// discardHibernation ends a hibernated container without waking its guest: the saved state is
// deleted; the pod interface stays in the VM's namespace, as a stopped VM's does. The caller holds
// the sandbox lock.
func (s *Runtime) discardHibernation(ctx context.Context, c *store.Container) error {
	s.removeSnapshot(ctx, c.VM.Hibernation.Snapshot, "a hibernation")
	s.idle.drop(c.ID)
	if _, err := s.store.Containers.Modify(c.ID, func(r *store.Container) error {
		r.VM.Hibernation = store.Hibernation{}
		return nil
	}); err != nil {
		return fmt.Errorf("record the hibernation discarded: %w", err)
	}
	return nil
}

// hibernationInfo is what crictl inspect shows of a container's hibernation.
type hibernationInfo struct {
	After      string `json:"after"`
	Hibernated bool   `json:"hibernated"`
	Since      string `json:"since,omitempty"`
	Snapshot   string `json:"snapshot,omitempty"`
	// CannotHibernate says why this VM never hibernates, once found.
	CannotHibernate string `json:"cannotHibernate,omitempty"`
	LastError       string `json:"lastError,omitempty"`
}

func (s *Runtime) hibernationInfo(sb *store.Sandbox, c *store.Container) *hibernationInfo {
	if sb.VM.HibernateAfter <= 0 && c.VM.Hibernation.Snapshot == "" {
		return nil
	}
	info := &hibernationInfo{After: sb.VM.HibernateAfter.String(), Hibernated: c.VM.Hibernated(), Snapshot: c.VM.Hibernation.Snapshot}
	if info.Hibernated {
		info.Since = time.Unix(0, c.VM.Hibernation.Since).UTC().Format(time.RFC3339Nano)
	}
	s.idle.mu.Lock()
	if st := s.idle.by[c.ID]; st != nil {
		info.CannotHibernate, info.LastError = st.refused, st.lastErr
	}
	s.idle.mu.Unlock()
	return info
}

// recoverHibernations settles, after a restart, the hibernations and wakes a crash cut short, from
// what cocoon's VM list shows: a VM that runs is awake (a hibernation that failed, or a wake whose
// restore was done), one that is stopped holds its saved state if the snapshot exists.
func (s *Runtime) recoverHibernations(ctx context.Context, vms []cocoon.VM) {
	byID := make(map[string]cocoon.VM, len(vms))
	for _, vm := range vms {
		byID[vm.ID] = vm
	}
	for _, c := range s.store.Containers.List(func(c *store.Container) bool {
		return c.State == store.ContainerRunning && c.VM.Hibernation.Snapshot != ""
	}) {
		sb, err := s.store.Sandboxes.Get(c.SandboxID)
		if err != nil {
			continue
		}
		vm, ok := byID[c.VM.ID]
		snap := c.VM.Hibernation.Snapshot
		switch {
		case !ok:
			// Gone from cocoon: the container ends as any whose VM was removed behind cocoon-cri.
			s.forgetHibernation(ctx, c.ID, snap)
		case vm.State == cocoon.VMStateRunning && c.VM.Hibernated():
			s.log.Info("adopting a VM whose wake a restart cut short", "container", c.ID, "vm", vm.ID)
			if err := s.recordWoken(sb, c, &vm); err != nil {
				s.log.Error("adopting a woken VM failed", "container", c.ID, "err", err)
				continue
			}
			s.removeSnapshot(ctx, snap, "a hibernation")
		case vm.State == cocoon.VMStateRunning:
			s.log.Info("a hibernation a restart cut short did not happen; the VM runs", "container", c.ID, "vm", vm.ID)
			s.forgetHibernation(ctx, c.ID, snap)
		case !c.VM.Hibernated():
			if _, err := s.cocoon.SnapshotInspect(ctx, snap); err != nil {
				s.forgetHibernation(ctx, c.ID, snap)
				continue
			}
			if _, err := s.store.Containers.Modify(c.ID, func(r *store.Container) error {
				r.VM.Hibernation.Since = s.now()
				r.VM.PID, r.VM.PIDStart = 0, 0
				return nil
			}); err != nil {
				s.log.Error("recording a hibernation a restart cut short failed", "container", c.ID, "err", err)
			}
		}
	}
}
