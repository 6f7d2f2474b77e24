package vmruntime

import (
	"testing"

	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"
)

// A subscriber that stops reading is cut off once it is eventBuffer events behind; publishing never
// waits for it, and the others go on receiving.
func TestEventHubCutsOffASubscriberThatFallsBehind(t *testing.T) {
	var h eventHub
	stuck, live := h.subscribe(), h.subscribe()
	for i := range eventBuffer + 1 {
		h.publish(&runtimeapi.ContainerEventResponse{ContainerId: "c", CreatedAt: int64(i)})
		if i < eventBuffer {
			<-live.ch
		}
	}
	select {
	case <-stuck.dropped:
	default:
		t.Fatal("the stuck subscriber was not cut off")
	}
	select {
	case <-live.dropped:
		t.Fatal("the live subscriber was cut off")
	default:
	}
	if ev := <-live.ch; ev.GetCreatedAt() != eventBuffer {
		t.Fatalf("the live subscriber got event %d, want %d", ev.GetCreatedAt(), eventBuffer)
	}
	h.unsubscribe(live)
	h.publish(&runtimeapi.ContainerEventResponse{})
	if len(live.ch) != 0 {
		t.Fatal("an unsubscribed subscriber still receives")
	}
}
