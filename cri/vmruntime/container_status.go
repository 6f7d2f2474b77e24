package vmruntime

import (
	"context"

	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"

	"github.com/cocoonstack/cocoon-cri/pkg/store"
)

// ContainerStatus answers from the store.
func (s *Runtime) ContainerStatus(_ context.Context, req *runtimeapi.ContainerStatusRequest) (*runtimeapi.ContainerStatusResponse, error) {
	c, err := s.findContainer(req.GetContainerId())
	if err != nil {
		return nil, err
	}
	st := containerStatus(c)
	if img, err := s.images.Get(c.ImageID); err == nil {
		st.Image = &runtimeapi.ImageSpec{Image: firstOr(img.RepoTags, c.ImageRef), UserSpecifiedImage: c.ImageRef}
		st.ImageRef = firstOr(img.RepoDigests, img.ID)
	}
	resp := &runtimeapi.ContainerStatusResponse{Status: st}
	if req.GetVerbose() {
		info := containerInfo{SandboxID: c.SandboxID, VM: c.VM, Config: c.Config.Msg}
		if cio := s.ioOf(c.ID); cio != nil {
			info.ConsoleTail = cio.console.Tail()
		}
		if sb, err := s.store.Sandboxes.Get(c.SandboxID); err == nil && c.State == store.ContainerRunning {
			info.Hibernation = s.hibernationInfo(sb, c)
		}
		if resp.Info, err = verboseInfo(info); err != nil {
			return nil, err
		}
	}
	return resp, nil
}

// containerInfo is the verbose status, for people debugging a container.
type containerInfo struct {
	SandboxID string                      `json:"sandboxID"`
	VM        store.VM                    `json:"vm"`
	Config    *runtimeapi.ContainerConfig `json:"config"`
	// ConsoleTail is the VM console's latest output, for a look at what the guest printed.
	ConsoleTail string `json:"consoleTail,omitempty"`
	// Hibernation is shown for a running container whose pod may hibernate.
	Hibernation *hibernationInfo `json:"hibernation,omitempty"`
}

func containerStatus(c *store.Container) *runtimeapi.ContainerStatus {
	cfg := c.Config.Msg
	return &runtimeapi.ContainerStatus{
		Id:          c.ID,
		Metadata:    cfg.GetMetadata(),
		State:       containerState(c.State),
		CreatedAt:   c.CreatedAt,
		StartedAt:   c.StartedAt,
		FinishedAt:  c.FinishedAt,
		ExitCode:    c.ExitCode,
		Image:       &runtimeapi.ImageSpec{Image: c.ImageRef, UserSpecifiedImage: c.ImageRef},
		ImageRef:    c.ImageID,
		ImageId:     c.ImageID,
		Reason:      c.Reason,
		Message:     c.Message,
		Labels:      cfg.GetLabels(),
		Annotations: cfg.GetAnnotations(),
		Mounts:      cfg.GetMounts(),
		LogPath:     c.LogPath,
		Resources:   &runtimeapi.ContainerResources{Linux: cfg.GetLinux().GetResources()},
	}
}

func containerState(st store.ContainerState) runtimeapi.ContainerState {
	switch st {
	case store.ContainerCreated:
		return runtimeapi.ContainerState_CONTAINER_CREATED
	case store.ContainerRunning:
		return runtimeapi.ContainerState_CONTAINER_RUNNING
	case store.ContainerExited:
		return runtimeapi.ContainerState_CONTAINER_EXITED
	}
	return runtimeapi.ContainerState_CONTAINER_UNKNOWN
}

func firstOr(values []string, fallback string) string {
	if len(values) > 0 {
		return values[0]
	}
	return fallback
}

// findContainer resolves a container ID (or unique prefix) to its record.
func (s *Runtime) findContainer(idOrPrefix string) (*store.Container, error) {
	if idOrPrefix == "" {
		return nil, invalid("container ID is required")
	}
	id, err := s.store.Containers.Resolve(idOrPrefix)
	if err != nil {
		return nil, err
	}
	return s.store.Containers.Get(id)
}
