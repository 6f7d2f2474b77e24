package e2e

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"
)

// lifecycleRuns is how many pod lifecycles the per-lifecycle benchmark times.
const lifecycleRuns = 30

// lifecycleRPCs are the calls of one pod's life, in order.
var lifecycleRPCs = []string{
	"RunPodSandbox", "CreateContainer", "StartContainer", "StopContainer", "RemoveContainer", "StopPodSandbox", "RemovePodSandbox",
}

// TestBenchmarkLifecycle measures cocoon-cri's own cost per pod lifecycle: a VM pod made, its
// container started, stopped and removed, and the pod removed, one lifecycle at a time. The
// daemon's metrics give each RPC's time and the part of it that was cocoon-cri's own
// (rpc_own_duration_seconds: the time not spent waiting on cocoon or the CNI plugins); they are
// read before and after each lifecycle. The target is a median own cost of at most 5 ms per
// lifecycle.
func TestBenchmarkLifecycle(t *testing.T) {
	out := benchDir(t)
	n := newNode(t, "--metrics-addr", "127.0.0.1:0")
	n.withSnapshot()
	rt, _ := n.clients()
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Minute)
	defer cancel()

	series := func(metric, method string) string {
		return fmt.Sprintf(`cocoon_cri_%s_sum{method=%q,runtime="cocoon",service="runtime.v1.RuntimeService"}`, metric, method)
	}
	took := map[string][]time.Duration{}
	own := map[string][]time.Duration{}
	cocoonCalls := map[string][]time.Duration{}
	var ownPerLifecycle []time.Duration
	for i := range lifecycleRuns {
		before := n.scrapeMetrics()
		lifecycle(ctx, t, n, rt, i)
		after := n.scrapeMetrics()
		var sum time.Duration
		for _, m := range lifecycleRPCs {
			took[m] = append(took[m], secondsBetween(before, after, series("rpc_duration_seconds", m)))
			o := secondsBetween(before, after, series("rpc_own_duration_seconds", m))
			own[m] = append(own[m], o)
			sum += o
		}
		ownPerLifecycle = append(ownPerLifecycle, sum)
		for name := range after {
			sub, ok := strings.CutPrefix(name, `cocoon_cri_cocoon_call_duration_seconds_sum{subcommand="`)
			if ok {
				sub = strings.TrimSuffix(sub, `"}`)
				cocoonCalls[sub] = append(cocoonCalls[sub], secondsBetween(before, after, name))
			}
		}
	}

	var b strings.Builder
	b.WriteString("## Cost per pod lifecycle\n\n")
	fmt.Fprintf(&b, "%d lifecycles of a VM pod on the simulator, one after another: RunPodSandbox, CreateContainer, "+
		"StartContainer, StopContainer, RemoveContainer, StopPodSandbox, RemovePodSandbox. From the daemon's metrics, "+
		"read before and after each lifecycle: each RPC's time, and the part of it that was cocoon-cri's own, the rest "+
		"having been spent waiting on cocoon and the CNI plugins (`cocoon_cri_rpc_own_duration_seconds`). Medians, in ms. "+
		"Target: cocoon-cri's own cost at most 10 ms per lifecycle.\n\n", lifecycleRuns)
	b.WriteString("| RPC | time | of which cocoon-cri's own | own, p90 |\n|---|---|---|---|\n")
	for _, m := range lifecycleRPCs {
		fmt.Fprintf(&b, "| %s | %s | %s | %s |\n", m, ms(quantile(took[m], 0.5)), ms(quantile(own[m], 0.5)), ms(quantile(own[m], 0.9)))
	}
	fmt.Fprintf(&b, "| **one lifecycle** | | **%s** | %s |\n\n", ms(quantile(ownPerLifecycle, 0.5)), ms(quantile(ownPerLifecycle, 0.9)))
	b.WriteString("The cocoon commands of one lifecycle, median time per lifecycle (ms); the guest's set-up after a " +
		"start (`vm exec`) runs in the background and is in no RPC's time:\n\n| cocoon command | time |\n|---|---|\n")
	subs := make([]string, 0, len(cocoonCalls))
	for sub := range cocoonCalls {
		subs = append(subs, sub)
	}
	slices.Sort(subs)
	for _, sub := range subs {
		if med := quantile(cocoonCalls[sub], 0.5); med > 0 {
			fmt.Fprintf(&b, "| `%s` | %s |\n", sub, ms(med))
		}
	}
	if err := os.WriteFile(filepath.Join(out, "20-lifecycle.md"), []byte(b.String()), 0o644); err != nil {
		t.Fatal(err)
	}
	t.Log("\n" + b.String())
}

// lifecycle runs one pod's life: a VM pod, its container started, stopped and removed, the pod
// stopped and removed.
func lifecycle(ctx context.Context, t *testing.T, n *node, rt runtimeapi.RuntimeServiceClient, i int) {
	t.Helper()
	cfg := n.podConfig(fmt.Sprintf("life-%d", i), fmt.Sprintf("uid-life-%d", i))
	pod, err := rt.RunPodSandbox(ctx, &runtimeapi.RunPodSandboxRequest{Config: cfg, RuntimeHandler: "cocoon"})
	if err != nil {
		t.Fatalf("RunPodSandbox: %v", err)
	}
	ctr, err := rt.CreateContainer(ctx, &runtimeapi.CreateContainerRequest{PodSandboxId: pod.PodSandboxId, Config: containerConfig("main", snapRef), SandboxConfig: cfg})
	if err != nil {
		t.Fatalf("CreateContainer: %v", err)
	}
	if _, err := rt.StartContainer(ctx, &runtimeapi.StartContainerRequest{ContainerId: ctr.ContainerId}); err != nil {
		t.Fatalf("StartContainer: %v", err)
	}
	if _, err := rt.StopContainer(ctx, &runtimeapi.StopContainerRequest{ContainerId: ctr.ContainerId, Timeout: 30}); err != nil {
		t.Fatalf("StopContainer: %v", err)
	}
	if _, err := rt.RemoveContainer(ctx, &runtimeapi.RemoveContainerRequest{ContainerId: ctr.ContainerId}); err != nil {
		t.Fatalf("RemoveContainer: %v", err)
	}
	if _, err := rt.StopPodSandbox(ctx, &runtimeapi.StopPodSandboxRequest{PodSandboxId: pod.PodSandboxId}); err != nil {
		t.Fatalf("StopPodSandbox: %v", err)
	}
	if _, err := rt.RemovePodSandbox(ctx, &runtimeapi.RemovePodSandboxRequest{PodSandboxId: pod.PodSandboxId}); err != nil {
		t.Fatalf("RemovePodSandbox: %v", err)
	}
}

// secondsBetween is how much a metric's seconds grew between two scrapes.
func secondsBetween(before, after map[string]float64, series string) time.Duration {
	return time.Duration((after[series] - before[series]) * float64(time.Second))
}

// quantile is the q-quantile of some durations (sorted in place).
func quantile(d []time.Duration, q float64) time.Duration {
	if len(d) == 0 {
		return 0
	}
	slices.Sort(d)
	return d[int(float64(len(d)-1)*q)]
}
