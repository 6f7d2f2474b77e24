package vmruntime

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"time"

	"github.com/containerd/errdefs"

	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"

	"github.com/cocoonstack/cocoon-cri/pkg/checkpoint"
	"github.com/cocoonstack/cocoon-cri/pkg/store"
)

// CheckpointPod checkpoints a running VM pod into output_path: pod.json and one archive per
// container. A pod of one VM is one consistent cut: cocoon pauses the VM for the capture and
// resumes it before the call returns, on failure too. cocoon has no command that pauses a VM
// without saving it, so a pod whose containers are several VMs cannot be cut at one instant, and
// is refused rather than captured one VM after another.
func (s *Runtime) CheckpointPod(ctx context.Context, req *runtimeapi.CheckpointPodRequest) (*runtimeapi.CheckpointPodResponse, error) {
	if req.GetPodSandboxId() == "" {
		return nil, invalid("pod sandbox ID is required")
	}
	for key := range req.GetOptions() {
		return nil, invalid("unknown checkpoint option %q: cocoon-cri takes no CheckpointPod options", key)
	}
	dir := req.GetOutputPath()
	if err := checkEmptyDir(dir); err != nil {
		return nil, err
	}
	ids := req.GetContainerIds()
	if len(ids) == 0 {
		return nil, invalid("container_ids must name the pod's running containers")
	}
	if _, ok := ctx.Deadline(); !ok {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, DefaultCheckpointTimeout)
		defer cancel()
	}

	sb, unlock, err := s.lockSandbox(req.GetPodSandboxId())
	if err != nil {
		return nil, err
	}
	defer unlock()
	if sb.State != store.SandboxReady {
		return nil, precondition("pod sandbox %s is not ready: only a running pod can be checkpointed", sb.ID)
	}
	members, err := s.selectedContainers(sb, ids)
	if err != nil {
		return nil, err
	}
	if len(members) > 1 {
		return nil, errdefs.ErrNotImplemented.WithMessage(fmt.Sprintf("pod sandbox %s has %d containers, each its own VM, and cocoon cannot pause several VMs for one cut; checkpoint each container with CheckpointContainer (crictl checkpoint)", sb.ID, len(members)))
	}

	start := time.Now()
	if err := s.writePodCheckpoint(ctx, sb, members, dir); err != nil {
		return nil, fmt.Errorf("checkpoint pod %s: %w", sb.ID, err)
	}
	s.log.Info("pod checkpointed", "sandbox", sb.ID, "dir", dir, "containers", len(members), "took", time.Since(start))
	return &runtimeapi.CheckpointPodResponse{}, nil
}

// checkEmptyDir refuses an output path that is not an absolute path of an existing empty
// directory.
func checkEmptyDir(dir string) error {
	if dir == "" || !filepath.IsAbs(dir) || filepath.Clean(dir) != dir {
		return invalid("output_path %q must be a clean absolute path of an empty directory", dir)
	}
	entries, err := os.ReadDir(dir)
	if err != nil {
		return invalid("output_path %s: %v", dir, err)
	}
	if len(entries) > 0 {
		return invalid("output_path %s is not empty", dir)
	}
	return nil
}

// selectedContainers checks that ids, without duplicates, are exactly the sandbox's running
// containers, and returns them.
func (s *Runtime) selectedContainers(sb *store.Sandbox, ids []string) ([]*store.Container, error) {
	var running []*store.Container
	for _, c := range s.sandboxContainers(sb.ID) {
		if c.State == store.ContainerRunning {
			running = append(running, c)
		}
	}
	seen := map[string]bool{}
	var selected []*store.Container
	for _, id := range ids {
		i := slices.IndexFunc(running, func(c *store.Container) bool { return c.ID == id })
		switch {
		case seen[id]:
			return nil, invalid("container %s is listed twice", id)
		case i < 0:
			return nil, invalid("container %s is not a running container of pod sandbox %s", id, sb.ID)
		}
		seen[id] = true
		selected = append(selected, running[i])
	}
	if len(selected) != len(running) {
		return nil, invalid("container_ids name %d of the %d running containers of pod sandbox %s: a pod checkpoint takes them all", len(selected), len(running), sb.ID)
	}
	return selected, nil
}

// writePodCheckpoint writes each container's archive, then pod.json. On failure it removes what
// it wrote, and only that: the directory is the caller's.
func (s *Runtime) writePodCheckpoint(ctx context.Context, sb *store.Sandbox, members []*store.Container, dir string) (err error) {
	caps, err := s.cocoon.Capabilities(ctx)
	if err != nil {
		return fmt.Errorf("learn how this cocoon exports a snapshot: %w", err)
	}
	// Noted before anything is written, until pod.json is, or what was written is removed: a
	// crash in between leaves nothing in the caller's directory once cocoon-cri is back, as a
	// failure leaves nothing now.
	outputs := []string{filepath.Join(dir, checkpoint.PodFile)}
	for _, c := range members {
		outputs = append(outputs, filepath.Join(dir, c.ID), filepath.Join(dir, c.ID+".tar"))
	}
	noted, err := s.notePodCheckpoint(sb.ID, outputs)
	if err != nil {
		return fmt.Errorf("note the checkpoint in the journal: %w", err)
	}
	defer noted()
	var written []string
	defer func() {
		if err != nil {
			for _, path := range written {
				_ = os.RemoveAll(path)
			}
		}
	}()
	pc := checkpoint.PodCheckpoint{
		Version: checkpoint.FormatVersion, CreatedAt: s.nowFunc().UTC(), RuntimeHandler: sb.RuntimeHandler,
		Pod: checkpoint.Pod{
			Name: sb.Config.Msg.GetMetadata().GetName(), Namespace: sb.Config.Msg.GetMetadata().GetNamespace(),
			UID: sb.Config.Msg.GetMetadata().GetUid(), SandboxID: sb.ID,
		},
	}
	for _, c := range members {
		if err := checkpointable(c); err != nil {
			return err
		}
		// The kubelet matches containers by their metadata name (c.Name is cocoon-cri's longer one).
		name := c.Config.Msg.GetMetadata().GetName()
		// Named by ID: a metadata name from a direct CRI caller need not be a safe file name.
		if caps.SnapshotDirs {
			path := filepath.Join(dir, c.ID)
			md, err := s.writeCheckpointDir(ctx, sb, c, path)
			if err != nil {
				return fmt.Errorf("container %s: %w", c.ID, err)
			}
			written = append(written, path)
			pc.Containers = append(pc.Containers, checkpoint.PodMember{Name: name, Snapshot: c.ID, Metadata: md})
			continue
		}
		archive := c.ID + ".tar"
		path := filepath.Join(dir, archive)
		if _, err := s.writeCheckpoint(ctx, sb, c, path); err != nil {
			return fmt.Errorf("container %s: %w", c.ID, err)
		}
		written = append(written, path)
		pc.Containers = append(pc.Containers, checkpoint.PodMember{Name: name, Archive: archive})
	}
	data, err := json.MarshalIndent(pc, "", "  ")
	if err != nil {
		return err
	}
	path := filepath.Join(dir, checkpoint.PodFile)
	written = append(written, path)
	return writeFileSynced(path, data)
}

func writeFileSynced(path string, data []byte) error {
	f, err := os.OpenFile(path, os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o600)
	if err != nil {
		return err
	}
	_, err = f.Write(data)
	if err == nil {
		err = f.Sync()
	}
	if closeErr := f.Close(); err == nil {
		err = closeErr
	}
	return err
}
