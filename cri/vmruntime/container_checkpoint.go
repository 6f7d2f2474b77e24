package vmruntime

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"time"

	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"

	"github.com/cocoonstack/cocoon-cri/pkg/checkpoint"
	"github.com/cocoonstack/cocoon-cri/pkg/cocoon"
	"github.com/cocoonstack/cocoon-cri/pkg/store"
)

// DefaultCheckpointTimeout bounds a checkpoint whose request sets no timeout: the save and export
// of a guest of several GiB take tens of seconds on a slow disk.
const DefaultCheckpointTimeout = 5 * time.Minute

// checkpointSnapshotPrefix names the cocoon snapshots a checkpoint makes and deletes again.
const checkpointSnapshotPrefix = "cri-ckpt-"

// CheckpointContainer saves a running container's VM, memory and disk, into one archive at the
// request's location. cocoon pauses the VM for the capture and resumes it, so the container keeps
// running; the archive is what `cocoon-cri image import` and a pull of a pushed checkpoint take.
func (s *Runtime) CheckpointContainer(ctx context.Context, req *runtimeapi.CheckpointContainerRequest) (*runtimeapi.CheckpointContainerResponse, error) {
	if req.GetContainerId() == "" {
		return nil, invalid("container ID is required")
	}
	location := req.GetLocation()
	if err := checkArchivePath(location); err != nil {
		return nil, err
	}
	timeout, err := checkpointTimeout(req.GetTimeout())
	if err != nil {
		return nil, err
	}
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()

	c, sb, unlock, err := s.lockContainer(req.GetContainerId())
	if err != nil {
		return nil, err
	}
	defer unlock()
	if err := checkpointable(c); err != nil {
		return nil, err
	}
	start := time.Now()
	size, err := s.writeCheckpoint(ctx, sb, c, location)
	if err != nil {
		return nil, fmt.Errorf("checkpoint container %s: %w", c.ID, err)
	}
	s.log.Info("container checkpointed", "container", c.ID, "location", location, "bytes", size, "took", time.Since(start))
	return &runtimeapi.CheckpointContainerResponse{}, nil
}

// checkArchivePath refuses a location that is not an absolute path of a new file.
func checkArchivePath(path string) error {
	if path == "" || !filepath.IsAbs(path) {
		return invalid("checkpoint location %q must be an absolute file path", path)
	}
	if filepath.Clean(path) != path {
		return invalid("checkpoint location %q must be a clean path (no . or .. elements, no trailing slash)", path)
	}
	return nil
}

// checkpointTimeout is the request's timeout in seconds, or the default for 0.
func checkpointTimeout(seconds int64) (time.Duration, error) {
	switch {
	case seconds < 0:
		return 0, invalid("checkpoint timeout %d is negative", seconds)
	case seconds == 0:
		return DefaultCheckpointTimeout, nil
	}
	return time.Duration(seconds) * time.Second, nil
}

// checkpointable refuses a container whose VM is not running.
func checkpointable(c *store.Container) error {
	if c.State != store.ContainerRunning || c.VM.ID == "" {
		return precondition("container %s is %s: only a running container can be checkpointed", c.ID, c.State)
	}
	if c.VM.Share.Attached {
		return precondition("container %s has directory volumes shared into its VM (virtio-fs), and cocoon refuses to snapshot a VM with a share attached (docs/checkpoint.md, what cannot be checkpointed)", c.ID)
	}
	// Every device a VM takes is a disk or a PCI device hot-attached at its start (attachDevices).
	if devs := c.Config.Msg.GetDevices(); len(devs) > 0 {
		return precondition("container %s has host devices hot-attached to its VM (%s), and cocoon refuses to snapshot a VM with a hot-attached disk or PCI device (docs/checkpoint.md, what cannot be checkpointed)", c.ID, devs[0].GetHostPath())
	}
	return nil
}

// writeCheckpoint saves c's VM and writes the archive to path, which must not exist. The archive
// is written beside it under a temporary name, noted in the journal, and linked to path once
// whole, so path never holds a partial archive and an existing file is never replaced. On failure
// nothing is left, and the snapshot cocoon made is deleted either way.
func (s *Runtime) writeCheckpoint(ctx context.Context, sb *store.Sandbox, c *store.Container, path string) (int64, error) {
	// Refused before the save, which is the expensive part; the link below is what makes sure.
	switch _, err := os.Lstat(path); {
	case err == nil:
		return 0, alreadyExists("%s exists: a checkpoint never overwrites a file", path)
	case !errors.Is(err, fs.ErrNotExist):
		return 0, fmt.Errorf("check %s: %w", path, err)
	}
	if info, err := os.Stat(filepath.Dir(path)); err != nil || !info.IsDir() {
		return 0, invalid("the directory of %s does not exist", path)
	}
	name, err := snapshotName(checkpointSnapshotPrefix, c.ID)
	if err != nil {
		return 0, err
	}
	partial := filepath.Join(filepath.Dir(path), "."+filepath.Base(path)+"."+name+".partial")
	noted, err := s.noteCheckpoint(name, partial)
	if err != nil {
		return 0, fmt.Errorf("note the checkpoint in the journal: %w", err)
	}
	defer noted()
	// A save cut short by the deadline may still have recorded the snapshot: delete it either way.
	defer s.removeSnapshot(ctx, name, "a checkpoint")
	f, err := os.OpenFile(partial, os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o600)
	if err != nil {
		return 0, fmt.Errorf("create %s: %w", partial, err)
	}
	size, err := s.saveInto(ctx, sb, c, f, name)
	if closeErr := f.Close(); err == nil {
		err = closeErr
	}
	if err == nil {
		if err = os.Link(partial, path); errors.Is(err, fs.ErrExist) {
			err = alreadyExists("%s exists: a checkpoint never overwrites a file", path)
		}
	}
	if rmErr := os.Remove(partial); rmErr != nil {
		s.log.Error("could not remove a checkpoint's temporary archive", "path", partial, "err", rmErr)
	}
	if err != nil {
		return 0, err
	}
	return size, nil
}

