package vmruntime

import (
	"context"
	"encoding/json"
	"errors"
	"net"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	"google.golang.org/grpc/codes"
	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"

	"github.com/cocoonstack/cocoon-cri/cri/grpcerr"
	"github.com/cocoonstack/cocoon-cri/pkg/cocoon"
	"github.com/cocoonstack/cocoon-cri/pkg/store"
)

// Hibernation on the fakes (docs/hibernation.md): the idle period is counted on the node's clock,
// which the tests move; each look at the VMs is a call of lookAtIdleVMs, and each hibernation it
// decides on is run at once, as RunHibernation runs them in the background.

const testHibernateAfter = 10 * time.Second

// hibernatingNode is a v0.5 node (vm hibernate, vm exec) whose pods hibernate after
// testHibernateAfter.
func hibernatingNode(t *testing.T) (*fakeNode, *fakeObserver) {
	t.Helper()
	obs := &fakeObserver{}
	n := newFakeNode(t, Config{HibernateAfter: testHibernateAfter, Metrics: obs})
	n.cocoon.setCaps(capsV05)
	return n, obs
}

// look is one look at the VMs after d passed, with the hibernations it decides on run at once.
func (n *fakeNode) look(d time.Duration) (hibernated []string) {
	n.t.Helper()
	settle(n.s)
	n.clock.Add(int64(d))
	ctx := context.Background()
	for _, id := range n.s.lookAtIdleVMs(ctx) {
		n.s.hibernateIdle(ctx, id)
		hibernated = append(hibernated, id)
	}
	return hibernated
}

// idleUntilHibernated looks at the VMs until the container hibernates: its first look has nothing
// to compare with, the next ones find it idle until the period passes.
func (n *fakeNode) idleUntilHibernated(containerID string) {
	n.t.Helper()
	for range 4 {
		n.look(testHibernateAfter / 2)
	}
	if c := n.container(containerID); !c.VM.Hibernated() {
		n.t.Fatalf("the container did not hibernate after %s idle: %+v", 2*testHibernateAfter, c.VM.Hibernation)
	}
}

// eventually waits for cond, which something in the background makes true.
func eventually(t *testing.T, what string, cond func() bool) {
	t.Helper()
	for deadline := time.Now().Add(time.Minute); !cond(); time.Sleep(5 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("%s: never happened", what)
		}
	}
}

func (n *fakeNode) hibernationInfo(containerID string) *hibernationInfo {
	n.t.Helper()
	resp, err := n.s.ContainerStatus(context.Background(), &runtimeapi.ContainerStatusRequest{ContainerId: containerID, Verbose: true})
	if err != nil {
		n.t.Fatal(err)
	}
	var info containerInfo
	if err := json.Unmarshal([]byte(resp.GetInfo()["info"]), &info); err != nil {
		n.t.Fatalf("verbose info %q: %v", resp.GetInfo(), err)
	}
	return info.Hibernation
}

