package cri

import (
	"context"
	"sync"

	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"
)

// GetContainerEvents merges both runtimes' event streams into one. When either stream ends, so
// does the merged one, with that stream's error: the kubelet's evented PLEG then relists and
// subscribes again, which is how it recovers from a gap in either runtime's events.
func (r *Router) GetContainerEvents(req *runtimeapi.GetEventsRequest, stream runtimeapi.RuntimeService_GetContainerEventsServer) error {
	if r.pass == nil {
		return r.toVM(stream.Context()).GetContainerEvents(req, stream)
	}
	serve(stream.Context(), servedByBoth)
	ctx, cancel := context.WithCancel(stream.Context())
	defer cancel()
	merged := &mergedEvents{RuntimeService_GetContainerEventsServer: stream, ctx: ctx}
	ended := make(chan error, 2)
	for _, b := range []Backend{r.vm, r.pass} {
		go func() { ended <- b.GetContainerEvents(req, merged) }()
	}
	err := <-ended
	cancel()
	<-ended
	return err
}

// mergedEvents lets two runtimes send into one stream: gRPC allows one sender at a time.
type mergedEvents struct {
	runtimeapi.RuntimeService_GetContainerEventsServer
	ctx context.Context
	mu  sync.Mutex
}

func (m *mergedEvents) Context() context.Context { return m.ctx }

func (m *mergedEvents) Send(ev *runtimeapi.ContainerEventResponse) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.RuntimeService_GetContainerEventsServer.Send(ev)
}
