package vmruntime

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"maps"
	"regexp"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"

	"github.com/cocoonstack/cocoon-cri/pkg/cgroups"
	"github.com/cocoonstack/cocoon-cri/pkg/cocoon"
	"github.com/cocoonstack/cocoon-cri/pkg/faultpoint"
	"github.com/cocoonstack/cocoon-cri/pkg/store"
	"github.com/cocoonstack/cocoon-cri/pkg/vmstats"
	"github.com/cocoonstack/cocoon-cri/streaming"
)

// A warm pool keeps VMs of a snapshot image cloned and running, on a placeholder network, in a
// cgroup of cocoon-cri's own. A VM pod of that image whose VM would be the same takes one at
// StartContainer instead of a clone: the pod interface replaces the placeholder, and the guest is
// given the pod's identity before the container is reported running (docs/warm-pool.md).

// poolVMPrefix names pool VMs: cri-pool-<12 hex>.
const poolVMPrefix = VMNamePrefix + "pool-"

// poolNetID names a pool VM's placeholder network and its cgroup under the pool's parent.
func poolNetID(name string) string { return "pool" + strings.TrimPrefix(name, poolVMPrefix) }

// poolCgroupParent is where pool VMs are accounted, in each cgroup driver's form.
func poolCgroupParent(driver string) string {
	if driver == cgroups.Systemd {
		return "cocoon_cri_pool.slice"
	}
	return "/cocoon-cri-pool"
}

// poolTick is how often the pools are looked at besides the kicks of claims and removals.
const poolTick = time.Second

// warmPools is the pools' state in memory; the store's PoolVMs table is the record.
type warmPools struct {
	mu    sync.Mutex
	pools map[string]*warmPool // by configured reference
	kick  chan struct{}
	// starts counts StartContainers in flight: the fill waits for them, so that it never takes
	// cocoon from a pod being started.
	starts atomic.Int32
	// primed are the primed shells of the VMs next in line, by pool VM name.
	primed map[string]*primedShell
}

// warmPool is one configured reference's pool.
type warmPool struct {
	ref     string
	wanted  int
	imageID string   // the image the reference names now; "" when the node lacks it
	ready   []string // pool VM names, oldest first
	// why the pool cannot fill; logged once per change, shown by crictl info
	reason string
}

// WarmPoolInfo is a pool as crictl info shows it.
type WarmPoolInfo struct {
	Image  string `json:"image"`
	Wanted int    `json:"wanted"`
	Ready  int    `json:"ready"`
	// Reason says why the pool does not fill, where it does not.
	Reason string `json:"reason,omitempty"`
}

func newWarmPools(wanted map[string]int) *warmPools {
	p := &warmPools{pools: map[string]*warmPool{}, kick: make(chan struct{}, 1), primed: map[string]*primedShell{}}
	for ref, n := range wanted {
		if n > 0 {
			p.pools[ref] = &warmPool{ref: ref, wanted: n}
		}
	}
	return p
}

func (p *warmPools) wake() {
	select {
	case p.kick <- struct{}{}:
	default:
	}
}

// info lists the pools by reference.
func (p *warmPools) info() []WarmPoolInfo {
	p.mu.Lock()
	defer p.mu.Unlock()
	out := []WarmPoolInfo{}
	for _, ref := range slices.Sorted(maps.Keys(p.pools)) {
		wp := p.pools[ref]
		out = append(out, WarmPoolInfo{Image: ref, Wanted: wp.wanted, Ready: len(wp.ready), Reason: wp.reason})
	}
	return out
}

// RunWarmPools fills the pools until ctx ends: at start, after each claim, and once a poolTick.
func (s *Runtime) RunWarmPools(ctx context.Context) {
	if len(s.pools.pools) == 0 {
		return
	}
	tick := time.NewTicker(poolTick)
	defer tick.Stop()
	for {
		// The VMs next in line are primed before the pools are filled, which takes a while.
		s.primePools(ctx)
		s.fillPools(ctx)
		s.primePools(ctx)
		select {
		case <-ctx.Done():
			return
		case <-tick.C:
		case <-s.pools.kick:
		}
	}
}

