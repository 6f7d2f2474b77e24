package e2e

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"

	"github.com/cocoonstack/cocoon-cri/cri/vmruntime"
)

const (
	// wakeRuns is how many wakes the hibernation benchmark times.
	wakeRuns = 10
	// idlePods is how many idle pods' memory it adds up, awake and hibernated.
	idlePods = 100
)

// TestBenchmarkHibernation measures hibernation: an exec on a hibernated pod until it answers
// against one on an awake pod, the wake inside it (`cocoon vm restore`) against a clone's `vm
// clone`, the hibernation itself, forks of a running pod (one, and ten at once), and the memory the
// hypervisors of idlePods idle pods hold awake and hibernated. Targets: a wake within 20 ms of a
// clone's own time; a hibernated pod's hypervisor memory zero.
func TestBenchmarkHibernation(t *testing.T) {
	out := benchDir(t)
	n := newNode(t, "--metrics-addr", "127.0.0.1:0")
	n.withSnapshot()
	rt, _ := n.clients()
	conn := n.conn()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Minute)
	defer cancel()
	pod, ctr, _ := n.runningPod("sleepy", snapRef)
	exec := func() time.Duration {
		start := time.Now()
		if _, err := rt.ExecSync(ctx, &runtimeapi.ExecSyncRequest{ContainerId: ctr, Cmd: []string{"true"}, Timeout: 60}); err != nil {
			t.Fatal(err)
		}
		return time.Since(start)
	}
	exec() // the guest is set up

	restoreSeries := `cocoon_cri_cocoon_call_duration_seconds_sum{subcommand="vm restore"}`
	hibernateSeries := `cocoon_cri_cocoon_call_duration_seconds_sum{subcommand="vm hibernate"}`
	cloneSeries := `cocoon_cri_cocoon_call_duration_seconds_sum{subcommand="vm clone"}`
	var awakeExec, wakeExec, restore, hibernate, clone []time.Duration
	for i := range wakeRuns {
		awakeExec = append(awakeExec, exec())
		before := n.scrapeMetrics()
		if _, err := vmruntime.HibernatePod(ctx, conn, pod); err != nil {
			t.Fatal(err)
		}
		mid := n.scrapeMetrics()
		hibernate = append(hibernate, secondsBetween(before, mid, hibernateSeries))
		wakeExec = append(wakeExec, exec())
		restore = append(restore, secondsBetween(mid, n.scrapeMetrics(), restoreSeries))

		before = n.scrapeMetrics()
		timedPlainStart(ctx, t, n, rt, i)
		clone = append(clone, secondsBetween(before, n.scrapeMetrics(), cloneSeries))
	}

	// Forks of the awake pod: one, then ten started at once.
	exec()
	one := forkPods(ctx, t, n, rt, "one", 1)
	before := n.scrapeMetrics()
	ten := forkPods(ctx, t, n, rt, "ten", 10)
	tenSaves := n.scrapeMetrics()[`cocoon_cri_cocoon_call_duration_seconds_count{subcommand="snapshot save"}`] -
		before[`cocoon_cri_cocoon_call_duration_seconds_count{subcommand="snapshot save"}`]

	// Idle pods: their hypervisors' memory awake, then hibernated.
	var ctrs, pods []string
	for i := range idlePods {
		p, c, _ := n.runningPod(fmt.Sprintf("idle-%d", i), snapRef)
		pods, ctrs = append(pods, p), append(ctrs, c)
	}
	for _, c := range ctrs {
		if _, err := rt.ExecSync(ctx, &runtimeapi.ExecSyncRequest{ContainerId: c, Cmd: []string{"true"}, Timeout: 60}); err != nil {
			t.Fatal(err)
		}
	}
	awakeMemory := workingSet(ctx, t, rt, ctrs)
	for _, p := range pods {
		if _, err := vmruntime.HibernatePod(ctx, conn, p); err != nil {
			t.Fatal(err)
		}
	}
	hibernatedMemory := workingSet(ctx, t, rt, ctrs)

	var b strings.Builder
	b.WriteString("## Hibernation\n\n")
	fmt.Fprintf(&b, "%d wakes of a VM pod hibernated by `cocoon-cri pod hibernate`, each by an ExecSync, against an ExecSync on the "+
		"awake pod and a plain pod's `vm clone`; forks of the pod (`vm.cocoonstack.io/fork-from`), one and ten at once; then the hypervisors' memory (working set, as `kubectl top` reads it) of %d "+
		"idle pods awake and hibernated. Medians, in ms. Targets: a wake within 20 ms of a clone's own time; a hibernated "+
		"pod's hypervisor memory zero.\n\n", wakeRuns, idlePods)
	b.WriteString("| figure | value |\n|---|---|\n")
	fmt.Fprintf(&b, "| ExecSync, awake | %s |\n", ms(quantile(awakeExec, 0.5)))
	fmt.Fprintf(&b, "| ExecSync, hibernated (the wake included) | %s |\n", ms(quantile(wakeExec, 0.5)))
	fmt.Fprintf(&b, "| `vm restore` within it | %s |\n", ms(quantile(restore, 0.5)))
	fmt.Fprintf(&b, "| `vm clone` of a plain pod | %s |\n", ms(quantile(clone, 0.5)))
	fmt.Fprintf(&b, "| `vm hibernate` | %s |\n", ms(quantile(hibernate, 0.5)))
	fmt.Fprintf(&b, "| 1 fork of the pod, RunPodSandbox to running | %s |\n", ms(one))
	fmt.Fprintf(&b, "| 10 forks of the pod started at once, until all run (%.0f saves of the source) | %s |\n", tenSaves, ms(ten))
	fmt.Fprintf(&b, "| %d idle pods awake, hypervisor memory | %.1f MiB |\n", idlePods, float64(awakeMemory)/(1<<20))
	fmt.Fprintf(&b, "| %d idle pods hibernated, hypervisor memory | %.1f MiB |\n", idlePods, float64(hibernatedMemory)/(1<<20))
	if err := os.WriteFile(filepath.Join(out, "hibernation.md"), []byte(b.String()), 0o644); err != nil {
		t.Fatal(err)
	}
	t.Log(b.String())
}

