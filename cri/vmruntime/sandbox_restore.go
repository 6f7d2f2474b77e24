package vmruntime

import (
	"bufio"
	"cmp"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"time"

	"google.golang.org/protobuf/proto"
	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"

	"github.com/cocoonstack/cocoon-cri/imagestore"
	"github.com/cocoonstack/cocoon-cri/pkg/checkpoint"
	"github.com/cocoonstack/cocoon-cri/pkg/cocoon"
)

// checkpointRepository is the image repository a restored container's checkpoint is recorded
// under, tagged with the archive's digest.
const checkpointRepository = "cocoon-cri.local/checkpoint"

// restoreMember is one container of a pod checkpoint, checked against the request: its archive,
// or its snapshot directory with that directory's snapshot.json.
type restoreMember struct {
	config   *runtimeapi.ContainerConfig
	archive  string
	snapshot string
	// envelope is the directory's snapshot.json, as read and as decoded.
	envelope    []byte
	snapshotCfg cocoon.SnapshotConfig
	meta        *checkpoint.Metadata
}

// RestorePod makes a new pod from a pod checkpoint directory: a new sandbox (its own network
// namespace, IP and MAC), and one container per checkpointed container, CREATED, whose image is
// the container's checkpoint, made while the sandbox is: its snapshot directory recorded as it
// is, or its archive imported into cocoon. StartContainer clones it, which resumes the saved
// machine under the new pod's identity. The checkpoint directory is only read. On error nothing of
// the call is left.
func (s *Runtime) RestorePod(ctx context.Context, req *runtimeapi.RestorePodRequest) (*runtimeapi.RestorePodResponse, error) {
	if req.GetConfig() == nil {
		return nil, invalid("pod sandbox config is required")
	}
	for key := range req.GetOptions() {
		return nil, invalid("unknown restore option %q: cocoon-cri takes no RestorePod options", key)
	}
	if _, ok := ctx.Deadline(); !ok {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, DefaultCheckpointTimeout)
		defer cancel()
	}
	members, err := readPodCheckpoint(req.GetCheckpointPath(), req.GetContainerConfigs())
	if err != nil {
		return nil, err
	}
	if err := s.checkCanCloneDirs(ctx, members); err != nil {
		return nil, err
	}
	start := time.Now()
	// The checkpoint's images and the new sandbox do not wait on each other: they are made at once.
	refs := make([]string, len(members))
	imported := make(chan error, 1)
	go func() {
		for i, m := range members {
			ref, err := s.checkpointImage(ctx, m)
			if err != nil {
				imported <- fmt.Errorf("restore container %s: %w", m.config.GetMetadata().GetName(), err)
				return
			}
			refs[i] = ref
		}
		imported <- nil
	}()
	run, err := s.RunPodSandbox(ctx, &runtimeapi.RunPodSandboxRequest{Config: req.GetConfig(), RuntimeHandler: req.GetRuntimeHandler()})
	importErr := <-imported
	switch {
	case err != nil:
		return nil, err
	case importErr != nil:
		s.discardRestoredSandbox(ctx, run.GetPodSandboxId())
		return nil, importErr
	}
	resp := &runtimeapi.RestorePodResponse{PodSandboxId: run.GetPodSandboxId()}
	for i, m := range members {
		cfg := proto.Clone(m.config).(*runtimeapi.ContainerConfig)
		cfg.Image = &runtimeapi.ImageSpec{Image: refs[i]}
		created, err := s.CreateContainer(ctx, &runtimeapi.CreateContainerRequest{
			PodSandboxId: run.GetPodSandboxId(), Config: cfg, SandboxConfig: req.GetConfig(),
		})
		if err != nil {
			s.discardRestoredSandbox(ctx, run.GetPodSandboxId())
			return nil, fmt.Errorf("restore container %s: %w", cfg.GetMetadata().GetName(), err)
		}
		resp.RestoredContainers = append(resp.RestoredContainers, &runtimeapi.RestoredContainer{
			Name: cfg.GetMetadata().GetName(), ContainerId: created.GetContainerId(),
		})
	}
	s.log.Info("pod restored", "sandbox", resp.PodSandboxId, "from", req.GetCheckpointPath(), "containers", len(members), "took", time.Since(start))
	return resp, nil
}