// fillPools clones what the pools lack, one VM at a time and none while a pod starts.
func (s *Runtime) fillPools(ctx context.Context) {
	for _, ref := range slices.Sorted(maps.Keys(s.pools.pools)) {
		for ctx.Err() == nil && s.pools.starts.Load() == 0 {
			img, spec, ok := s.poolNeedsVM(ctx, ref)
			if !ok {
				break
			}
			start := time.Now()
			err := s.fillOne(ctx, ref, img, spec)
			if err != nil {
				s.log.Warn("a warm pool VM could not be made; trying again later", "image", ref, "err", err)
				break
			}
			if s.cfg.Metrics != nil {
				s.cfg.Metrics.PoolRefilled(ref, time.Since(start))
			}
		}
		s.reportPoolReady(ref)
	}
}

// poolNeedsVM says whether ref's pool lacks a VM, and what to clone it from.
func (s *Runtime) poolNeedsVM(ctx context.Context, ref string) (*store.Image, store.VM, bool) {
	img, spec, reason := s.poolSource(ctx, ref)
	p := s.pools
	p.mu.Lock()
	defer p.mu.Unlock()
	wp := p.pools[ref]
	if reason != wp.reason {
		if reason != "" {
			s.log.Warn("a warm pool does not fill; its pods start cold", "image", ref, "reason", reason)
		} else if wp.reason != "" {
			s.log.Info("a warm pool fills again", "image", ref)
		}
		wp.reason = reason
	}
	if reason != "" {
		wp.imageID = ""
		return nil, store.VM{}, false
	}
	wp.imageID = img.ID
	return img, spec, len(wp.ready) < wp.wanted
}

// poolSource is the image a pool's reference names and the VM a pod of it with no limits and no
// annotations would get, or why the pool cannot have one.
func (s *Runtime) poolSource(ctx context.Context, ref string) (*store.Image, store.VM, string) {
	img, err := s.images.Get(ref)
	if err != nil {
		return nil, store.VM{}, fmt.Sprintf("image %s is not on the node (%v): pull or import it", ref, err)
	}
	if img.Kind != store.ImageSnapshot || img.Snapshot == nil {
		return nil, store.VM{}, fmt.Sprintf("image %s is not a VM snapshot: only snapshots are pooled (a VM booted from an image cannot be kept ready for a pod)", ref)
	}
	if img.Snapshot.Hypervisor != cocoon.HypervisorCloudHypervisor {
		return nil, store.VM{}, fmt.Sprintf("image %s is a %s snapshot: only cloud-hypervisor clones are pooled (a restored Firecracker guest keeps its NIC)", ref, img.Snapshot.Hypervisor)
	}
	caps, err := s.cocoon.Capabilities(ctx)
	if err != nil {
		return nil, store.VM{}, fmt.Sprintf("cannot learn what this cocoon can do: %v", err)
	}
	if !caps.Exec {
		return nil, store.VM{}, "this cocoon has no vm exec, so a pool VM's guest could not be given a pod's identity (cocoon v0.5 has it)"
	}
	spec, err := s.planVM(newID(), &runtimeapi.ContainerConfig{}, &store.Sandbox{Config: store.Proto[*runtimeapi.PodSandboxConfig]{Msg: &runtimeapi.PodSandboxConfig{}}}, img, caps.CloneResize)
	if err != nil {
		return nil, store.VM{}, fmt.Sprintf("image %s cannot be cloned: %v", ref, err)
	}
	return img, spec, ""
}

