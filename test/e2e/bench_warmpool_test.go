package e2e

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"

	containerdtest "github.com/cocoonstack/cocoon-cri/test/containerd"
	"github.com/cocoonstack/cocoon-cri/test/harness"
	"github.com/cocoonstack/cocoon-cri/test/testimage"
)

const (
	// pooledRef is the image the warm pool benchmark pools; snapRef, another snapshot, starts cold.
	pooledRef = "e2e/pooled:v1"
	// poolStarts is how many pods it starts one at a time of each kind; poolPods how many at once,
	// with a pool of as many.
	poolStarts = 10
	poolPods   = 50
)

// TestBenchmarkWarmPool measures pods started from a warm pool against cold ones (a clone each) in
// one run, beside containerd's runc pod start: StartContainer alone and RunPodSandbox to a running
// container, one pod at a time; then poolPods pods at once of each kind. Targets: a pooled
// StartContainer at most a quarter of a cold one; RunPodSandbox to running within 100 ms at p50;
// poolPods pooled pods at once all running in at most a third of the time as many cold pods take.
func TestBenchmarkWarmPool(t *testing.T) {
	out := benchDir(t)
	// Every pod has a cgroup parent the kubelet made, as under a kubelet: each runtime puts its
	// containers there.
	parent := harness.CgroupParent(t)
	harness.MakeCgroup(t, parent)
	n, ctrd := newPassthroughNode(t, containerdtest.Options{}, "--warm-pool", pooledRef+"="+strconv.Itoa(poolPods))
	n.podCgroupParent = parent
	n.Start()
	n.ImportImage(pooledRef, n.SnapshotImage("pooled", testimage.SnapshotOptions{}))
	n.withSnapshot()
	rt, _ := n.clients()
	conn, err := grpc.NewClient(ctrd.Endpoint(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	ctrdRT := runtimeapi.NewRuntimeServiceClient(conn)
	busybox, _ := ctrd.Images()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Minute)
	defer cancel()
	n.waitPoolReady(poolPods)

	var coldStart, pooledStart, coldRun, pooledRun, runcRun []time.Duration
	for i := range poolStarts {
		run, start := timedPodStart(ctx, t, n, rt, fmt.Sprintf("cold-%d", i), snapRef)
		coldRun, coldStart = append(coldRun, run), append(coldStart, start)
		run, start = timedPodStart(ctx, t, n, rt, fmt.Sprintf("pooled-%d", i), pooledRef)
		pooledRun, pooledStart = append(pooledRun, run), append(pooledStart, start)
		runcRun = append(runcRun, timedRuncPod(ctx, t, n, ctrdRT, fmt.Sprintf("runc-%d", i), busybox))
	}
	n.waitPoolReady(poolPods)
	coldAll := podsAtOnce(ctx, t, n, rt, "cold-at-once", snapRef)
	pooledAll := podsAtOnce(ctx, t, n, rt, "pooled-at-once", pooledRef)

	verdict := func(ok bool) string {
		if ok {
			return "met"
		}
		return "NOT met"
	}
	coldStartP50, pooledStartP50, pooledRunP50 := quantile(coldStart, 0.5), quantile(pooledStart, 0.5), quantile(pooledRun, 0.5)
	var b strings.Builder
	b.WriteString("## Warm pools\n\n")
	fmt.Fprintf(&b, "VM pods of an image with a warm pool (`--warm-pool %s=%d`) against pods of another snapshot, cloned at "+
		"StartContainer, and containerd's runc pods of busybox, in one run on one node: %d of each started one at a time, "+
		"then %d at once of each VM kind, the pool full. Every pod has a cgroup parent, as under a kubelet. Medians, in ms.\n\n", pooledRef, poolPods, poolStarts, poolPods)
	b.WriteString("| | cold (clone) | pooled | containerd (runc) |\n|---|---|---|---|\n")
	fmt.Fprintf(&b, "| StartContainer | %s | %s | |\n", ms(coldStartP50), ms(pooledStartP50))
	fmt.Fprintf(&b, "| RunPodSandbox to a running container | %s | %s | %s |\n", ms(quantile(coldRun, 0.5)), ms(pooledRunP50), ms(quantile(runcRun, 0.5)))
	fmt.Fprintf(&b, "| %d pods at once, until all run | %s | %s | |\n", poolPods, ms(coldAll), ms(pooledAll))
	fmt.Fprintf(&b, "\nTargets: a pooled StartContainer at most a quarter of a cold one: %s; RunPodSandbox to running within "+
		"100 ms: %s; %d pooled pods at once in at most a third of the cold ones' time: %s.\n",
		verdict(4*pooledStartP50 <= coldStartP50), verdict(pooledRunP50 <= 100*time.Millisecond), poolPods, verdict(3*pooledAll <= coldAll))
	if err := os.WriteFile(filepath.Join(out, "27-warm-pool.md"), []byte(b.String()), 0o644); err != nil {
		t.Fatal(err)
	}
	t.Log("\n" + b.String())
}

// timedPodStart runs a VM pod of image and returns the time from RunPodSandbox until its container
// runs, and StartContainer's own; the pod is removed again.
func timedPodStart(ctx context.Context, t *testing.T, n *node, rt runtimeapi.RuntimeServiceClient, name, image string) (run, start time.Duration) {
	t.Helper()
	began := time.Now()
	pod, ctr := createPod(ctx, t, rt, n.podConfig(name, "uid-"+name), image)
	startAt := time.Now()
	if _, err := rt.StartContainer(ctx, &runtimeapi.StartContainerRequest{ContainerId: ctr}); err != nil {
		t.Fatal(err)
	}
	run, start = time.Since(began), time.Since(startAt)
	removePod(ctx, t, rt, pod)
	return run, start
}

// timedRuncPod runs a busybox pod on containerd and returns the time from RunPodSandbox until its
// container runs; the pod is removed again.
func timedRuncPod(ctx context.Context, t *testing.T, n *node, rt runtimeapi.RuntimeServiceClient, name, image string) time.Duration {
	t.Helper()
	cfg := n.podConfig(name, "uid-"+name)
	began := time.Now()
	pod, err := rt.RunPodSandbox(ctx, &runtimeapi.RunPodSandboxRequest{Config: cfg})
	if err != nil {
		t.Fatal(err)
	}
	ctr, err := rt.CreateContainer(ctx, &runtimeapi.CreateContainerRequest{PodSandboxId: pod.GetPodSandboxId(), Config: busyboxContainer("app", image), SandboxConfig: cfg})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := rt.StartContainer(ctx, &runtimeapi.StartContainerRequest{ContainerId: ctr.GetContainerId()}); err != nil {
		t.Fatal(err)
	}
	took := time.Since(began)
	removePod(ctx, t, rt, pod.GetPodSandboxId())
	return took
}

// podsAtOnce starts poolPods pods of image at once and returns the time until all run; they are
// removed again.
func podsAtOnce(ctx context.Context, t *testing.T, n *node, rt runtimeapi.RuntimeServiceClient, tag, image string) time.Duration {
	t.Helper()
	errs := make([]error, poolPods)
	var wg sync.WaitGroup
	began := time.Now()
	for i := range poolPods {
		wg.Go(func() { errs[i] = startPod(ctx, n, rt, fmt.Sprintf("%s-%02d", tag, i), image) })
	}
	wg.Wait()
	took := time.Since(began)
	if err := errors.Join(errs...); err != nil {
		t.Fatal(err)
	}
	pods, err := rt.ListPodSandbox(ctx, &runtimeapi.ListPodSandboxRequest{})
	if err != nil {
		t.Fatal(err)
	}
	for _, pod := range pods.GetItems() {
		if strings.HasPrefix(pod.GetMetadata().GetName(), tag) {
			removePod(ctx, t, rt, pod.GetId())
		}
	}
	return took
}
