package vmruntime

import (
	"context"
	"slices"
	"strings"
	"testing"

	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"

	"github.com/cocoonstack/cocoon-cri/pkg/cocoon"
	"github.com/cocoonstack/cocoon-cri/pkg/store"
	"github.com/cocoonstack/cocoon-cri/tapmanager"
)

// A stopped VM stays wired to the pod interface until something needs it: the pod's next VM (a
// restart) is wired in its place, the counters are read, the removal of the VM it no longer serves
// changes nothing, and the pod's CNI DEL, which the kubelet runs before removing the exited
// containers, finds it as the cluster's CNI left it. Nothing is left behind.
func TestAStoppedVMStaysWiredToThePodInterfaceUntilNeeded(t *testing.T) {
	n := newFakeNode(t, Config{})
	ctx := context.Background()
	sandboxID, first := n.runningPod("web")
	stop := func(id string) {
		t.Helper()
		if _, err := n.s.StopContainer(ctx, &runtimeapi.StopContainerRequest{ContainerId: id, Timeout: 5}); err != nil {
			t.Fatal(err)
		}
	}
	interfaceIn := func(when, want string) {
		t.Helper()
		if at := n.net.servedBy(sandboxID); at != want {
			t.Fatalf("%s: the pod interface serves %q, want %q", when, at, want)
		}
	}

	n.net.reset()
	stop(first)
	wantCalls(t, "stop: network", n.net.calls())
	interfaceIn("after the stop", n.container(first).VM.NetNS)
	stats, err := n.s.PodSandboxStats(ctx, &runtimeapi.PodSandboxStatsRequest{PodSandboxId: sandboxID})
	if err != nil || stats.GetStats().GetLinux().GetNetwork().GetDefaultInterface().GetName() != tapmanager.PodIfName {
		t.Fatalf("the pod's network usage while a stopped VM holds the interface: %v, %v", stats, err)
	}

	second := n.createContainer(sandboxID, "app-restarted", snapshotRef)
	n.startContainer(second)
	interfaceIn("after the restart", n.container(second).VM.NetNS)
	if _, err := n.s.RemoveContainer(ctx, &runtimeapi.RemoveContainerRequest{ContainerId: first}); err != nil {
		t.Fatal(err)
	}
	interfaceIn("after the first VM's removal", n.container(second).VM.NetNS)

	stop(second)
	n.net.reset()
	if _, err := n.s.StopPodSandbox(ctx, &runtimeapi.StopPodSandboxRequest{PodSandboxId: sandboxID}); err != nil {
		t.Fatal(err)
	}
	got := n.net.calls("ReclaimFromVM", "Del")
	if len(got) != 2 || got[0] != "ReclaimFromVM "+sandboxID+" "+n.container(second).VM.NetNS || got[1] != "Del "+sandboxID {
		t.Errorf("StopPodSandbox's network calls %q: the interface must be back before the DEL", got)
	}
	if held := n.net.held(); slices.ContainsFunc(held, func(h string) bool { return strings.HasPrefix(h, "unreleased ") || strings.HasPrefix(h, "interface ") }) {
		t.Errorf("the pod's DEL missed its interface: %q", held)
	}
	if _, err := n.s.RemoveContainer(ctx, &runtimeapi.RemoveContainerRequest{ContainerId: second}); err != nil {
		t.Fatal(err)
	}
	if _, err := n.s.RemovePodSandbox(ctx, &runtimeapi.RemovePodSandboxRequest{PodSandboxId: sandboxID}); err != nil {
		t.Fatal(err)
	}
	if held := n.net.held(); len(held) != 0 {
		t.Errorf("the network holds %q after the pod went", held)
	}
}

// A VM that ended on its own, and a hibernated one the kubelet stops, keep the interface as a
// stopped one does; the pod's CNI DEL still finds it home.
func TestEndedVMsGiveTheInterfaceBackForThePodsDEL(t *testing.T) {
	ctx := context.Background()
	for _, end := range []string{"ended", "hibernated"} {
		t.Run(end, func(t *testing.T) {
			var n *fakeNode
			if end == "hibernated" {
				n, _ = hibernatingNode(t)
			} else {
				n = newFakeNode(t, Config{})
			}
			sandboxID, containerID := n.runningPod("web")
			vm := n.container(containerID).VM
			switch end {
			case "ended":
				n.cocoon.setVMState(vm.ID, cocoon.VMStateStopped)
				n.restartAndRecover()
			case "hibernated":
				n.idleUntilHibernated(containerID)
				if _, err := n.s.StopContainer(ctx, &runtimeapi.StopContainerRequest{ContainerId: containerID, Timeout: 5}); err != nil {
					t.Fatal(err)
				}
			}
			if c := n.container(containerID); c.State != store.ContainerExited {
				t.Fatalf("the container is %s", c.State)
			}
			if at := n.net.servedBy(sandboxID); at != vm.NetNS {
				t.Errorf("the pod interface serves %q, want the VM's %q", at, vm.NetNS)
			}
			if _, err := n.s.StopPodSandbox(ctx, &runtimeapi.StopPodSandboxRequest{PodSandboxId: sandboxID}); err != nil {
				t.Fatal(err)
			}
			if held := n.net.held(); slices.ContainsFunc(held, func(h string) bool { return strings.HasPrefix(h, "unreleased ") }) {
				t.Errorf("the pod's DEL missed its interface: %q", held)
			}
			if _, err := n.s.RemovePodSandbox(ctx, &runtimeapi.RemovePodSandboxRequest{PodSandboxId: sandboxID}); err != nil {
				t.Fatal(err)
			}
			if held := n.net.held(); len(held) != 0 {
				t.Errorf("the network holds %q after the pod went", held)
			}
		})
	}
}
