package vmruntime

import (
	"sync"

	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"

	"github.com/cocoonstack/cocoon-cri/pkg/store"
)

// eventBuffer is how many events a subscriber may fall behind by. A lifecycle RPC never waits for
// a subscriber: one that falls further behind is cut off, and relists when it reconnects, as the
// kubelet's evented PLEG does after any stream error.
const eventBuffer = 1024

// eventHub fans container events out to GetContainerEvents subscribers.
type eventHub struct {
	mu   sync.Mutex
	subs map[*eventSub]struct{}
}

type eventSub struct {
	ch      chan *runtimeapi.ContainerEventResponse
	dropped chan struct{} // closed when the subscriber fell too far behind
}

func (h *eventHub) subscribe() *eventSub {
	sub := &eventSub{ch: make(chan *runtimeapi.ContainerEventResponse, eventBuffer), dropped: make(chan struct{})}
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.subs == nil {
		h.subs = map[*eventSub]struct{}{}
	}
	h.subs[sub] = struct{}{}
	return sub
}

func (h *eventHub) unsubscribe(sub *eventSub) {
	h.mu.Lock()
	defer h.mu.Unlock()
	delete(h.subs, sub)
}

// idle reports whether nobody listens: the kubelet subscribes only with EventedPLEG, off by
// default, and an event then need not be built at all.
func (h *eventHub) idle() bool {
	h.mu.Lock()
	defer h.mu.Unlock()
	return len(h.subs) == 0
}

func (h *eventHub) publish(ev *runtimeapi.ContainerEventResponse) {
	h.mu.Lock()
	defer h.mu.Unlock()
	for sub := range h.subs {
		select {
		case sub.ch <- ev:
		default:
			delete(h.subs, sub)
			close(sub.dropped)
		}
	}
}

// GetContainerEvents streams container lifecycle events until the client goes away. Each carries
// the sandbox's status and its containers' statuses as they were right after the change.
func (s *Runtime) GetContainerEvents(_ *runtimeapi.GetEventsRequest, stream runtimeapi.RuntimeService_GetContainerEventsServer) error {
	sub := s.events.subscribe()
	defer s.events.unsubscribe(sub)
	for {
		select {
		case ev := <-sub.ch:
			if err := stream.Send(ev); err != nil {
				return err
			}
		case <-sub.dropped:
			return resourceExhausted("the client fell more than %d events behind; reconnect and relist", eventBuffer)
		case <-stream.Context().Done():
			return nil
		}
	}
}

// emit publishes an event about c, which has just changed. The caller holds the sandbox lock, so
// the statuses are those the change left.
func (s *Runtime) emit(kind runtimeapi.ContainerEventType, c *store.Container) {
	if s.events.idle() {
		return
	}
	ev := &runtimeapi.ContainerEventResponse{ContainerId: c.ID, ContainerEventType: kind, CreatedAt: s.now()}
	if sb, err := s.store.Sandboxes.Get(c.SandboxID); err == nil {
		ev.PodSandboxStatus = sandboxStatus(sb)
		ev.ContainersStatuses = s.containerStatuses(sb.ID)
	}
	s.events.publish(ev)
}
