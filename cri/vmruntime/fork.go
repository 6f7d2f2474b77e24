package vmruntime

import (
	"context"
	"fmt"
	"strings"
	"sync"

	"github.com/cocoonstack/cocoon-cri/pkg/store"
)

// Fork (docs/hibernation.md, Fork): a pod whose fork-from annotation names a running VM pod of its
// own namespace on this node starts its VM as a copy of that pod's: StartContainer saves the
// source (cocoon pauses it only for the capture), clones the save with its memory copied, and
// deletes the save once no fork start waits for it. The clone then gets the fork's own identity as
// any clone does (hostname, IP and MAC, machine-id).

// forkSnapshotPrefix names the snapshots fork starts make and delete again.
const forkSnapshotPrefix = "cri-fork-"

// forkSource is the running container a fork's pod names. A pod that is not here, not a VM pod,
// or runs no VM is FailedPrecondition, saying which.
func (s *Runtime) forkSource(sb *store.Sandbox) (*store.Container, error) {
	ref := sb.VM.ForkFrom
	namespace, name, _ := strings.Cut(ref, "/")
	sources := s.store.Sandboxes.List(func(src *store.Sandbox) bool {
		md := src.Config.Msg.GetMetadata()
		return src.ID != sb.ID && md.GetNamespace() == namespace && md.GetName() == name
	})
	if len(sources) == 0 {
		return nil, precondition("the fork's source pod %s is not a VM pod on this node (a fork copies a running VM pod of the same node)", ref)
	}
	for _, src := range sources {
		if src.State != store.SandboxReady {
			continue
		}
		if c := s.runningContainerOf(src.ID); c != nil {
			return c, nil
		}
	}
	return nil, precondition("the fork's source pod %s runs no VM: a fork copies a running one", ref)
}

// forkVM makes a fork's VM spec: the source's VM, cloned, in the fork's pod. The fork's image must
// be the source's, so that the kubelet's account of the images in use stays true.
func (s *Runtime) forkVM(sb *store.Sandbox, img *store.Image, planned store.VM) (store.VM, error) {
	src, err := s.forkSource(sb)
	if err != nil {
		return store.VM{}, err
	}
	if src.ImageID != img.ID {
		return store.VM{}, invalid("a fork runs its source's image: pod %s runs %s, not %s", sb.VM.ForkFrom, src.ImageRef, img.ID)
	}
	vm := planned
	vm.Mode, vm.Source, vm.ForkOf = store.VMClone, "", src.ID
	vm.CPU, vm.Memory, vm.Storage = src.VM.CPU, src.VM.Memory, src.VM.Storage
	vm.Backend, vm.DirectBoot, vm.Windows, vm.NoDirectIO = src.VM.Backend, src.VM.DirectBoot, src.VM.Windows, src.VM.NoDirectIO
	vm.NICs, vm.OnDemand, vm.PullBase, vm.SharedMemory = 0, false, false, src.VM.SharedMemory
	return vm, nil
}

// forkSaves are the saves of fork sources under way: forks of one source that start together
// share one.
type forkSaves struct {
	mu       sync.Mutex
	inFlight map[string]*forkSave // by source container ID, while its save runs
}

// forkSave is one save of a source, and the fork starts that use it.
type forkSave struct {
	done     chan struct{}
	snapshot string
	err      error
	users    int // under forkSaves.mu
}

// saveForkSource saves the source's VM for a fork start, or joins the save of it under way. The
// caller clones the save, then calls release.
func (s *Runtime) saveForkSource(ctx context.Context, sourceID string) (*forkSave, func(), error) {
	f := &s.forks
	f.mu.Lock()
	save := f.inFlight[sourceID]
	if save == nil {
		save = &forkSave{done: make(chan struct{})}
		if f.inFlight == nil {
			f.inFlight = map[string]*forkSave{}
		}
		f.inFlight[sourceID] = save
		go s.runForkSave(context.WithoutCancel(ctx), sourceID, save)
	}
	save.users++
	f.mu.Unlock()
	release := func() {
		f.mu.Lock()
		save.users--
		last := save.users == 0
		f.mu.Unlock()
		if last && save.err == nil {
			s.removeSnapshot(ctx, save.snapshot, "a fork")
		}
	}
	select {
	case <-save.done:
	case <-ctx.Done():
		release()
		return nil, nil, ctx.Err()
	}
	if save.err != nil {
		release()
		return nil, nil, save.err
	}
	return save, release, nil
}

// runForkSave saves the source's VM. Forks that start after it ended make a save of their own: a
// fork copies its source as it is when the fork starts. The save is a use of the source, as an
// exec is: a hibernated source wakes for it, and none hibernates while it runs.
func (s *Runtime) runForkSave(ctx context.Context, sourceID string, save *forkSave) {
	defer func() {
		s.forks.mu.Lock()
		delete(s.forks.inFlight, sourceID)
		s.forks.mu.Unlock()
		close(save.done)
	}()
	done, err := s.inUse(ctx, sourceID)
	if err != nil {
		save.err = err
		return
	}
	defer done()
	src, err := s.store.Containers.Get(sourceID)
	if err != nil || src.State != store.ContainerRunning || src.VM.Hibernated() {
		save.err = precondition("the fork's source container %s no longer runs awake", sourceID)
		return
	}
	name, err := snapshotName(forkSnapshotPrefix, sourceID)
	if err != nil {
		save.err = err
		return
	}
	ctx, cancel := context.WithTimeout(ctx, DefaultCheckpointTimeout)
	defer cancel()
	if _, err := s.cocoon.SnapshotSave(ctx, src.VM.ID, name, "fork of container "+sourceID); err != nil {
		save.err = fmt.Errorf("save the fork's source VM %s: %w", src.VM.ID, err)
		s.removeSnapshot(ctx, name, "a fork")
		return
	}
	save.snapshot = name
}

// removeForkLeftovers deletes the fork saves a restart cut short: forks clone with their memory
// copied, so no VM needs one once its start is over.
func (s *Runtime) removeForkLeftovers(ctx context.Context) {
	snaps, err := s.cocoon.SnapshotList(ctx)
	if err != nil {
		s.log.Warn("cannot list cocoon's snapshots to find what interrupted forks left", "err", err)
		return
	}
	for _, snap := range snaps {
		if strings.HasPrefix(snap.Name, forkSnapshotPrefix) {
			s.log.Info("removing the save of an interrupted fork", "snapshot", snap.Name)
			s.removeSnapshot(ctx, snap.Name, "an interrupted fork")
		}
	}
}
