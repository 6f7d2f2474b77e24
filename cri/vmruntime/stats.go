package vmruntime

import (
	"context"
	"runtime"
	"strings"
	"sync"
	"sync/atomic"

	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"

	"github.com/cocoonstack/cocoon-cri/pkg/store"
)

// The stats RPCs: what to answer for, chosen from the store; the statsCollector reads it.

// ContainerStats answers for one container.
func (s *Runtime) ContainerStats(_ context.Context, req *runtimeapi.ContainerStatsRequest) (*runtimeapi.ContainerStatsResponse, error) {
	c, err := s.findContainer(req.GetContainerId())
	if err != nil {
		return nil, err
	}
	return &runtimeapi.ContainerStatsResponse{Stats: s.stats.container(c, s.now()).stats}, nil
}

// ListContainerStats answers for every container the filter selects. ID filters accept prefixes.
func (s *Runtime) ListContainerStats(_ context.Context, req *runtimeapi.ListContainerStatsRequest) (*runtimeapi.ListContainerStatsResponse, error) {
	return &runtimeapi.ListContainerStatsResponse{Stats: s.listContainerStats(req.GetFilter())}, nil
}

// StreamContainerStats sends the same list as ListContainerStats, in one message.
func (s *Runtime) StreamContainerStats(req *runtimeapi.StreamContainerStatsRequest, stream runtimeapi.RuntimeService_StreamContainerStatsServer) error {
	return stream.Send(&runtimeapi.StreamContainerStatsResponse{ContainerStats: s.listContainerStats(req.GetFilter())})
}

func (s *Runtime) listContainerStats(f *runtimeapi.ContainerStatsFilter) []*runtimeapi.ContainerStats {
	records := s.store.Containers.List(func(c *store.Container) bool {
		if f.GetId() != "" && !strings.HasPrefix(c.ID, f.GetId()) {
			return false
		}
		if f.GetPodSandboxId() != "" && !strings.HasPrefix(c.SandboxID, f.GetPodSandboxId()) {
			return false
		}
		return matchLabels(c.Config.Msg.GetLabels(), f.GetLabelSelector())
	})
	now := s.now()
	out := make([]*runtimeapi.ContainerStats, len(records))
	inParallel(len(records), func(i int) { out[i] = s.stats.container(records[i], now).stats })
	s.stats.forgetRemoved()
	return out
}

// PodSandboxStats answers for one sandbox.
func (s *Runtime) PodSandboxStats(_ context.Context, req *runtimeapi.PodSandboxStatsRequest) (*runtimeapi.PodSandboxStatsResponse, error) {
	sb, err := s.visibleSandbox(req.GetPodSandboxId())
	if err != nil {
		return nil, err
	}
	return &runtimeapi.PodSandboxStatsResponse{Stats: s.stats.sandbox(sb, s.sandboxContainers(sb.ID), s.now())}, nil
}

// ListPodSandboxStats answers for the ready sandboxes the filter selects (containerd leaves out
// the others too: a stopped pod uses nothing). The ID filter accepts a prefix.
func (s *Runtime) ListPodSandboxStats(_ context.Context, req *runtimeapi.ListPodSandboxStatsRequest) (*runtimeapi.ListPodSandboxStatsResponse, error) {
	return &runtimeapi.ListPodSandboxStatsResponse{Stats: s.listSandboxStats(req.GetFilter())}, nil
}

// StreamPodSandboxStats sends the same list as ListPodSandboxStats, in one message.
func (s *Runtime) StreamPodSandboxStats(req *runtimeapi.StreamPodSandboxStatsRequest, stream runtimeapi.RuntimeService_StreamPodSandboxStatsServer) error {
	return stream.Send(&runtimeapi.StreamPodSandboxStatsResponse{PodSandboxStats: s.listSandboxStats(req.GetFilter())})
}

func (s *Runtime) listSandboxStats(f *runtimeapi.PodSandboxStatsFilter) []*runtimeapi.PodSandboxStats {
	records := s.store.Sandboxes.List(func(sb *store.Sandbox) bool {
		if sb.State != store.SandboxReady {
			return false
		}
		if f.GetId() != "" && !strings.HasPrefix(sb.ID, f.GetId()) {
			return false
		}
		return matchLabels(sb.Config.Msg.GetLabels(), f.GetLabelSelector())
	})
	// One pass over the containers, not one per sandbox: the kubelet lists every few seconds.
	bySandbox := map[string][]*store.Container{}
	for _, c := range s.store.Containers.List(nil) {
		bySandbox[c.SandboxID] = append(bySandbox[c.SandboxID], c)
	}
	now := s.now()
	out := make([]*runtimeapi.PodSandboxStats, len(records))
	inParallel(len(records), func(i int) { out[i] = s.stats.sandbox(records[i], bySandbox[records[i].ID], now) })
	s.stats.forgetRemoved()
	return out
}

// inParallel calls fn(0) to fn(n-1) on up to GOMAXPROCS goroutines: a stats list reads every
// pod's files and sockets, each read a system call, so a node's cores share the work.
func inParallel(n int, fn func(i int)) {
	var next atomic.Int64
	var wg sync.WaitGroup
	for range min(n, runtime.GOMAXPROCS(0)) {
		wg.Go(func() {
			for i := int(next.Add(1)) - 1; i < n; i = int(next.Add(1)) - 1 {
				fn(i)
			}
		})
	}
	wg.Wait()
}