// saveInto snapshots c's VM under name and writes the checkpoint archive to f.
func (s *Runtime) saveInto(ctx context.Context, sb *store.Sandbox, c *store.Container, f *os.File, name string) (int64, error) {
	snap, err := s.saveVM(ctx, c, name)
	if err != nil {
		return 0, err
	}
	md := s.checkpointMetadata(ctx, sb, c, snap)
	if err := checkpoint.Write(f, md, func(w io.Writer) error { return s.cocoon.SnapshotExport(ctx, name, w) }); err != nil {
		return 0, fmt.Errorf("write archive: %w", err)
	}
	if err := f.Sync(); err != nil {
		return 0, fmt.Errorf("sync archive: %w", err)
	}
	info, err := f.Stat()
	if err != nil {
		return 0, err
	}
	return info.Size(), nil
}

// saveVM snapshots c's VM under name for a checkpoint.
func (s *Runtime) saveVM(ctx context.Context, c *store.Container, name string) (*cocoon.Snapshot, error) {
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	// The guest is paused inside the save, and cocoon resumes it at its end: a save killed at the
	// caller's deadline would leave the VM frozen. So the save runs to its end, bounded only by
	// the caller's deadline or the default, whichever is later, and a deadline that passed
	// meanwhile fails the call after.
	bound := DefaultCheckpointTimeout
	if deadline, ok := ctx.Deadline(); ok {
		bound = max(bound, time.Until(deadline))
	}
	saveCtx, cancel := context.WithTimeout(context.WithoutCancel(ctx), bound)
	defer cancel()
	snap, err := s.cocoon.SnapshotSave(saveCtx, c.VM.ID, name, "cocoon-cri checkpoint of container "+c.ID)
	if err != nil {
		return nil, fmt.Errorf("save VM %s: %w", c.VM.ID, err)
	}
	if err := ctx.Err(); err != nil {
		return nil, fmt.Errorf("saved VM %s after the deadline: %w", c.VM.ID, err)
	}
	return snap, nil
}

// snapshotName names a snapshot cocoon-cri makes of a container's VM: its kind's prefix, the
// container ID's first 12 characters and a random part.
func snapshotName(prefix, containerID string) (string, error) {
	var b [4]byte
	if _, err := rand.Read(b[:]); err != nil {
		return "", err
	}
	return prefix + containerID[:min(12, len(containerID))] + "-" + hex.EncodeToString(b[:]), nil
}

// removeSnapshot deletes a snapshot cocoon-cri made (of a checkpoint or a hibernation, as what
// says) once it is no longer needed. The caller's context may be what failed, so the deletion
// gets its own.
func (s *Runtime) removeSnapshot(ctx context.Context, name, what string) {
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), cocoon.DefaultTimeout)
	defer cancel()
	if err := s.cocoon.SnapshotRemove(ctx, name); err != nil && !isNotFound(err) {
		s.log.Error("could not delete the snapshot of "+what+"; delete it with cocoon snapshot rm", "snapshot", name, "err", err)
	}
}

// checkpointMetadata describes what the archive holds: the pod, the container and its image, and
// the VM as cocoon saved it.
func (s *Runtime) checkpointMetadata(ctx context.Context, sb *store.Sandbox, c *store.Container, snap *cocoon.Snapshot) *checkpoint.Metadata {
	podMeta := sb.Config.Msg.GetMetadata()
	md := &checkpoint.Metadata{
		Version:   checkpoint.FormatVersion,
		CreatedAt: s.nowFunc().UTC(),
		Pod: checkpoint.Pod{
			Name: podMeta.GetName(), Namespace: podMeta.GetNamespace(), UID: podMeta.GetUid(), SandboxID: sb.ID,
		},
		Container: checkpoint.Container{
			Name: c.Config.Msg.GetMetadata().GetName(), ID: c.ID, Image: c.Config.Msg.GetImage().GetImage(), ImageRef: c.ImageRef,
		},
		Hypervisor: snap.Hypervisor, BaseImage: snap.Image,
		CPU: snap.CPU, MemoryBytes: snap.Memory, StorageBytes: snap.Storage,
	}
	if md.Hypervisor == "" {
		md.Hypervisor = cocoon.HypervisorCloudHypervisor
	}
	if caps, err := s.cocoon.Capabilities(ctx); err == nil {
		md.CocoonVersion = caps.Version
	}
	return md
}