// fillOne makes one pool VM: recorded first, cloned onto a placeholder network, put into the pool
// cgroup, and ready once its guest agent has answered (and given it its own machine-id).
func (s *Runtime) fillOne(ctx context.Context, ref string, img *store.Image, spec store.VM) error {
	var suffix [6]byte
	_, _ = rand.Read(suffix[:])
	spec.Name = poolVMPrefix + hex.EncodeToString(suffix[:])
	pv := &store.PoolVM{Name: spec.Name, Image: img.ID, Ref: ref, Spec: spec, CreatedAt: time.Unix(0, s.now())}
	if err := s.store.PoolVMs.Create(pv); err != nil {
		return fmt.Errorf("record pool VM: %w", err)
	}
	err := s.makePoolVM(ctx, pv)
	if cur, getErr := s.images.Get(ref); err == nil && (getErr != nil || cur.ID != img.ID) {
		err = fmt.Errorf("image %s was removed meanwhile", ref)
	}
	if err != nil {
		s.discardPoolVM(context.WithoutCancel(ctx), pv, nil)
		return err
	}
	s.pools.mu.Lock()
	defer s.pools.mu.Unlock()
	// A drain meanwhile (RemoveImage) left the pool without this image.
	if wp := s.pools.pools[ref]; wp != nil && wp.imageID == img.ID {
		wp.ready = append(wp.ready, pv.Name)
	}
	s.log.Info("warm pool VM ready", "image", ref, "vm", pv.Name, "vmID", pv.Spec.ID)
	return nil
}

func (s *Runtime) makePoolVM(ctx context.Context, pv *store.PoolVM) error {
	netID := poolNetID(pv.Name)
	if err := s.net.PreparePoolVM(netID); err != nil {
		return fmt.Errorf("placeholder network: %w", err)
	}
	spec := pv.Spec
	cc := s.cocoon.WithNetwork(s.net.CocoonConfDir(netID), s.net.PluginDir(), nil)
	vm, err := cc.VMClone(ctx, spec.Source, cloneOptions(spec))
	if err != nil {
		return fmt.Errorf("clone %s: %w", spec.Source, err)
	}
	l := launchedFrom(vm)
	var cgroup, created string
	if l.PID > 0 {
		if pids, err := vmstats.Tree(procRoot, l.PID); err == nil {
			cgroup, created, err = s.cgroups.Place(poolCgroupParent(s.cgroups.Name()), netID, pids)
			if err != nil {
				return fmt.Errorf("put the pool VM into cocoon-cri's pool cgroup: %w", err)
			}
		}
	}
	pv, err = s.store.PoolVMs.Modify(pv.Name, func(r *store.PoolVM) error {
		l.record(&r.Spec)
		r.Spec.Cgroup, r.Spec.CgroupCreated = cgroup, created
		return nil
	})
	if err != nil {
		return fmt.Errorf("record pool VM: %w", err)
	}
	var mac string
	if len(vm.NetworkConfigs) > 0 && vm.NetworkConfigs[0] != nil {
		mac = vm.NetworkConfigs[0].Mac
	}
	nic, err := s.awaitPoolGuest(ctx, pv, mac)
	if err != nil {
		return err
	}
	_, err = s.store.PoolVMs.Modify(pv.Name, func(r *store.PoolVM) error { r.Ready, r.Spec.GuestNIC = true, nic; return nil })
	return err
}

