package vmruntime

import (
	"context"
	"strings"

	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"

	"github.com/cocoonstack/cocoon-cri/pkg/store"
)

// ListPodSandbox answers from the store. The ID filter accepts a prefix, like crictl's short IDs.
func (s *Runtime) ListPodSandbox(_ context.Context, req *runtimeapi.ListPodSandboxRequest) (*runtimeapi.ListPodSandboxResponse, error) {
	return &runtimeapi.ListPodSandboxResponse{Items: s.listSandboxes(req.GetFilter())}, nil
}

// StreamPodSandboxes sends the same list as ListPodSandbox, in one message.
func (s *Runtime) StreamPodSandboxes(req *runtimeapi.StreamPodSandboxesRequest, stream runtimeapi.RuntimeService_StreamPodSandboxesServer) error {
	return stream.Send(&runtimeapi.StreamPodSandboxesResponse{PodSandboxes: s.listSandboxes(req.GetFilter())})
}

func (s *Runtime) listSandboxes(f *runtimeapi.PodSandboxFilter) []*runtimeapi.PodSandbox {
	records := s.store.Sandboxes.List(func(sb *store.Sandbox) bool {
		if sb.State == store.SandboxCreating {
			return false
		}
		if f.GetId() != "" && !strings.HasPrefix(sb.ID, f.GetId()) {
			return false
		}
		if f.GetState() != nil && f.GetState().GetState() != sandboxState(sb.State) {
			return false
		}
		return matchLabels(sb.Config.Msg.GetLabels(), f.GetLabelSelector())
	})
	items := make([]*runtimeapi.PodSandbox, 0, len(records))
	for _, sb := range records {
		cfg := sb.Config.Msg
		items = append(items, &runtimeapi.PodSandbox{
			Id:             sb.ID,
			Metadata:       cfg.GetMetadata(),
			State:          sandboxState(sb.State),
			CreatedAt:      sb.CreatedAt,
			Labels:         cfg.GetLabels(),
			Annotations:    cfg.GetAnnotations(),
			RuntimeHandler: sb.RuntimeHandler,
		})
	}
	return items
}

// matchLabels reports whether labels contain every pair of the selector.
func matchLabels(labels, selector map[string]string) bool {
	for k, v := range selector {
		if got, ok := labels[k]; !ok || got != v {
			return false
		}
	}
	return true
}
