package e2e

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"

	"github.com/cocoonstack/cocoon-cri/test/cocoonsim/guest"
)

// The concurrency benchmark: this many pods started at once, on a simulator whose clone takes
// concurrentCloneLatency and whose VMs run no guest.
const (
	concurrentPods         = 50
	concurrentCloneLatency = 100 * time.Millisecond
)

// TestBenchmarkConcurrentStarts measures cocoon-cri's own concurrency (its locks, the store, its
// serialisation): 50 pods made and started at once (RunPodSandbox, CreateContainer and
// StartContainer each), with cocoon's cost fixed by the simulator's benchmark mode (every clone
// takes 100 ms at least, and its VM runs no guest). The figure is the time until every container
// runs. The target is 1.5 s. The daemon's metrics tell what the clones and the CNI plugins took,
// and cocoon-cri's own time in each RPC.
func TestBenchmarkConcurrentStarts(t *testing.T) {
	out := benchDir(t)
	n := newNodeWithEnv(t, []string{guest.FixedLatencyEnv + "=" + concurrentCloneLatency.String()}, "--metrics-addr", "127.0.0.1:0")
	n.withSnapshot()
	rt, _ := n.clients()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()

	before := n.scrapeMetrics()
	running := make([]time.Duration, concurrentPods)
	errs := make([]error, concurrentPods)
	var wg sync.WaitGroup
	go1 := make(chan struct{})
	for i := range concurrentPods {
		wg.Go(func() {
			<-go1
			start := time.Now()
			errs[i] = startPod(ctx, n, rt, fmt.Sprintf("at-once-%02d", i))
			running[i] = time.Since(start)
		})
	}
	start := time.Now()
	close(go1)
	wg.Wait()
	all := time.Since(start)
	if err := errors.Join(errs...); err != nil {
		t.Fatal(err)
	}
	after := n.scrapeMetrics()

	meanOf := func(metric, labels string) time.Duration {
		count := after["cocoon_cri_"+metric+"_count{"+labels+"}"] - before["cocoon_cri_"+metric+"_count{"+labels+"}"]
		if count == 0 {
			return 0
		}
		return time.Duration((after["cocoon_cri_"+metric+"_sum{"+labels+"}"] - before["cocoon_cri_"+metric+"_sum{"+labels+"}"]) / count * float64(time.Second))
	}
	rpc := func(method string) string {
		return fmt.Sprintf(`method=%q,runtime="cocoon",service="runtime.v1.RuntimeService"`, method)
	}
	var b strings.Builder
	b.WriteString("## Pods started at once\n\n")
	fmt.Fprintf(&b, "%d VM pods made and started at once (RunPodSandbox, CreateContainer, StartContainer each), on the "+
		"simulator's benchmark mode: every `vm clone` takes %s at least and its VM runs no guest, so what is measured is "+
		"cocoon-cri's own concurrency, with the cost of the clones' own work (the simulator's processes, their "+
		"network) on the same 2 cores. Target: every container running within 1.5 s.\n\n", concurrentPods, concurrentCloneLatency)
	b.WriteString("| | ms |\n|---|---|\n")
	fmt.Fprintf(&b, "| until every container runs | %s |\n", ms(all))
	fmt.Fprintf(&b, "| one pod, from RunPodSandbox to its container running: median / slowest | %s / %s |\n",
		ms(quantile(running, 0.5)), ms(quantile(running, 1)))
	fmt.Fprintf(&b, "| `vm clone`, mean | %s |\n", ms(meanOf("cocoon_call_duration_seconds", `subcommand="vm clone"`)))
	fmt.Fprintf(&b, "| CNI ADD, mean | %s |\n", ms(meanOf("cni_call_duration_seconds", `op="ADD"`)))
	for _, m := range []string{"RunPodSandbox", "CreateContainer", "StartContainer"} {
		fmt.Fprintf(&b, "| %s: mean time / of which cocoon-cri's own | %s / %s |\n", m,
			ms(meanOf("rpc_duration_seconds", rpc(m))), ms(meanOf("rpc_own_duration_seconds", rpc(m))))
	}
	if err := os.WriteFile(filepath.Join(out, "25-concurrency.md"), []byte(b.String()), 0o644); err != nil {
		t.Fatal(err)
	}
	t.Log("\n" + b.String())

	pods, err := rt.ListPodSandbox(ctx, &runtimeapi.ListPodSandboxRequest{})
	if err != nil {
		t.Fatal(err)
	}
	for _, pod := range pods.Items {
		if _, err := rt.StopPodSandbox(ctx, &runtimeapi.StopPodSandboxRequest{PodSandboxId: pod.Id}); err != nil {
			t.Fatal(err)
		}
		if _, err := rt.RemovePodSandbox(ctx, &runtimeapi.RemovePodSandboxRequest{PodSandboxId: pod.Id}); err != nil {
			t.Fatal(err)
		}
	}
}

// startPod makes a VM pod and starts its container.
func startPod(ctx context.Context, n *node, rt runtimeapi.RuntimeServiceClient, name string) error {
	cfg := n.podConfig(name, "uid-"+name)
	pod, err := rt.RunPodSandbox(ctx, &runtimeapi.RunPodSandboxRequest{Config: cfg, RuntimeHandler: "cocoon"})
	if err != nil {
		return fmt.Errorf("%s: RunPodSandbox: %w", name, err)
	}
	ctr, err := rt.CreateContainer(ctx, &runtimeapi.CreateContainerRequest{PodSandboxId: pod.PodSandboxId, Config: containerConfig("main", snapRef), SandboxConfig: cfg})
	if err != nil {
		return fmt.Errorf("%s: CreateContainer: %w", name, err)
	}
	if _, err := rt.StartContainer(ctx, &runtimeapi.StartContainerRequest{ContainerId: ctr.ContainerId}); err != nil {
		return fmt.Errorf("%s: StartContainer: %w", name, err)
	}
	return nil
}
