package vmruntime

import (
	"bufio"
	"context"
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
)

// checkpointRepository is the image repository a restored container's checkpoint is recorded
// under, tagged with the archive's digest.
const checkpointRepository = "cocoon-cri.local/checkpoint"

// restoreMember is one container of a pod checkpoint, checked against the request.
type restoreMember struct {
	config  *runtimeapi.ContainerConfig
	archive string
	meta    *checkpoint.Metadata
}

// RestorePod makes a new pod from a pod checkpoint directory: a new sandbox (its own network
// namespace, IP and MAC), and one container per checkpointed container, CREATED, whose image is
// the container's checkpoint, imported while the sandbox is made. StartContainer clones it, which resumes the saved machine under the
// new pod's identity. The checkpoint directory is only read. On error nothing of the call is left.
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
	start := time.Now()
	// The archives' import and the new sandbox do not wait on each other: they are made at once.
	refs := make([]string, len(members))
	imported := make(chan error, 1)
	go func() {
		for i, m := range members {
			ref, err := s.importCheckpoint(ctx, m.archive)
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
	data, err := os.ReadFile(filepath.Join(dir, podCheckpointFile))
	if err != nil {
		return nil, invalid("%s is not a cocoon-cri pod checkpoint: %v", dir, err)
	}
	var pc podCheckpoint
	if err := json.Unmarshal(data, &pc); err != nil || pc.Version != checkpoint.FormatVersion || len(pc.Containers) == 0 {
		return nil, invalid("%s is not a cocoon-cri pod checkpoint of version %d: %s unreadable", dir, checkpoint.FormatVersion, podCheckpointFile)
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
		i := slices.IndexFunc(pc.Containers, func(c podCheckpointMember) bool { return c.Name == name })
		switch {
		case name == "":
			return nil, invalid("every container config needs a metadata name")
		case seen[name]:
			return nil, invalid("container %q is configured twice", name)
		case i < 0:
			return nil, invalid("container %q is not in the checkpoint, which holds %v", name, names)
		}
		seen[name] = true
		archive := pc.Containers[i].Archive
		if archive != filepath.Base(archive) || archive == "." || archive == ".." {
			return nil, invalid("%s names archive %q outside its directory", podCheckpointFile, archive)
		}
		m := restoreMember{config: cfg, archive: filepath.Join(dir, archive)}
		if m.meta, err = readArchiveMetadata(m.archive); err != nil {
			return nil, err
		}
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
