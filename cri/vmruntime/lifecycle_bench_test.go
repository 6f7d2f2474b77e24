package vmruntime

import (
	"context"
	"fmt"
	"testing"

	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"
)

// BenchmarkPodLifecycle runs a VM pod's whole lifecycle, one RPC after another as the kubelet
// makes them, with cocoon and the pod network in memory and the store on disk: what is measured
// is cocoon-cri's own cost per lifecycle (`make bench`'s lifecycle benchmark takes it from a
// real node's metrics), its synced bbolt commits included, the waits on cocoon and the CNI left
// out.
func BenchmarkPodLifecycle(b *testing.B) {
	n := newFakeNode(b, Config{})
	n.importSnapshot(snapshotRef, appSnapshot())
	ctx := context.Background()
	b.ResetTimer()
	for i := range b.N {
		cfg := podConfig(fmt.Sprintf("pod-%d", i))
		run, err := n.s.RunPodSandbox(ctx, &runtimeapi.RunPodSandboxRequest{Config: cfg, RuntimeHandler: HandlerName})
		if err != nil {
			b.Fatal(err)
		}
		sandbox := run.GetPodSandboxId()
		created, err := n.s.CreateContainer(ctx, &runtimeapi.CreateContainerRequest{PodSandboxId: sandbox, Config: containerConfig("app", snapshotRef), SandboxConfig: cfg})
		if err != nil {
			b.Fatal(err)
		}
		container := created.GetContainerId()
		if _, err := n.s.StartContainer(ctx, &runtimeapi.StartContainerRequest{ContainerId: container}); err != nil {
			b.Fatal(err)
		}
		if _, err := n.s.StopContainer(ctx, &runtimeapi.StopContainerRequest{ContainerId: container, Timeout: 10}); err != nil {
			b.Fatal(err)
		}
		if _, err := n.s.RemoveContainer(ctx, &runtimeapi.RemoveContainerRequest{ContainerId: container}); err != nil {
			b.Fatal(err)
		}
		if _, err := n.s.StopPodSandbox(ctx, &runtimeapi.StopPodSandboxRequest{PodSandboxId: sandbox}); err != nil {
			b.Fatal(err)
		}
		if _, err := n.s.RemovePodSandbox(ctx, &runtimeapi.RemovePodSandboxRequest{PodSandboxId: sandbox}); err != nil {
			b.Fatal(err)
		}
	}
}