// awaitPoolGuest waits, within the guest-ready timeout, for the guest's agent, which then gives
// the guest its own machine-id and fresh entropy (every clone of a snapshot wakes with the
// snapshot's) where this cocoon can, and names the guest's NIC (the one with the placeholder's
// MAC), so that the hand-over need not search for it.
func (s *Runtime) awaitPoolGuest(ctx context.Context, pv *store.PoolVM, mac string) (string, error) {
	ctx, cancel := context.WithTimeout(ctx, s.cfg.GuestReadyTimeout)
	defer cancel()
	caps, err := s.cocoon.Capabilities(ctx)
	if err != nil {
		return "", err
	}
	reseeded := !caps.ReseedMachineID
	probe := fmt.Sprintf(`for d in /sys/class/net/*; do [ "$(cat "$d/address" 2>/dev/null)" = %s ] && echo "${d##*/}"; done; true`,
		streaming.ShellQuote([]string{strings.ToLower(mac)}))
	for {
		// The clone resumed at its snapshot's time: its clock is stepped here, off the hand-over's
		// path, best effort (a guest whose clock cannot be stepped is still a pool VM), and written
		// at each try, as it carries the host's time.
		script := stepClockLine(pv.Spec.Backend, s.nowFunc()) + "; " + probe
		if !reseeded {
			err = s.cocoon.VMReseed(ctx, pv.Spec.ID, true)
			reseeded = err == nil
		}
		if reseeded {
			var out strings.Builder
			var code int
			code, err = s.cocoon.VMExec(ctx, pv.Spec.ID, []string{"/bin/sh", "-c", script}, cocoon.ExecOptions{Stdout: &out})
			switch nics := strings.Fields(out.String()); {
			case err != nil:
			case code != 0 || len(nics) != 1 || !guestNICName.MatchString(nics[0]):
				return "", fmt.Errorf("the pool VM's guest has interfaces %q with its NIC's MAC %s (exit code %d), not one: it cannot be given a pod's", nics, mac, code)
			default:
				return nics[0], nil
			}
		}
		if errors.Is(err, cocoon.ErrNoVsock) || errors.Is(err, cocoon.ErrNotFound) {
			return "", fmt.Errorf("the pool VM's guest cannot take commands: %w", err)
		}
		select {
		case <-ctx.Done():
			return "", fmt.Errorf("the pool VM's guest agent did not answer in time: %w", err)
		case <-time.After(agentRetry):
		}
	}
}

// guestNICName is what a Linux interface name may be (IFNAMSIZ), and all the set-up script takes
// from the guest.
var guestNICName = regexp.MustCompile(`^[A-Za-z0-9_.-]{1,15}$`)

// discardPoolVM removes a pool VM and what it had: the VM (on sb's network where it was handed to
// that sandbox, so cocoon's CNI DEL gives the pod interface back), its placeholder network, its
// cgroup and its record. Failures are logged; the next start's reconcile finds what is left.
func (s *Runtime) discardPoolVM(ctx context.Context, pv *store.PoolVM, sb *store.Sandbox) {
	log := s.log.With("vm", pv.Name, "image", pv.Ref)
	s.pools.closePrimed(pv.Name)
	cc := s.cocoon.WithNetwork(s.net.CocoonConfDir(poolNetID(pv.Name)), s.net.PluginDir(), nil)
	if sb != nil {
		cc = s.cocoonFor(sb)
	}
	if err := cc.VMRemove(ctx, pv.Name, true); err != nil && !errors.Is(err, cocoon.ErrNotFound) {
		log.Error("removing a warm pool VM failed", "err", err)
		return
	}
	if err := s.net.RemovePoolVM(poolNetID(pv.Name)); err != nil {
		log.Warn("the placeholder network of a removed pool VM is left; the next start removes it", "err", err)
	}
	cgroup, created := pv.Spec.Cgroup, pv.Spec.CgroupCreated
	if cgroup == "" {
		// Unrecorded (a fill or hand-over cut short): its name is known.
		cgroup, _ = s.cgroups.Path(poolCgroupParent(s.cgroups.Name()), poolNetID(pv.Name))
		created = cgroup
	}
	if err := s.dropCgroup(ctx, cgroup, created, cgroupRemoveWait); err != nil {
		log.Warn("the cgroup of a removed pool VM is left", "err", err)
	}
	if err := s.store.PoolVMs.Delete(pv.Name); err != nil && !errors.Is(err, store.ErrNotFound) {
		log.Warn("the record of a removed pool VM is left; the next start removes it", "err", err)
	}
}

