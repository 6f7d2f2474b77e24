package vmruntime

import (
	"context"
	"errors"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"

	"github.com/cocoonstack/cocoon-cri/pkg/cocoon"
	"github.com/cocoonstack/cocoon-cri/pkg/store"
)

// Restarts of cocoon-cri on the fakes: the records persist in the store, VMs in cocoon and the
// pods' network in the network; Recover brings the records in line (docs/design.md, State and
// recovery).

// fakeObserver is the metrics' Observer, keeping what it is told.
type fakeObserver struct {
	mu                           sync.Mutex
	orphans                      []int
	restarts                     int
	hibernations, wakes, refused int
	// the warm pools: hand-overs, misses, fallbacks and VMs made, and the last ready count by image
	handOvers, misses, fallbacks, refills int
	ready                                 map[string]int
}

func (o *fakeObserver) PoolReady(image string, n int) {
	o.mu.Lock()
	defer o.mu.Unlock()
	if o.ready == nil {
		o.ready = map[string]int{}
	}
	o.ready[image] = n
}

func (o *fakeObserver) PoolRefilled(string, time.Duration) {
	o.mu.Lock()
	defer o.mu.Unlock()
	o.refills++
}

func (o *fakeObserver) PoolHandedOver(string, time.Duration) {
	o.mu.Lock()
	defer o.mu.Unlock()
	o.handOvers++
}

func (o *fakeObserver) PoolMissed(string) {
	o.mu.Lock()
	defer o.mu.Unlock()
	o.misses++
}

func (o *fakeObserver) PoolFellBack(string) {
	o.mu.Lock()
	defer o.mu.Unlock()
	o.fallbacks++
}

func (o *fakeObserver) Hibernated(time.Duration) {
	o.mu.Lock()
	defer o.mu.Unlock()
	o.hibernations++
}

func (o *fakeObserver) Woke(time.Duration) {
	o.mu.Lock()
	defer o.mu.Unlock()
	o.wakes++
}

func (o *fakeObserver) HibernationFailed(time.Duration) {
	o.mu.Lock()
	defer o.mu.Unlock()
	o.refused++
}

func (o *fakeObserver) Orphans(n int) {
	o.mu.Lock()
	defer o.mu.Unlock()
	o.orphans = append(o.orphans, n)
}

func (o *fakeObserver) WatcherRestarted() {
	o.mu.Lock()
	defer o.mu.Unlock()
	o.restarts++
}

func (o *fakeObserver) counts() []int {
	o.mu.Lock()
	defer o.mu.Unlock()
	return slices.Clone(o.orphans)
}

