package e2e

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"

	"github.com/cocoonstack/cocoon-cri/pkg/vmstats"
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
	cpuBefore, daemonBefore := readCPUTimes(t), processCPU(t, n.Daemon.PID())
	running := make([]time.Duration, concurrentPods)
	errs := make([]error, concurrentPods)
	var wg sync.WaitGroup
	go1 := make(chan struct{})
	for i := range concurrentPods {
		wg.Go(func() {
			<-go1
			start := time.Now()
			errs[i] = startPod(ctx, n, rt, fmt.Sprintf("at-once-%02d", i), snapRef)
			running[i] = time.Since(start)
		})
	}
	start := time.Now()
	close(go1)
	wg.Wait()
	all := time.Since(start)
	cpu, daemonCPU := readCPUTimes(t).since(cpuBefore), processCPU(t, n.Daemon.PID())-daemonBefore
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
	fmt.Fprintf(&b, "\nThe machine's CPUs were busy %.0f%% of that time (%.0f%% of it in the kernel): %.0f ms of CPU a pod, "+
		"of which cocoon-cri's process used %.0f ms; the rest went to cocoon's commands and VMs, the CNI plugins and the kernel's work for them.\n\n",
		cpu.busyShare()*100, cpu.kernelShare()*100, cpu.busySeconds()*1000/concurrentPods, daemonCPU.Seconds()*1000/concurrentPods)
	b.WriteString("cocoon calls per pod, and their mean time:\n\n| subcommand | calls per pod | mean (ms) |\n|---|---|---|\n")
	for _, sub := range cocoonSubcommands(after) {
		labels := fmt.Sprintf("subcommand=%q", sub)
		calls := after["cocoon_cri_cocoon_call_duration_seconds_count{"+labels+"}"] - before["cocoon_cri_cocoon_call_duration_seconds_count{"+labels+"}"]
		if calls > 0 {
			fmt.Fprintf(&b, "| `%s` | %.1f | %s |\n", sub, calls/concurrentPods, ms(meanOf("cocoon_call_duration_seconds", labels)))
		}
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

// cocoonSubcommands lists, sorted, the cocoon subcommands that scraped metrics have timed.
func cocoonSubcommands(samples map[string]float64) []string {
	var subs []string
	for name := range samples {
		rest, ok := strings.CutPrefix(name, `cocoon_cri_cocoon_call_duration_seconds_count{subcommand="`)
		if ok {
			subs = append(subs, strings.TrimSuffix(rest, `"}`))
		}
	}
	slices.Sort(subs)
	return subs
}

// userHZ is the unit of the CPU times in /proc: clock ticks of 1/100 s on Linux.
const userHZ = 100

// processCPU is the CPU time pid has used (user and system) so far.
func processCPU(t *testing.T, pid int) time.Duration {
	t.Helper()
	st, err := vmstats.ReadStat("/proc", pid)
	if err != nil {
		t.Fatal(err)
	}
	return time.Duration(float64(st.UTime+st.STime) / userHZ * float64(time.Second))
}

// cpuTimes is the machine's CPU time from /proc/stat's first line, in clock ticks.
type cpuTimes struct{ user, system, idle, total float64 }

func readCPUTimes(t *testing.T) cpuTimes {
	t.Helper()
	data, err := os.ReadFile("/proc/stat")
	if err != nil {
		t.Fatal(err)
	}
	line, _, _ := strings.Cut(string(data), "\n")
	fields := strings.Fields(line)[1:] // user nice system idle iowait irq softirq steal ...
	var c cpuTimes
	for i, f := range fields {
		v, err := strconv.ParseFloat(f, 64)
		if err != nil {
			t.Fatalf("/proc/stat: %q: %v", line, err)
		}
		c.total += v
		switch i {
		case 0, 1:
			c.user += v
		case 2, 5, 6:
			c.system += v
		case 3, 4:
			c.idle += v
		}
	}
	return c
}

func (c cpuTimes) since(before cpuTimes) cpuTimes {
	return cpuTimes{user: c.user - before.user, system: c.system - before.system, idle: c.idle - before.idle, total: c.total - before.total}
}

func (c cpuTimes) busyShare() float64   { return (c.total - c.idle) / c.total }
func (c cpuTimes) busySeconds() float64 { return (c.total - c.idle) / userHZ }
func (c cpuTimes) kernelShare() float64 { return c.system / (c.total - c.idle) }

// startPod makes a VM pod of image and starts its container.
func startPod(ctx context.Context, n *node, rt runtimeapi.RuntimeServiceClient, name, image string) error {
	cfg := n.podConfig(name, "uid-"+name)
	pod, err := rt.RunPodSandbox(ctx, &runtimeapi.RunPodSandboxRequest{Config: cfg, RuntimeHandler: "cocoon"})
	if err != nil {
		return fmt.Errorf("%s: RunPodSandbox: %w", name, err)
	}
	ctr, err := rt.CreateContainer(ctx, &runtimeapi.CreateContainerRequest{PodSandboxId: pod.PodSandboxId, Config: containerConfig("main", image), SandboxConfig: cfg})
	if err != nil {
		return fmt.Errorf("%s: CreateContainer: %w", name, err)
	}
	if _, err := rt.StartContainer(ctx, &runtimeapi.StartContainerRequest{ContainerId: ctr.ContainerId}); err != nil {
		return fmt.Errorf("%s: StartContainer: %w", name, err)
	}
	return nil
}