// claimPoolVM takes a ready pool VM for container c, with its primed shell if it has one, if its
// image has a pool and c's VM would be the same as the pool's; a pooled image without one is a
// miss, counted. Nil: clone.
func (s *Runtime) claimPoolVM(c *store.Container) (*store.PoolVM, *primedShell) {
	p := s.pools
	p.mu.Lock()
	defer p.mu.Unlock()
	var wp *warmPool
	for _, candidate := range p.pools {
		id := candidate.imageID
		if id == "" {
			// Not filled yet, or not fillable: a pod of its image is a miss all the same.
			if img, err := s.images.Get(candidate.ref); err == nil {
				id = img.ID
			}
		}
		if id == c.ImageID {
			wp = candidate
			break
		}
	}
	if wp == nil {
		return nil, nil
	}
	defer p.wake()
	for len(wp.ready) > 0 {
		name := wp.ready[0]
		wp.ready = wp.ready[1:]
		pv, err := s.store.PoolVMs.Get(name)
		if err != nil || pv.Image != c.ImageID {
			continue
		}
		if !fitsPoolVM(c.VM, pv.Spec) {
			wp.ready = append([]string{name}, wp.ready...)
			break
		}
		return pv, p.takePrimed(name)
	}
	if s.cfg.Metrics != nil {
		s.cfg.Metrics.PoolMissed(wp.ref)
	}
	s.log.Info("no warm pool VM for the container; cloning", "container", c.ID, "image", wp.ref)
	return nil, nil
}

// fitsPoolVM says whether a container planned to get VM want can take a pool VM made as pool.
func fitsPoolVM(want, pool store.VM) bool {
	return want.Mode == store.VMClone && want.ForkOf == "" &&
		want.Source == pool.Source && want.Backend == pool.Backend &&
		want.CPU == pool.CPU && want.Memory == pool.Memory && want.Storage == pool.Storage &&
		want.NICs == pool.NICs && want.NoDirectIO == pool.NoDirectIO &&
		want.OnDemand == pool.OnDemand && want.PullBase == pool.PullBase
}

// vmPlacement is the cgroup a VM was put in, and the topmost cgroup made for it (placeVM).
type vmPlacement struct {
	cgroup, created string
}

// handOver gives pool VM pv to container c of sandbox sb: recorded as the container's, the pod
// interface in the placeholder's place, the guest given the pod's address, MAC, hostname and
// resolvers, the hypervisor in the pod's cgroup instead of the pool's. The pool's network goes.
// The placement is returned on failure too, for the caller to remove.
func (s *Runtime) handOver(ctx context.Context, sb *store.Sandbox, c *store.Container, pv *store.PoolVM, ps *primedShell) (launched, vmPlacement, error) {
	l := launchedOf(pv.Spec)
	began := time.Now()
	taken, err := s.store.Containers.Modify(c.ID, func(r *store.Container) error {
		r.VM.Name, r.VM.ID, r.VM.Pooled, r.VM.GuestNIC = pv.Name, pv.Spec.ID, true, pv.Spec.GuestNIC
		return nil
	})
	if err != nil {
		return l, vmPlacement{}, fmt.Errorf("record the pool VM as the container's: %w", err)
	}
	faultpoint.Hit(faultpoint.HandOverClaimed)
	recorded := time.Now()
	// Once the VM is the container's, the pool's record, the host's side, the guest's and the
	// cgroup are independent: all four are done before the answer, at once.
	placed := make(chan error, 1)
	var place vmPlacement
	go func() {
		var err error
		place.cgroup, place.created, err = s.placeVM(sb, c, l.PID)
		placed <- err
	}()
	untaken := make(chan error, 1)
	go func() {
		err := s.store.PoolVMs.Delete(pv.Name)
		if err == nil {
			faultpoint.Hit(faultpoint.HandOverTaken)
		}
		untaken <- err
	}()
	var wired time.Duration
	networkDone := make(chan error, 1)
	go func() {
		err := s.net.HandOver(sb.ID, sb.NetNS, pv.Spec.NetNS)
		wired = time.Since(recorded)
		networkDone <- err
	}()
	ctx, cancel := context.WithTimeout(ctx, s.cfg.GuestReadyTimeout)
	defer cancel()
	guestErr := s.configurePoolGuest(ctx, sb, taken, ps)
	guestDone := time.Since(recorded)
	untakenErr, networkErr, placeErr := <-untaken, <-networkDone, <-placed
	switch {
	case untakenErr != nil:
		return l, place, fmt.Errorf("take the pool VM out of its pool: %w", untakenErr)
	case networkErr != nil:
		return l, place, fmt.Errorf("hand the pod interface to the pool VM: %w", networkErr)
	case guestErr != nil:
		return l, place, guestErr
	case placeErr != nil:
		return l, place, placeErr
	}
	// Only now is the pool's cgroup empty: a process the guest's set-up started (a simulated
	// guest's are the host's) stays where its parent was when it forked.
	place.cgroup, place.created = s.leavePoolCgroup(ctx, pv, place.cgroup, place.created)
	faultpoint.Hit(faultpoint.HandOverGuestSetUp)
	s.log.Debug("warm pool VM handed over", "container", c.ID, "vm", pv.Name, "claim", recorded.Sub(began),
		"network", wired, "guest", guestDone)
	if err := s.net.RemovePoolVM(poolNetID(pv.Name)); err != nil {
		s.log.Warn("the placeholder network of a handed-over pool VM is left; the next start removes it", "vm", pv.Name, "err", err)
	}
	return l, place, nil
}

