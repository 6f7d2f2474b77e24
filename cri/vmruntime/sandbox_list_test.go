package vmruntime

import (
	"context"
	"fmt"
	"testing"

	"google.golang.org/protobuf/proto"
	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"

	"github.com/cocoonstack/cocoon-cri/pkg/store"
)

// BenchmarkListPodSandbox500 is ListPodSandbox at 500 pods, each with the labels and annotation a
// kubelet's pod has: "answer" is cocoon-cri's side (the list and its encoding for the wire),
// "decode" what the client then spends reading it, a floor under any client's latency.
func BenchmarkListPodSandbox500(b *testing.B) {
	s, _ := statsServer(b)
	for i := range 500 {
		name := fmt.Sprintf("scale-%d", i)
		cfg := &runtimeapi.PodSandboxConfig{
			Metadata:    &runtimeapi.PodSandboxMetadata{Name: name, Namespace: "default", Uid: "uid-" + name},
			Labels:      map[string]string{"app": name, "io.kubernetes.pod.name": name, "io.kubernetes.pod.namespace": "default"},
			Annotations: map[string]string{"kubernetes.io/config.source": "api"},
		}
		sb := &store.Sandbox{ID: fmt.Sprintf("%064x", i), Name: name, State: store.SandboxReady, RuntimeHandler: "cocoon",
			Config: store.Proto[*runtimeapi.PodSandboxConfig]{Msg: cfg}}
		if err := s.store.Sandboxes.Create(sb); err != nil {
			b.Fatal(err)
		}
	}
	ctx := context.Background()
	answer := func() []byte {
		resp, err := s.ListPodSandbox(ctx, &runtimeapi.ListPodSandboxRequest{})
		if err != nil || len(resp.Items) != 500 {
			b.Fatalf("%d sandboxes, %v", len(resp.GetItems()), err)
		}
		wire, err := proto.Marshal(resp)
		if err != nil {
			b.Fatal(err)
		}
		return wire
	}
	b.Run("answer", func(b *testing.B) {
		for b.Loop() {
			answer()
		}
	})
	b.Run("decode", func(b *testing.B) {
		wire := answer()
		for b.Loop() {
			var resp runtimeapi.ListPodSandboxResponse
			if err := proto.Unmarshal(wire, &resp); err != nil {
				b.Fatal(err)
			}
		}
	})
}