// forkPods makes n pods that fork the sleepy pod, starts their containers at once, and returns the
// time from the first RunPodSandbox until every container runs; the forks are removed again.
func forkPods(ctx context.Context, t *testing.T, n *node, rt runtimeapi.RuntimeServiceClient, tag string, count int) time.Duration {
	t.Helper()
	start := time.Now()
	var pods, ctrs []string
	for i := range count {
		cfg := n.podConfig(fmt.Sprintf("fork-%s-%d", tag, i), fmt.Sprintf("uid-fork-%s-%d", tag, i))
		cfg.Annotations[vmruntime.AnnotationForkFrom] = "default/sleepy"
		pod, ctr := createPod(ctx, t, rt, cfg, snapRef)
		pods, ctrs = append(pods, pod), append(ctrs, ctr)
	}
	var wg sync.WaitGroup
	for _, ctr := range ctrs {
		wg.Go(func() {
			if _, err := rt.StartContainer(ctx, &runtimeapi.StartContainerRequest{ContainerId: ctr}); err != nil {
				t.Error(err)
			}
		})
	}
	wg.Wait()
	took := time.Since(start)
	for _, pod := range pods {
		removePod(ctx, t, rt, pod)
	}
	return took
}

// workingSet adds up the working set the runtime reports for the containers.
func workingSet(ctx context.Context, t *testing.T, rt runtimeapi.RuntimeServiceClient, ctrs []string) uint64 {
	t.Helper()
	resp, err := rt.ListContainerStats(ctx, &runtimeapi.ListContainerStatsRequest{})
	if err != nil {
		t.Fatal(err)
	}
	var sum uint64
	for _, s := range resp.GetStats() {
		if slices.Contains(ctrs, s.GetAttributes().GetId()) {
			sum += s.GetMemory().GetWorkingSetBytes().GetValue()
		}
	}
	return sum
}