// takePoolVM runs a pool VM for c where one fits, in the pod's cgroup: on a failed hand-over the
// VM is removed, never reused, with the cgroup made for it, and the container's record is as
// before, for a clone.
func (s *Runtime) takePoolVM(ctx context.Context, sb *store.Sandbox, c *store.Container) (launched, *store.PoolVM, vmPlacement, bool) {
	pv, ps := s.claimPoolVM(c)
	if pv == nil {
		return launched{}, nil, vmPlacement{}, false
	}
	if ps != nil {
		defer ps.close() // once it has run the set-up, or did not
	}
	start := time.Now()
	l, place, err := s.handOver(ctx, sb, c, pv, ps)
	if err == nil {
		if s.cfg.Metrics != nil {
			s.cfg.Metrics.PoolHandedOver(pv.Ref, time.Since(start))
		}
		s.log.Info("warm pool VM handed to the container", "container", c.ID, "vm", pv.Name, "image", pv.Ref)
		return l, pv, place, true
	}
	s.log.Warn("handing a warm pool VM to the container failed; removing it and cloning", "container", c.ID, "vm", pv.Name, "err", err)
	if s.cfg.Metrics != nil {
		s.cfg.Metrics.PoolFellBack(pv.Ref)
	}
	s.discardPoolVM(context.WithoutCancel(ctx), pv, sb)
	if place.cgroup != "" && place.cgroup != pv.Spec.Cgroup {
		if err := s.dropCgroup(context.WithoutCancel(ctx), place.cgroup, place.created, cgroupRemoveWait); err != nil {
			s.log.Warn("the cgroup of a failed hand-over is left behind", "container", c.ID, "err", err)
		}
	}
	if _, err := s.store.Containers.Modify(c.ID, func(r *store.Container) error {
		r.VM.Name, r.VM.ID, r.VM.Pooled = c.VM.Name, "", false
		return nil
	}); err != nil {
		s.log.Error("restoring the container's VM name after a failed hand-over failed", "container", c.ID, "err", err)
	}
	return launched{}, nil, vmPlacement{}, false
}

// reportPoolReady tells the metrics how many VMs ref's pool has ready.
func (s *Runtime) reportPoolReady(ref string) {
	if s.cfg.Metrics == nil {
		return
	}
	s.pools.mu.Lock()
	n := len(s.pools.pools[ref].ready)
	s.pools.mu.Unlock()
	s.cfg.Metrics.PoolReady(ref, n)
}