// readPodCheckpoint reads a pod checkpoint directory and matches its containers with the
// request's configurations, by name, one for one, each of the image it was checkpointed from.
func readPodCheckpoint(dir string, configs []*runtimeapi.ContainerConfig) ([]restoreMember, error) {
	if dir == "" || !filepath.IsAbs(dir) {
		return nil, invalid("checkpoint_path %q must be an absolute path of a pod checkpoint directory", dir)
	}
	pc, err := checkpoint.ReadPod(dir)
	switch {
	case errors.Is(err, checkpoint.ErrInvalid):
		return nil, invalid("%v", err)
	case err != nil:
		return nil, invalid("%s is not a cocoon-cri pod checkpoint: %v", dir, err)
	}
	if len(configs) == 0 {
		return nil, invalid("container_configs must configure the checkpoint's containers")
	}
	var names []string
	for _, c := range pc.Containers {
		names = append(names, c.Name)
	}
	members := make([]restoreMember, 0, len(configs))
	seen := map[string]bool{}
	for _, cfg := range configs {
		name := cfg.GetMetadata().GetName()
		i := slices.IndexFunc(pc.Containers, func(c checkpoint.PodMember) bool { return c.Name == name })
		switch {
		case name == "":
			return nil, invalid("every container config needs a metadata name")
		case seen[name]:
			return nil, invalid("container %q is configured twice", name)
		case i < 0:
			return nil, invalid("container %q is not in the checkpoint, which holds %v", name, names)
		}
		seen[name] = true
		m, err := readPodCheckpointMember(dir, pc.Containers[i])
		if err != nil {
			return nil, err
		}
		m.config = cfg
		if img := cfg.GetImage().GetImage(); img != "" && !sameImage(img, m.meta.Container) {
			return nil, invalid("container %q is configured with image %s, but the checkpoint ran %s", name, img, m.meta.Container.Image)
		}
		members = append(members, m)
	}
	if len(members) != len(pc.Containers) {
		return nil, invalid("container_configs name %d of the checkpoint's %d containers %v: configure them all", len(members), len(pc.Containers), names)
	}
	return members, nil
}

// readPodCheckpointMember reads what a pod checkpoint holds of one container: its archive, or its
// snapshot directory and the metadata pod.json gives it.
func readPodCheckpointMember(dir string, pm checkpoint.PodMember) (restoreMember, error) {
	var m restoreMember
	entry := cmp.Or(pm.Archive, pm.Snapshot)
	switch {
	case (pm.Archive == "") == (pm.Snapshot == ""):
		return m, invalid("%s: container %q must name an archive or a snapshot directory", checkpoint.PodFile, pm.Name)
	case entry != filepath.Base(entry) || entry == "." || entry == "..":
		return m, invalid("%s names %q outside its directory", checkpoint.PodFile, entry)
	case pm.Archive != "":
		m.archive = filepath.Join(dir, pm.Archive)
		md, err := readArchiveMetadata(m.archive)
		m.meta = md
		return m, err
	case pm.Metadata == nil || pm.Metadata.Version != checkpoint.FormatVersion:
		return m, invalid("%s: container %q has no checkpoint metadata of version %d", checkpoint.PodFile, pm.Name, checkpoint.FormatVersion)
	}
	m.snapshot, m.meta = filepath.Join(dir, pm.Snapshot), pm.Metadata
	data, err := os.ReadFile(filepath.Join(m.snapshot, snapshotEnvelopeFile))
	if err != nil {
		return m, invalid("%s is not a snapshot directory: %v", m.snapshot, err)
	}
	var envelope cocoon.SnapshotExport
	if err := json.Unmarshal(data, &envelope); err != nil || envelope.Version != cocoon.SnapshotExportVersion {
		return m, invalid("%s is not a snapshot directory: its %s is not a snapshot envelope of version %d", m.snapshot, snapshotEnvelopeFile, cocoon.SnapshotExportVersion)
	}
	if hv := cmp.Or(envelope.Config.Hypervisor, cocoon.HypervisorCloudHypervisor); hv != m.meta.Hypervisor {
		return m, invalid("%s holds a snapshot taken under %s, but the checkpoint's metadata says %s", m.snapshot, hv, m.meta.Hypervisor)
	}
	m.envelope, m.snapshotCfg = data, envelope.Config
	return m, nil
}

// snapshotEnvelopeFile describes a snapshot directory: cocoon's snapshot.json, written last.
const snapshotEnvelopeFile = "snapshot.json"

