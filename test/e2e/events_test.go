package e2e

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"

	"github.com/cocoonstack/cocoon-cri/pkg/store"
	"github.com/cocoonstack/cocoon-cri/test/stale"
	"github.com/cocoonstack/cocoon-cri/test/testproc"
)

// eventLog collects a GetContainerEvents stream.
type eventLog struct {
	mu     sync.Mutex
	events []*runtimeapi.ContainerEventResponse
}

// subscribe opens a GetContainerEvents stream that lives as long as the test.
func (n *node) subscribe() *eventLog {
	n.t.Helper()
	rt, _ := n.clients()
	ctx, cancel := context.WithCancel(context.Background())
	n.t.Cleanup(cancel)
	stream, err := rt.GetContainerEvents(ctx, &runtimeapi.GetEventsRequest{})
	if err != nil {
		n.t.Fatal(err)
	}
	l := &eventLog{}
	go func() {
		for {
			ev, err := stream.Recv()
			if err != nil {
				return
			}
			l.mu.Lock()
			l.events = append(l.events, ev)
			l.mu.Unlock()
		}
	}()
	return l
}

// kinds lists the event types seen for a container, in order.
func (l *eventLog) kinds(ctrID string) []string {
	l.mu.Lock()
	defer l.mu.Unlock()
	var out []string
	for _, ev := range l.events {
		if ev.GetContainerId() == ctrID {
			out = append(out, strings.TrimSuffix(strings.TrimPrefix(ev.GetContainerEventType().String(), "CONTAINER_"), "_EVENT"))
		}
	}
	return out
}