// drainPools removes the pool VMs of an image whose pool's reference no longer names it (after a
// RemoveImage): such a pool fills again once the reference names an image. It reports whether any
// went.
func (s *Runtime) drainPools(ctx context.Context, imageID string) bool {
	var refs []string
	s.pools.mu.Lock()
	for ref, wp := range s.pools.pools {
		if wp.imageID == imageID {
			refs = append(refs, ref)
		}
	}
	s.pools.mu.Unlock()
	drained := false
	for _, ref := range refs {
		if img, err := s.images.Get(ref); err == nil && img.ID == imageID {
			continue
		}
		s.pools.mu.Lock()
		if wp := s.pools.pools[ref]; wp.imageID == imageID {
			wp.ready, wp.imageID = nil, ""
		}
		s.pools.mu.Unlock()
		for _, pv := range s.store.PoolVMs.List(func(pv *store.PoolVM) bool { return pv.Ref == ref && pv.Image == imageID }) {
			s.discardPoolVM(ctx, pv, nil)
			s.log.Info("warm pool VM removed with its image", "vm", pv.Name, "image", ref)
			drained = true
		}
		// Says why the pool no longer fills, or finds the reference's new image.
		s.poolNeedsVM(ctx, ref)
		s.reportPoolReady(ref)
	}
	return drained
}

// recoverPools settles the pools after a restart, from cocoon's VM list: a hand-over a restart cut
// short is undone (the pool VM removed, the container cloned at its next start); pool VMs whose
// pool is still configured, for the same image, and which run are adopted up to the pool's size;
// every other pool VM is removed, with its network.
func (s *Runtime) recoverPools(ctx context.Context, vms []cocoon.VM) {
	running := map[string]bool{}
	for _, vm := range vms {
		running[vm.Config.Name] = vm.State == cocoon.VMStateRunning
	}
	for _, c := range s.store.Containers.List(func(c *store.Container) bool { return c.State == store.ContainerCreated && c.VM.Pooled }) {
		sb, err := s.store.Sandboxes.Get(c.SandboxID)
		if err != nil {
			continue
		}
		s.log.Info("undoing a warm pool hand-over a restart cut short", "container", c.ID, "vm", c.VM.Name)
		s.discardPoolVM(ctx, &store.PoolVM{Name: c.VM.Name}, sb)
		md := sb.Config.Msg.GetMetadata()
		if _, err := s.store.Containers.Modify(c.ID, func(r *store.Container) error {
			r.VM.Name, r.VM.ID, r.VM.Pooled = vmName(c.ID, md.GetName(), c.Config.Msg.GetMetadata().GetName()), "", false
			return nil
		}); err != nil {
			s.log.Error("restoring the container's VM name failed", "container", c.ID, "err", err)
		}
	}
	recorded := map[string]bool{}
	for _, pv := range s.store.PoolVMs.List(nil) {
		recorded[pv.Name] = true
		img, _, reason := s.poolSource(ctx, pv.Ref)
		s.pools.mu.Lock()
		wp := s.pools.pools[pv.Ref]
		adopt := wp != nil && reason == "" && img.ID == pv.Image && pv.Ready && running[pv.Name] && len(wp.ready) < wp.wanted
		if adopt {
			wp.imageID = img.ID
			wp.ready = append(wp.ready, pv.Name)
		}
		s.pools.mu.Unlock()
		if adopt {
			s.log.Info("warm pool VM adopted", "vm", pv.Name, "image", pv.Ref)
			continue
		}
		s.log.Info("removing a warm pool VM its pool no longer wants", "vm", pv.Name, "image", pv.Ref)
		s.discardPoolVM(ctx, pv, nil)
	}
	claimed := map[string]bool{}
	for _, c := range s.store.Containers.List(nil) {
		claimed[c.VM.Name] = true
	}
	for _, vm := range vms {
		if name := vm.Config.Name; strings.HasPrefix(name, poolVMPrefix) && !recorded[name] && !claimed[name] {
			s.log.Info("removing a warm pool VM that has no record", "vm", name)
			s.discardPoolVM(ctx, &store.PoolVM{Name: name}, nil)
		}
	}
}

// poolNetworks are the network IDs of the pool VMs on record, which the leftover sweep keeps.
func (s *Runtime) poolNetworks() []string {
	var ids []string
	for _, pv := range s.store.PoolVMs.List(nil) {
		ids = append(ids, poolNetID(pv.Name))
	}
	return ids
}