func TestAnIdleVMHibernatesAndAnExecWakesIt(t *testing.T) {
	n, obs := hibernatingNode(t)
	ctx := context.Background()
	sandboxID, containerID := n.runningPod("idle")
	started := n.container(containerID)

	// Idle, but not for the whole period yet.
	if got := n.look(0); len(got) != 0 {
		t.Fatalf("the first look hibernated %q", got)
	}
	if got := n.look(testHibernateAfter - time.Second); len(got) != 0 {
		t.Fatalf("hibernated before the period passed: %q", got)
	}
	n.cocoon.reset()
	n.idleUntilHibernated(containerID)

	c := n.container(containerID)
	vm, _ := n.cocoon.vm(c.VM.ID)
	snap := c.VM.Hibernation.Snapshot
	if c.State != store.ContainerRunning || c.VM.PID != 0 || vm.State != cocoon.VMStateStopped || !strings.HasPrefix(snap, hibernationSnapshotPrefix) {
		t.Fatalf("hibernated container %+v, VM %+v", c, vm)
	}
	wantCalls(t, "hibernation", vmCalls(n.cocoon), "VMHibernate "+c.VM.ID+" "+snap)
	status, err := n.s.ContainerStatus(ctx, &runtimeapi.ContainerStatusRequest{ContainerId: containerID})
	if err != nil || status.GetStatus().GetState() != runtimeapi.ContainerState_CONTAINER_RUNNING {
		t.Fatalf("the kubelet sees %v, %v; want RUNNING", status, err)
	}
	info := n.hibernationInfo(containerID)
	if info == nil || !info.Hibernated || info.Snapshot != snap || info.Since == "" || info.After != testHibernateAfter.String() {
		t.Fatalf("crictl inspect shows %+v", info)
	}
	stats, err := n.s.ContainerStats(ctx, &runtimeapi.ContainerStatsRequest{ContainerId: containerID})
	if err != nil || stats.GetStats().GetCpu().GetUsageNanoCores().GetValue() != 0 || stats.GetStats().GetMemory().GetWorkingSetBytes().GetValue() != 0 {
		t.Fatalf("a hibernated VM's stats: %v, %v", stats, err)
	}
	// The VM watcher knows the stop was on purpose.
	n.s.watcher.checkRunning(ctx, mustList(t, n.cocoon))
	if c := n.container(containerID); c.State != store.ContainerRunning {
		t.Fatalf("the sweep ended a hibernated container: %+v", c)
	}

	// An ExecSync wakes it and runs in the woken guest, after the woken guest's clock is stepped
	// from the host's: it resumed at the time it hibernated. A guest that cannot step it still
	// takes the exec.
	var ranIn string
	var ran []string
	n.cocoon.setGuest(func(_ context.Context, vm cocoon.VM, argv []string, _ cocoon.ExecOptions) (int, error) {
		if len(argv) > 0 && argv[len(argv)-1] == "probe" {
			ranIn = vm.ID
		}
		ran = append(ran, strings.Join(argv, " "))
		if strings.Contains(argv[len(argv)-1], "date -u -s") {
			return 1, nil
		}
		return 0, nil
	})
	n.cocoon.reset()
	if _, err := n.s.ExecSync(ctx, &runtimeapi.ExecSyncRequest{ContainerId: containerID, Cmd: []string{"probe"}}); err != nil {
		t.Fatal(err)
	}
	c = n.container(containerID)
	vm, _ = n.cocoon.vm(c.VM.ID)
	if vm.State != cocoon.VMStateRunning || c.VM.PID != vm.PID || c.VM.PID == started.VM.PID || c.VM.Hibernated() || c.VM.Hibernation.Snapshot != "" || ranIn != vm.ID {
		t.Fatalf("woken container %+v, VM %+v, exec ran in %q", c, vm, ranIn)
	}
	if names := hibernationSnapshots(n.cocoon); len(names) != 0 {
		t.Fatalf("snapshots after the wake: %q", names)
	}
	if len(ran) != 2 || !strings.HasPrefix(ran[0], "/bin/sh -c { date -u -s @") || ran[1] != "probe" {
		t.Fatalf("the woken guest ran %q; want its clock stepped, then the exec", ran)
	}
	calls := vmCalls(n.cocoon)
	if len(calls) < 2 || calls[0] != "VMRestore "+c.VM.ID+" "+snap {
		t.Fatalf("wake calls %q", calls)
	}
	if obs.hibernations != 1 || obs.wakes != 1 {
		t.Fatalf("metrics saw %d hibernations, %d wakes", obs.hibernations, obs.wakes)
	}

	// It hibernates again after the next idle period, and a stop then ends it without waking it.
	n.idleUntilHibernated(containerID)
	n.cocoon.reset()
	if _, err := n.s.StopContainer(ctx, &runtimeapi.StopContainerRequest{ContainerId: containerID, Timeout: 30}); err != nil {
		t.Fatal(err)
	}
	c = n.container(containerID)
	if c.State != store.ContainerExited || c.ExitCode != killedExitCode || c.VM.Hibernation.Snapshot != "" {
		t.Fatalf("a hibernated container stopped: %+v", c)
	}
	for _, call := range vmCalls(n.cocoon) {
		if strings.HasPrefix(call, "VMRestore") {
			t.Fatalf("the stop woke the guest: %q", vmCalls(n.cocoon))
		}
	}
	if names := hibernationSnapshots(n.cocoon); len(names) != 0 {
		t.Fatalf("snapshots after the stop: %q", names)
	}
	if _, err := n.s.RemovePodSandbox(ctx, &runtimeapi.RemovePodSandboxRequest{PodSandboxId: sandboxID}); err != nil {
		t.Fatal(err)
	}
	if vms, held := n.cocoon.vmNames(), n.net.held(); len(vms) != 0 || len(held) != 0 || n.net.openWatches() != 0 {
		t.Fatalf("left after removal: VMs %q, network %q, %d traffic watches", vms, held, n.net.openWatches())
	}
}