// TestRecoverAdoptsRunningVMsAndRecordsTheRest restarts cocoon-cri while three pods run, one
// VM going on, one stopped meanwhile and one removed by hand, with an orphan VM named like
// cocoon-cri's, a VM that is not cocoon-cri's, and the network leftovers of a pod no record names.
func TestRecoverAdoptsRunningVMsAndRecordsTheRest(t *testing.T) {
	metrics := &fakeObserver{}
	n := newFakeNode(t, Config{OrphanPolicy: OrphanDestroy, Metrics: metrics})
	// Adopting a VM checks that its hypervisor lives, and is the process its start recorded.
	pid, _ := hypervisorStandIn(t)
	n.cocoon.setPID(func() int { return pid })
	_, running := n.runningPod("running")
	_, stopped := n.runningPod("stopped")
	_, removed := n.runningPod("removed")
	n.cocoon.setVMState(n.container(stopped).VM.ID, cocoon.VMStateStopped)
	n.cocoon.forgetVM(n.container(removed).VM.ID)
	orphan := n.cocoon.addVM(cocoon.VM{State: cocoon.VMStateRunning, PID: pid, Config: cocoon.VMConfig{Name: VMNamePrefix + "0123456789ab-lost-app"}})
	other := n.cocoon.addVM(cocoon.VM{State: cocoon.VMStateRunning, PID: pid, Config: cocoon.VMConfig{Name: "not-cocoon-cris"}})
	n.net.addForeign("0123456789abcdef")

	n.restart()
	n.cocoon.reset()
	n.net.reset()
	if err := n.s.Recover(context.Background()); err != nil {
		t.Fatal(err)
	}
	if c := n.container(running); c.State != store.ContainerRunning || c.VM.PID != pid {
		t.Errorf("the running VM's container %s, pid %d", c.State, c.VM.PID)
	}
	if n.s.ioOf(running) == nil {
		t.Error("the running container's streams were not picked up")
	}
	if c := n.container(stopped); c.State != store.ContainerExited || c.ExitCode != 0 || c.Reason != reasonVMStopped {
		t.Errorf("the stopped VM's container %+v", c)
	}
	if c := n.container(removed); c.State != store.ContainerExited || c.ExitCode != killedExitCode || c.Reason != reasonVMGone {
		t.Errorf("the removed VM's container %+v", c)
	}
	if _, ok := n.cocoon.vm(orphan.ID); ok {
		t.Error("the orphan VM was kept under the destroy policy")
	}
	if _, ok := n.cocoon.vm(other.ID); !ok {
		t.Error("a VM that is not cocoon-cri's was removed")
	}
	if counts := metrics.counts(); !slices.Equal(counts, []int{0}) {
		t.Errorf("orphans reported %v, want none left", counts)
	}
	// A VM that ended keeps its pod's interface for the pod's next VM; only the one cocoon lost,
	// which no vm rm will make give it back, returns it to its pod.
	if calls := n.net.calls("ReclaimFromVM"); len(calls) != 1 || !strings.HasSuffix(calls[0], " "+n.container(removed).VM.NetNS) {
		t.Errorf("interfaces taken back: %q", calls)
	}
	if at := n.net.servedBy(n.container(stopped).SandboxID); at != n.container(stopped).VM.NetNS {
		t.Errorf("the pod interface of the VM that stopped serves %q", at)
	}
	for _, held := range n.net.held() {
		if strings.Contains(held, "0123456789abcdef") {
			t.Errorf("the network still holds %s", held)
		}
	}
	var known []string
	for _, sb := range n.st.Sandboxes.List(nil) {
		known = append(known, sb.ID)
	}
	slices.Sort(known)
	wantCalls(t, "leftovers", n.net.calls("RemoveLeftovers"), "RemoveLeftovers "+strings.Join(known, ","))

	// The kubelet goes on as usual: the adopted container stops, the pods go.
	ctx := context.Background()
	if _, err := n.s.StopContainer(ctx, &runtimeapi.StopContainerRequest{ContainerId: running, Timeout: 5}); err != nil {
		t.Fatal(err)
	}
	for _, id := range known {
		if _, err := n.s.RemovePodSandbox(ctx, &runtimeapi.RemovePodSandboxRequest{PodSandboxId: id}); err != nil {
			t.Fatal(err)
		}
	}
	if names := n.cocoon.vmNames(); !slices.Equal(names, []string{"not-cocoon-cris"}) {
		t.Errorf("VMs left: %q", names)
	}
	if held := n.net.held(); len(held) != 0 {
		t.Errorf("the network holds %q", held)
	}
}

// The orphan policies other than destroy leave orphans alone.
func TestRecoverKeepsOrphansUnlessTold(t *testing.T) {
	for _, policy := range []OrphanPolicy{OrphanAlert, OrphanKeep} {
		t.Run(string(policy), func(t *testing.T) {
			metrics := &fakeObserver{}
			n := newFakeNode(t, Config{OrphanPolicy: policy, Metrics: metrics})
			orphan := n.cocoon.addVM(cocoon.VM{State: cocoon.VMStateRunning, Config: cocoon.VMConfig{Name: VMNamePrefix + "0123456789ab-lost-app"}})
			if err := n.s.Recover(context.Background()); err != nil {
				t.Fatal(err)
			}
			if _, ok := n.cocoon.vm(orphan.ID); !ok {
				t.Error("the orphan VM was removed")
			}
			if calls := n.cocoon.calls("VMRemove"); len(calls) != 0 {
				t.Errorf("cocoon calls %q", calls)
			}
			if counts := metrics.counts(); !slices.Equal(counts, []int{1}) {
				t.Errorf("orphans reported %v, want the one", counts)
			}
		})
	}
}

// A RunPodSandbox whose roll-back failed keeps its record, and the pod's name, until a restart
// rolls it back.
func TestRecoverRollsBackAnInterruptedRunPodSandbox(t *testing.T) {
	n := newFakeNode(t, Config{})
	n.net.failOnce("PrepareCocoon", errors.New("disk full"))
	n.net.failAlways("Del", errors.New("the CNI plugin is gone"))
	_, err := n.s.RunPodSandbox(context.Background(), &runtimeapi.RunPodSandboxRequest{Config: podConfig("web"), RuntimeHandler: HandlerName})
	if err == nil {
		t.Fatal("RunPodSandbox succeeded")
	}
	left := n.st.Sandboxes.List(nil)
	if len(left) != 1 || left[0].State != store.SandboxCreating {
		t.Fatalf("records %+v", left)
	}
	_, err = n.s.RunPodSandbox(context.Background(), &runtimeapi.RunPodSandboxRequest{Config: podConfig("web"), RuntimeHandler: HandlerName})
	wantCode(t, err, codes.AlreadyExists)
	// Not a sandbox to the kubelet meanwhile.
	_, err = n.s.StopPodSandbox(context.Background(), &runtimeapi.StopPodSandboxRequest{PodSandboxId: left[0].ID})
	if err != nil {
		t.Fatal(err)
	}

	n.net.heal("Del")
	n.restart()
	if err := n.s.Recover(context.Background()); err != nil {
		t.Fatal(err)
	}
	if left := n.st.Sandboxes.List(nil); len(left) != 0 {
		t.Fatalf("records after recovery %+v", left[0])
	}
	if held := n.net.held(); len(held) != 0 {
		t.Errorf("the network holds %q", held)
	}
	n.runPod("web")
}