// checkCanCloneDirs refuses a checkpoint of snapshot directories where cocoon cannot clone one.
func (s *Runtime) checkCanCloneDirs(ctx context.Context, members []restoreMember) error {
	if !slices.ContainsFunc(members, func(m restoreMember) bool { return m.snapshot != "" }) {
		return nil
	}
	caps, err := s.cocoon.Capabilities(ctx)
	if err != nil {
		return fmt.Errorf("learn whether this cocoon clones snapshot directories: %w", err)
	}
	if !caps.SnapshotDirs {
		return precondition("the checkpoint holds its containers as snapshot directories, which cocoon %s cannot clone "+
			"(vm clone --from-dir came with v0.3.9): restore it on a node with a newer cocoon", caps.Version)
	}
	return nil
}

// sameImage reports whether a restore's image names the image the checkpointed container ran: its
// reference (short or normalized) or its ID.
func sameImage(image string, c checkpoint.Container) bool {
	if image == c.Image || image == c.ImageRef {
		return true
	}
	got, err1 := imagestore.Normalize(image)
	want, err2 := imagestore.Normalize(c.Image)
	return err1 == nil && err2 == nil && got == want
}

// readArchiveMetadata reads the metadata entry of a container's checkpoint archive.
func readArchiveMetadata(path string) (*checkpoint.Metadata, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, invalid("checkpoint archive: %v", err)
	}
	defer f.Close()
	md, err := checkpoint.Read(bufio.NewReader(f))
	switch {
	case errors.Is(err, checkpoint.ErrInvalid):
		return nil, invalid("%s: %v", path, err)
	case err != nil:
		return nil, fmt.Errorf("read %s: %w", path, err)
	case md == nil:
		return nil, invalid("%s is not a cocoon-cri checkpoint archive", path)
	}
	return md, nil
}

// checkpointImage makes a container's checkpoint an image and returns its reference: its snapshot
// directory recorded in place, or its archive imported into cocoon, once per content.
func (s *Runtime) checkpointImage(ctx context.Context, m restoreMember) (string, error) {
	if m.snapshot == "" {
		return s.importCheckpoint(ctx, m.archive)
	}
	// The directory's gigabytes are not read: the image is named by what describes them, the
	// checkpoint's metadata (its container, its time) and cocoon's envelope (its snapshot's ID).
	meta, err := json.Marshal(m.meta)
	if err != nil {
		return "", err
	}
	sum := sha256.Sum256(append(append(meta, '\n'), m.envelope...))
	id := "sha256:" + hex.EncodeToString(sum[:])
	ref := checkpointRepository + ":sha256-" + id[len("sha256:"):]
	if _, err := s.images.RegisterSnapshotDir(ctx, ref, id, m.snapshot, m.snapshotCfg); err != nil {
		return "", fmt.Errorf("record %s: %w", m.snapshot, err)
	}
	return ref, nil
}

// importCheckpoint brings a container's checkpoint archive in as an image, once per content, and
// returns its reference.
func (s *Runtime) importCheckpoint(ctx context.Context, path string) (string, error) {
	digest, err := s.archives.digest(path, s.nowFunc())
	if err != nil {
		return "", err
	}
	ref := checkpointRepository + ":sha256-" + digest[len("sha256:"):]
	f, err := os.Open(path)
	if err != nil {
		return "", err
	}
	defer f.Close()
	if _, err := s.images.Import(ctx, ref, digest, f); err != nil {
		return "", fmt.Errorf("import %s: %w", path, err)
	}
	return ref, nil
}

// discardRestoredSandbox removes the sandbox of a restore that failed, with its containers. The
// caller's context may be what failed, so the removal gets its own.
func (s *Runtime) discardRestoredSandbox(ctx context.Context, id string) {
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 2*time.Minute)
	defer cancel()
	if _, err := s.StopPodSandbox(ctx, &runtimeapi.StopPodSandboxRequest{PodSandboxId: id}); err != nil {
		s.log.Error("could not stop the sandbox of a failed restore", "sandbox", id, "err", err)
		return
	}
	if _, err := s.RemovePodSandbox(ctx, &runtimeapi.RemovePodSandboxRequest{PodSandboxId: id}); err != nil {
		s.log.Error("could not remove the sandbox of a failed restore", "sandbox", id, "err", err)
	}
}
