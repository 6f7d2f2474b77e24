package vmruntime

import (
	"context"
	"strings"

	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"

	"github.com/cocoonstack/cocoon-cri/pkg/store"
)

// ListContainers answers from the store. ID filters accept prefixes.
func (s *Runtime) ListContainers(_ context.Context, req *runtimeapi.ListContainersRequest) (*runtimeapi.ListContainersResponse, error) {
	return &runtimeapi.ListContainersResponse{Containers: s.listContainers(req.GetFilter())}, nil
}

// StreamContainers sends the same list as ListContainers, in one message.
func (s *Runtime) StreamContainers(req *runtimeapi.StreamContainersRequest, stream runtimeapi.RuntimeService_StreamContainersServer) error {
	return stream.Send(&runtimeapi.StreamContainersResponse{Containers: s.listContainers(req.GetFilter())})
}

func (s *Runtime) listContainers(f *runtimeapi.ContainerFilter) []*runtimeapi.Container {
	records := s.store.Containers.List(func(c *store.Container) bool {
		if f.GetId() != "" && !strings.HasPrefix(c.ID, f.GetId()) {
			return false
		}
		if f.GetPodSandboxId() != "" && !strings.HasPrefix(c.SandboxID, f.GetPodSandboxId()) {
			return false
		}
		if f.GetState() != nil && f.GetState().GetState() != containerState(c.State) {
			return false
		}
		return matchLabels(c.Config.Msg.GetLabels(), f.GetLabelSelector())
	})
	out := make([]*runtimeapi.Container, 0, len(records))
	for _, c := range records {
		cfg := c.Config.Msg
		out = append(out, &runtimeapi.Container{
			Id:           c.ID,
			PodSandboxId: c.SandboxID,
			Metadata:     cfg.GetMetadata(),
			Image:        &runtimeapi.ImageSpec{Image: c.ImageRef, UserSpecifiedImage: c.ImageRef},
			ImageRef:     c.ImageID,
			ImageId:      c.ImageID,
			State:        containerState(c.State),
			CreatedAt:    c.CreatedAt,
			Labels:       cfg.GetLabels(),
			Annotations:  cfg.GetAnnotations(),
		})
	}
	return out
}