// A container whose command ran in a session of the old cocoon-cri (it takes stdin) lost its
// exit status: the restart stops its VM and records it exited, so the kubelet restarts it the usual
// way.
func TestRecoverEndsAContainerWhoseCommandWasLost(t *testing.T) {
	n := newFakeNode(t, Config{})
	n.cocoon.setCaps(capsV05)
	pid, _ := hypervisorStandIn(t)
	n.cocoon.setPID(func() int { return pid })
	// The guest runs the command until the exec session ends, as a server would.
	commandRuns := make(chan struct{})
	n.cocoon.setGuest(func(ctx context.Context, vm cocoon.VM, argv []string, o cocoon.ExecOptions) (int, error) {
		if argv[0] != "sleep" {
			return 0, nil
		}
		close(commandRuns)
		<-ctx.Done()
		return -1, ctx.Err()
	})
	n.importSnapshot(snapshotRef, appSnapshot())
	sandboxID := n.runPod("web")
	cfg := containerConfig("app", snapshotRef)
	cfg.Command, cfg.Stdin = []string{"sleep", "infinity"}, true
	resp, err := n.s.CreateContainer(context.Background(), &runtimeapi.CreateContainerRequest{PodSandboxId: sandboxID, Config: cfg})
	if err != nil {
		t.Fatal(err)
	}
	id := resp.GetContainerId()
	n.startContainer(id)
	select {
	case <-commandRuns:
	case <-time.After(time.Minute):
		t.Fatal("the command did not start in the guest")
	}

	n.restart()
	n.cocoon.reset()
	if err := n.s.Recover(context.Background()); err != nil {
		t.Fatal(err)
	}
	c := n.container(id)
	if c.State != store.ContainerExited || c.ExitCode != killedExitCode || c.Reason != reasonMainProcessLost {
		t.Fatalf("container %+v", c)
	}
	if vm, _ := n.cocoon.vm(c.VM.ID); vm.State != cocoon.VMStateStopped {
		t.Errorf("VM %s", vm.State)
	}
	wantCalls(t, "recover", n.cocoon.calls("VMList", "VMStop"), "VMList", "VMStop "+c.VM.ID)
}

// A cocoon that cannot list its VMs at start leaves running containers running: the periodic
// sweep checks them.
func TestRecoverWithoutCocoonKeepsRecords(t *testing.T) {
	n := newFakeNode(t, Config{})
	_, id := n.runningPod("web")
	n.restart()
	n.cocoon.failOnce("VMList", cocoonErr(nil, "database is locked", "vm", "list"))
	if err := n.s.Recover(context.Background()); err != nil {
		t.Fatal(err)
	}
	if c := n.container(id); c.State != store.ContainerRunning {
		t.Errorf("container %s", c.State)
	}
}

// The VM event stream: a VM that stops outside cocoon-cri turns its container EXITED, and the
// kubelet hears of it.
func TestWatchRecordsAVMThatStopped(t *testing.T) {
	n := newFakeNode(t, Config{})
	_, id := n.runningPod("web")
	sub := n.s.events.subscribe()
	defer n.s.events.unsubscribe(sub)
	ctx, cancel := context.WithCancel(context.Background())
	watched := make(chan struct{})
	go func() {
		defer close(watched)
		n.s.WatchVMs(ctx)
	}()
	defer func() { cancel(); <-watched }()

	n.cocoon.setVMState(n.container(id).VM.ID, cocoon.VMStateStopped)
	select {
	case ev := <-sub.ch:
		if ev.GetContainerId() != id || ev.GetContainerEventType() != runtimeapi.ContainerEventType_CONTAINER_STOPPED_EVENT {
			t.Fatalf("event %v", ev)
		}
	case <-time.After(time.Minute):
		t.Fatal("no event for the stopped VM")
	}
	if c := n.container(id); c.State != store.ContainerExited || c.Reason != reasonVMStopped || c.ExitCode != 0 {
		t.Errorf("container %+v", c)
	}
}