// waitKinds waits until the container's events are want.
func (n *node) waitKinds(l *eventLog, ctrID string, want ...string) {
	n.t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for strings.Join(l.kinds(ctrID), ",") != strings.Join(want, ",") {
		if time.Now().After(deadline) {
			n.t.Fatalf("events of %s: %v, want %v", ctrID, l.kinds(ctrID), want)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// TestVMsEndingBehindOurBackAreExited: a VM whose hypervisor is killed, one stopped with cocoon
// directly and one removed with cocoon directly: each container shows EXITED with the reason in
// crictl ps -a, and a GetContainerEvents subscriber saw its whole life.
func TestVMsEndingBehindOurBackAreExited(t *testing.T) {
	t.Parallel()
	n := newNode(t)
	n.withSnapshot()
	events := n.subscribe()
	_, crashed, _ := n.runningPod("crash", snapRef)
	_, stopped, _ := n.runningPod("stop", snapRef)
	_, gone, _ := n.runningPod("gone", snapRef)
	for _, id := range []string{crashed, stopped, gone} {
		n.waitKinds(events, id, "CREATED", "STARTED")
	}

	if err := syscall.Kill(n.vmPID(crashed), syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	stoppedVM, _ := field(n.inspect("inspect", stopped), "info", "vm", "id").(string)
	if _, err := n.cocoon("vm", "stop", stoppedVM); err != nil {
		t.Fatal(err)
	}
	goneVM, _ := field(n.inspect("inspect", gone), "info", "vm", "id").(string)
	if _, err := n.cocoon("vm", "rm", "--force", goneVM); err != nil {
		t.Fatal(err)
	}

	for id, want := range map[string]struct {
		reason string
		code   float64
	}{crashed: {"VMCrashed", 137}, stopped: {"VMStopped", 0}, gone: {"VMGone", 137}} {
		st := n.waitExited(id)
		if st["reason"] != want.reason || st["exitCode"] != want.code {
			t.Errorf("container %s: %v, want reason %s exit code %v", id, st, want.reason, want.code)
		}
		n.waitKinds(events, id, "CREATED", "STARTED", "STOPPED")
	}
	ps := n.mustCrictl("ps", "-a", "--state", "exited", "-q")
	for _, id := range []string{crashed, stopped, gone} {
		if !strings.Contains(ps, id) {
			t.Errorf("crictl ps -a --state exited does not list %s:\n%s", id, ps)
		}
	}
	// The kubelet's next container in the pod gets the pod interface back.
	n.mustCrictl("rm", crashed)
	n.waitKinds(events, crashed, "CREATED", "STARTED", "STOPPED", "DELETED")
}

// TestStartupReconcile: while cocoon-cri is down a VM crashes and the records of another pod are
// lost. At the next start the crashed container is EXITED, the unclaimed VM is reported (alert,
// the default) and then removed (destroy), and the lost pod's network namespace and IP lease are
// released.
func TestStartupReconcile(t *testing.T) {
	t.Parallel()
	n := newNode(t)
	n.withSnapshot()
	_, crashed, _ := n.runningPod("crash", snapRef)
	lostPod, lostCtr, _ := n.runningPod("lost", snapRef)
	lostVM, _ := field(n.inspect("inspect", lostCtr), "info", "vm", "id").(string)
	lostIP := n.podIP(lostPod)
	crashedPID := n.vmPID(crashed)
	if !leased(n, lostIP) {
		t.Fatalf("no host-local lease of %s under %s", lostIP, n.IPAMDir)
	}

	// One stream (after a restart of it, give its backoff a moment).
	for deadline := time.Now().Add(10 * time.Second); len(n.eventStreams()) != 1; time.Sleep(100 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("%d cocoon vm status streams run for the node, want 1", len(n.eventStreams()))
		}
	}
	n.Kill()
	// The event stream dies with cocoon-cri rather than linger.
	for deadline := time.Now().Add(10 * time.Second); len(n.eventStreams()) != 0; time.Sleep(100 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("cocoon vm status outlived a killed cocoon-cri: PIDs %v", n.eventStreams())
		}
	}
	if err := syscall.Kill(crashedPID, syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	st, err := store.Open(filepath.Join(n.StateDir, "cocoon-cri.db"))
	if err != nil {
		t.Fatal(err)
	}
	if err := errors.Join(st.Containers.Delete(lostCtr), st.Sandboxes.Delete(lostPod), st.Close()); err != nil {
		t.Fatal(err)
	}

	n.Start()
	if s := n.inspect("inspect", crashed)["status"].(map[string]any); s["state"] != "CONTAINER_EXITED" || s["reason"] != "VMCrashed" {
		t.Fatalf("a container whose VM died while cocoon-cri was down: %v", s)
	}
	if !strings.Contains(n.Log(), "orphan VM") {
		t.Fatalf("the unclaimed VM was not reported:\n%s", n.Log())
	}
	if _, err := n.vm(lostVM); err != nil {
		t.Fatalf("the alert policy removed the orphan: %v", err)
	}
	for _, ns := range n.netns() {
		if strings.HasPrefix(ns, "cocoon-cri-"+lostPod[:16]) {
			t.Fatalf("the lost pod's network namespace %s is left", ns)
		}
	}
	if leased(n, lostIP) {
		t.Fatalf("the lost pod's IP %s is still leased", lostIP)
	}

	n.Stop()
	n.Extra = append(n.Extra, "--orphan-policy", "destroy")
	n.Start()
	if _, err := n.vm(lostVM); err == nil {
		t.Fatal("the destroy policy left the orphan VM")
	}
}

// leased reports whether host-local IPAM holds ip for some container.
func leased(n *node, ip string) bool {
	found := false
	_ = filepath.WalkDir(n.IPAMDir, func(path string, d fs.DirEntry, err error) error {
		if err == nil && !d.IsDir() && d.Name() == ip {
			found = true
		}
		return nil
	})
	return found
}

// TestFiftyPodsInParallel: 50 pods started at once, as a kubelet does after a node reboot, all
// run, each in its own VM; removed at once, they leave nothing behind.
func TestFiftyPodsInParallel(t *testing.T) {
	t.Parallel()
	n := newNode(t)
	n.withSnapshot()
	const pods = 50
	ids := make([]string, pods)
	errs := make([]error, pods)
	var wg sync.WaitGroup
	for i := range pods {
		wg.Go(func() {
			name := fmt.Sprintf("par%02d", i)
			podFile := n.configFile(name+"-pod.json", n.podConfig(name, "uid-"+name))
			ctrFile := n.configFile(name+"-ctr.json", containerConfig("app", snapRef))
			// crictl run: runp, create and start in one go.
			ids[i], errs[i] = n.crictl("run", "--no-pull", "--runtime", "cocoon", ctrFile, podFile)
		})
	}
	wg.Wait()
	if err := errors.Join(errs...); err != nil {
		t.Fatal(err)
	}
	running := strings.Fields(n.mustCrictl("ps", "-q", "--state", "running"))
	if len(running) != pods {
		t.Fatalf("%d containers running, want %d", len(running), pods)
	}
	vmRunning := 0
	for _, vm := range n.vms() {
		if testproc.Running(vm.PID) {
			vmRunning++
		}
	}
	if vmRunning != pods {
		t.Fatalf("%d VMs running, want %d", vmRunning, pods)
	}
	podIDs := strings.Fields(n.mustCrictl("pods", "-q"))
	for i, podID := range podIDs {
		wg.Go(func() { _, errs[i] = n.crictl("rmp", "--force", podID) })
	}
	wg.Wait()
	if err := errors.Join(errs...); err != nil {
		t.Fatal(err)
	}
	if left := n.leftovers(); len(left) != 0 {
		t.Fatalf("left behind: %v", left)
	}
	if vms := n.vms(); len(vms) != 0 {
		t.Fatalf("%d VMs left", len(vms))
	}
}

// eventStreams lists the PIDs of cocoon vm status processes running on this node's cocoon dirs.
func (n *node) eventStreams() []int {
	return stale.ProcessesWhose(func(args string) bool {
		return strings.Contains(args, n.RootDir+"\x00") && strings.Contains(args, "\x00status\x00--event")
	})
}