// hibernationSnapshots are the snapshots hibernations keep.
func hibernationSnapshots(fc *fakeCocoon) []string {
	return fc.snapshotsNamed(hibernationSnapshotPrefix)
}

func mustList(t *testing.T, fc *fakeCocoon) []cocoon.VM {
	t.Helper()
	vms, err := fc.VMList(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	return vms
}

// The pod's traffic keeps its VM awake, and a packet wakes a hibernated one.
func TestTrafficKeepsAVMAwakeAndWakesIt(t *testing.T) {
	n, _ := hibernatingNode(t)
	_, containerID := n.runningPod("web")
	vmNetNS := n.container(containerID).VM.NetNS

	n.look(0)
	for range 4 {
		n.net.packet(vmNetNS)
		if got := n.look(testHibernateAfter / 2); len(got) != 0 {
			t.Fatalf("a VM with traffic hibernated: %q", got)
		}
	}
	n.idleUntilHibernated(containerID)

	// The packet comes once the watch waits: one before is not use.
	eventually(t, "a wait for the pod's traffic", func() bool { return n.net.waitingFor(vmNetNS) > 0 })
	n.net.packet(vmNetNS)
	eventually(t, "the wake on traffic", func() bool { return !n.container(containerID).VM.Hibernated() })
	c := n.container(containerID)
	if vm, _ := n.cocoon.vm(c.VM.ID); vm.State != cocoon.VMStateRunning || c.VM.PID != vm.PID {
		t.Fatalf("woken on traffic: %+v, VM %+v", c, vm)
	}
}

// A use in flight (a stream, an ExecSync) keeps the VM awake however long it lasts.
func TestAUseInFlightKeepsAVMAwake(t *testing.T) {
	n, _ := hibernatingNode(t)
	_, containerID := n.runningPod("shell")
	release, err := n.s.inUse(context.Background(), containerID)
	if err != nil {
		t.Fatal(err)
	}
	for range 5 {
		if got := n.look(testHibernateAfter); len(got) != 0 {
			t.Fatalf("hibernated during a use: %q", got)
		}
	}
	release()
	n.idleUntilHibernated(containerID)
}

// What cannot hibernate says so and is never tried again; a failure is retried later, and leaves
// the VM running.
func TestHibernationRefusalsAndFailures(t *testing.T) {
	t.Run("a cocoon without vm hibernate", func(t *testing.T) {
		n, _ := hibernatingNode(t)
		n.cocoon.setCaps(capsV038)
		_, containerID := n.runningPod("old")
		n.cocoon.reset()
		for range 6 {
			n.look(testHibernateAfter)
		}
		if calls := vmCalls(n.cocoon); len(calls) != 0 {
			t.Fatalf("cocoon was asked %q", calls)
		}
		if info := n.hibernationInfo(containerID); info == nil || !strings.Contains(info.CannotHibernate, "has no vm hibernate") {
			t.Fatalf("inspect shows %+v", info)
		}
	})
	t.Run("a VM with a disk attached", func(t *testing.T) {
		n, obs := hibernatingNode(t)
		_, containerID := n.runningPod("disk")
		c := n.container(containerID)
		if err := n.cocoon.VMDiskAttach(context.Background(), c.VM.ID, "/dev/vg/data", "data", false); err != nil {
			t.Fatal(err)
		}
		n.cocoon.reset()
		for range 6 {
			n.look(testHibernateAfter)
		}
		c = n.container(containerID)
		if calls := vmCalls(n.cocoon); len(calls) != 1 || c.VM.Hibernation.Snapshot != "" || obs.refused != 1 {
			t.Fatalf("calls %q, hibernation %+v, %d failures counted", calls, c.VM.Hibernation, obs.refused)
		}
		if info := n.hibernationInfo(containerID); info == nil || !strings.Contains(info.CannotHibernate, "detach before snapshot or hibernate") {
			t.Fatalf("inspect shows %+v", info)
		}
	})
	t.Run("a full disk", func(t *testing.T) {
		n, _ := hibernatingNode(t)
		_, containerID := n.runningPod("full")
		n.cocoon.failOnce("VMHibernate", cocoonErr(cocoon.ErrNoSpace, "save snapshot: write memory: no space left on device", "vm", "hibernate"))
		n.look(0)
		n.look(testHibernateAfter / 2)
		n.look(testHibernateAfter / 2)
		c := n.container(containerID)
		vm, _ := n.cocoon.vm(c.VM.ID)
		if c.VM.Hibernation.Snapshot != "" || vm.State != cocoon.VMStateRunning || len(hibernationSnapshots(n.cocoon)) != 0 {
			t.Fatalf("after a failed hibernation: %+v, VM %+v, snapshots %q", c.VM, vm, n.cocoon.snapshotNames())
		}
		if info := n.hibernationInfo(containerID); info == nil || !strings.Contains(info.LastError, "no space left") {
			t.Fatalf("inspect shows %+v", info)
		}
		// Not before the retry is due, then again.
		if got := n.look(testHibernateAfter); len(got) != 0 {
			t.Fatalf("retried at once: %q", got)
		}
		n.clock.Add(int64(hibernateRetryMin))
		n.idleUntilHibernated(containerID)
	})
}

// A restart loses nothing: a hibernated VM stays so and still wakes; a hibernation or a wake the
// restart cut short is settled from what cocoon shows. Adopting a running VM checks its hypervisor
// lives: a live process stands in for every one.
func TestRestartsAroundHibernation(t *testing.T) {
	restartNode := func(t *testing.T) *fakeNode {
		n, _ := hibernatingNode(t)
		pid, _ := hypervisorStandIn(t)
		n.cocoon.setPID(func() int { return pid })
		return n
	}
	t.Run("hibernated", func(t *testing.T) {
		n := restartNode(t)
		_, containerID := n.runningPod("sleepy")
		n.idleUntilHibernated(containerID)
		n.restartAndRecover()
		c := n.container(containerID)
		if c.State != store.ContainerRunning || !c.VM.Hibernated() {
			t.Fatalf("after the restart: %+v", c)
		}
		n.look(0)
		eventually(t, "a wait for the pod's traffic", func() bool { return n.net.waitingFor(c.VM.NetNS) > 0 })
		n.net.packet(c.VM.NetNS)
		eventually(t, "the wake on traffic", func() bool { return !n.container(containerID).VM.Hibernated() })
	})
	t.Run("a hibernation cut short after cocoon's", func(t *testing.T) {
		n := restartNode(t)
		_, containerID := n.runningPod("cut")
		c := n.container(containerID)
		settle(n.s)
		if err := n.cocoon.VMHibernate(context.Background(), c.VM.ID, "cri-hib-cut"); err != nil {
			t.Fatal(err)
		}
		n.crashAfterRecording(containerID, "cri-hib-cut")
		if c := n.container(containerID); c.State != store.ContainerRunning || !c.VM.Hibernated() || c.VM.PID != 0 {
			t.Fatalf("a hibernation cocoon finished: %+v", c)
		}
	})
	t.Run("a hibernation cut short before cocoon's", func(t *testing.T) {
		n := restartNode(t)
		_, containerID := n.runningPod("early")
		n.crashAfterRecording(containerID, "cri-hib-early")
		if c := n.container(containerID); c.State != store.ContainerRunning || c.VM.Hibernation.Snapshot != "" {
			t.Fatalf("a hibernation that never happened: %+v", c)
		}
	})
	t.Run("a wake cut short", func(t *testing.T) {
		n := restartNode(t)
		_, containerID := n.runningPod("woke")
		n.idleUntilHibernated(containerID)
		c := n.container(containerID)
		if err := n.cocoon.VMRestore(context.Background(), c.VM.ID, c.VM.Hibernation.Snapshot); err != nil {
			t.Fatal(err)
		}
		n.restartAndRecover()
		c = n.container(containerID)
		vm, _ := n.cocoon.vm(c.VM.ID)
		if c.State != store.ContainerRunning || c.VM.Hibernated() || c.VM.PID != vm.PID || len(hibernationSnapshots(n.cocoon)) != 0 {
			t.Fatalf("after a wake cut short: %+v, VM %+v, snapshots %q", c, vm, n.cocoon.snapshotNames())
		}
	})
}

// crashAfterRecording plays a crash of cocoon-cri once it recorded a hibernation into snapshot,
// then its restart.
func (n *fakeNode) crashAfterRecording(containerID, snapshot string) {
	n.t.Helper()
	if _, err := n.st.Containers.Modify(containerID, func(r *store.Container) error {
		r.VM.Hibernation.Snapshot = snapshot
		return nil
	}); err != nil {
		n.t.Fatal(err)
	}
	n.restartAndRecover()
}

func (n *fakeNode) restartAndRecover() {
	n.t.Helper()
	n.restart()
	if err := n.s.Recover(context.Background()); err != nil {
		n.t.Fatal(err)
	}
}

// A wake that fails leaves the VM hibernated and the use refused with Unavailable.
func TestAFailedWakeRefusesTheUse(t *testing.T) {
	n, _ := hibernatingNode(t)
	_, containerID := n.runningPod("stuck")
	n.idleUntilHibernated(containerID)
	n.cocoon.failOnce("VMRestore", errors.New("restore failed"))
	_, err := n.s.ExecSync(context.Background(), &runtimeapi.ExecSyncRequest{ContainerId: containerID, Cmd: []string{"true"}})
	wantCode(t, err, codes.Unavailable)
	if c := n.container(containerID); !c.VM.Hibernated() || c.State != store.ContainerRunning {
		t.Fatalf("after a failed wake: %+v", c)
	}
	if _, err := n.s.ExecSync(context.Background(), &runtimeapi.ExecSyncRequest{ContainerId: containerID, Cmd: []string{"true"}}); err != nil {
		t.Fatalf("the next use: %v", err)
	}
}

func TestHibernateAfterAnnotation(t *testing.T) {
	n := newFakeNode(t, Config{HibernateAfter: time.Hour})
	run := func(value string, set bool) (*store.Sandbox, error) {
		cfg := podConfig("p" + strings.NewReplacer(".", "", "-", "").Replace(value))
		if set {
			cfg.Annotations = map[string]string{AnnotationHibernateAfter: value}
		}
		resp, err := n.s.RunPodSandbox(context.Background(), &runtimeapi.RunPodSandboxRequest{Config: cfg, RuntimeHandler: HandlerName})
		if err != nil {
			return nil, err
		}
		return n.sandbox(resp.GetPodSandboxId()), nil
	}
	for _, bad := range []string{"soon", "500ms", "-1m", "1"} {
		if _, err := run(bad, true); grpcerr.Code(err) != codes.InvalidArgument {
			t.Errorf("%q: %v, want InvalidArgument", bad, err)
		}
	}
	for value, want := range map[string]time.Duration{"0": 0, "1s": time.Second, "15m": 15 * time.Minute} {
		sb, err := run(value, true)
		if err != nil || sb.VM.HibernateAfter != want {
			t.Errorf("%q: %v, %v; want %s", value, sb, err, want)
		}
	}
	if sb, err := run("default", false); err != nil || sb.VM.HibernateAfter != time.Hour {
		t.Errorf("without the annotation: %v, %v; want the node's --hibernate-after", sb, err)
	}
}

// An operator hibernates and wakes a pod without a period, through the admin service on a real
// gRPC server; a packet wakes it as it wakes any hibernated pod.
func TestOperatorHibernatesAndWakesAPod(t *testing.T) {
	n := newFakeNode(t, Config{})
	n.cocoon.setCaps(capsV05)
	sandboxID, containerID := n.runningPod("ops")
	settle(n.s)

	sock := filepath.Join(t.TempDir(), "cri.sock")
	lis, err := net.Listen("unix", sock)
	if err != nil {
		t.Fatal(err)
	}
	// The daemon's CRI interceptor maps errors at the edge; this server does only that.
	g := grpc.NewServer(grpc.UnaryInterceptor(func(ctx context.Context, req any, _ *grpc.UnaryServerInfo, handler grpc.UnaryHandler) (any, error) {
		resp, err := handler(ctx, req)
		return resp, grpcerr.ToStatus(err)
	}))
	n.s.RegisterPodControl(g)
	go func() { _ = g.Serve(lis) }()
	t.Cleanup(g.Stop)
	conn, err := grpc.NewClient("unix://"+sock, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	ctx := context.Background()

	if id, err := HibernatePod(ctx, conn, "default/ops"); err != nil || id != containerID {
		t.Fatalf("hibernate: %q, %v", id, err)
	}
	if c := n.container(containerID); !c.VM.Hibernated() || c.State != store.ContainerRunning {
		t.Fatalf("after the operator's hibernate: %+v", c)
	}
	if info := n.hibernationInfo(containerID); info == nil || !info.Hibernated {
		t.Fatalf("inspect shows %+v", info)
	}
	// Again: nothing to do.
	if _, err := HibernatePod(ctx, conn, sandboxID[:12]); err != nil {
		t.Fatalf("a second hibernate: %v", err)
	}
	if id, err := WakePod(ctx, conn, sandboxID); err != nil || id != containerID || n.container(containerID).VM.Hibernated() {
		t.Fatalf("wake: %q, %v", id, err)
	}

	// A pod without a period still wakes on traffic.
	if _, err := HibernatePod(ctx, conn, "default/ops"); err != nil {
		t.Fatal(err)
	}
	vmNetNS := n.container(containerID).VM.NetNS
	n.look(time.Second)
	eventually(t, "a wait for the pod's traffic", func() bool { return n.net.waitingFor(vmNetNS) > 0 })
	n.net.packet(vmNetNS)
	eventually(t, "the wake on traffic", func() bool { return !n.container(containerID).VM.Hibernated() })

	for pod, code := range map[string]codes.Code{"": codes.InvalidArgument, "default/nobody": codes.NotFound, "ffffffffffff": codes.NotFound} {
		_, err := HibernatePod(ctx, conn, pod)
		wantCode(t, err, code)
	}
	n.cocoon.setCaps(capsV038)
	_, err = HibernatePod(ctx, conn, "default/ops")
	wantCode(t, err, codes.FailedPrecondition)
	if _, err := n.s.StopContainer(ctx, &runtimeapi.StopContainerRequest{ContainerId: containerID}); err != nil {
		t.Fatal(err)
	}
	_, err = WakePod(ctx, conn, "default/ops")
	wantCode(t, err, codes.FailedPrecondition)
}

// A VM whose guest is still being set up for its pod is not hibernated, even by an operator: the
// set-up would wait for the saved guest until it gave up. It hibernates once the set-up is over.
func TestAGuestBeingSetUpDoesNotHibernate(t *testing.T) {
	n, _ := hibernatingNode(t)
	release := make(chan struct{})
	n.cocoon.setGuest(func(ctx context.Context, vm cocoon.VM, argv []string, o cocoon.ExecOptions) (int, error) {
		select {
		case <-release:
		case <-ctx.Done():
			return -1, ctx.Err()
		}
		return n.cocoon.defaultGuest(ctx, vm, argv, o)
	})
	_, id := n.runningPod("busy")
	err := n.s.Hibernate(context.Background(), id)
	if grpcerr.Code(err) != codes.Unavailable || !strings.Contains(err.Error(), "still being set up") {
		t.Fatalf("hibernating a guest being set up: %v", err)
	}
	if c := n.container(id); c.VM.Hibernation.Snapshot != "" || len(n.cocoon.calls("VMHibernate")) > 0 {
		t.Fatalf("the refused hibernation reached the record or cocoon: %+v, %v", c.VM.Hibernation, n.cocoon.calls("VMHibernate"))
	}
	close(release)
	settle(n.s)
	if err := n.s.Hibernate(context.Background(), id); err != nil {
		t.Fatalf("hibernating once the set-up is over: %v", err)
	}
}
