package vmruntime

import (
	"context"
	"encoding/json"
	"errors"
	"slices"
	"strings"
	"testing"

	"github.com/cocoonstack/cocoon-cri/cri/grpcerr"

	"google.golang.org/grpc/codes"
	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"

	"github.com/cocoonstack/cocoon-cri/pkg/cocoon"
	"github.com/cocoonstack/cocoon-cri/pkg/store"
)

// The lifecycle RPCs end to end, in process: the real server, store and image service over the
// fakes of cocoon and the pod network (fake_node_test.go). test/e2e runs the same lives against
// the cocoon simulator, real namespaces and CNI.

// vmCalls are the calls that make, change or remove VMs.
func vmCalls(fc *fakeCocoon) []string {
	return fc.calls("VMClone", "VMCreate", "VMStart", "VMStop", "VMRemove", "VMInspect", "VMHibernate", "VMRestore")
}

func TestClonedPodLife(t *testing.T) {
	n := newFakeNode(t, Config{})
	ctx := context.Background()
	img := n.importSnapshot(snapshotRef, appSnapshot())

	sandboxID := n.runPod("web")
	sb := n.sandbox(sandboxID)
	if sb.State != store.SandboxReady || sb.NetNS != n.net.NetNSPath(sandboxID) || len(sb.Network.IPs) != 1 || sb.Network.MAC == "" {
		t.Fatalf("sandbox %+v, network %+v", sb, sb.Network)
	}
	wantCalls(t, "network", n.net.calls(), "Load ", "CreateNetNS "+sb.NetNS, "Add "+sandboxID+" podnet", "PrepareCocoon "+sandboxID)
	status, err := n.s.PodSandboxStatus(ctx, &runtimeapi.PodSandboxStatusRequest{PodSandboxId: sandboxID})
	if err != nil || status.GetStatus().GetState() != runtimeapi.PodSandboxState_SANDBOX_READY || status.GetStatus().GetNetwork().GetIp() != sb.Network.IPs[0] {
		t.Fatalf("PodSandboxStatus %v, %v", status, err)
	}

	containerID := n.createContainer(sandboxID, "app", snapshotRef)
	c := n.container(containerID)
	if c.State != store.ContainerCreated || c.VM.Mode != store.VMClone || c.VM.Source != img.LocalName || c.VM.CPU != 2 || c.VM.Memory != 1<<30 ||
		!strings.HasPrefix(c.VM.Name, VMNamePrefix+containerID[:12]+"-web-app") {
		t.Fatalf("created container %+v", c)
	}
	if calls := vmCalls(n.cocoon); len(calls) != 0 {
		t.Fatalf("CreateContainer called cocoon: %q", calls)
	}

	n.startContainer(containerID)
	c = n.container(containerID)
	vm, ok := n.cocoon.vm(c.VM.Name)
	if !ok || vm.State != cocoon.VMStateRunning || c.State != store.ContainerRunning || c.VM.ID != vm.ID || c.VM.PID != vm.PID ||
		c.VM.NetNS != vm.NetworkConfigs[0].NetnsPath || c.VM.APISocket != vm.SocketPath || c.VM.COWPath == "" || c.StartedAt == 0 {
		t.Fatalf("started container %+v, VM %+v", c, vm)
	}
	if dir := n.cocoon.vmConfDir(vm.ID); dir != n.net.CocoonConfDir(sandboxID) {
		t.Errorf("the VM was made with --cni-conf-dir %q, not the sandbox's %q", dir, n.net.CocoonConfDir(sandboxID))
	}
	wantCalls(t, "start", vmCalls(n.cocoon), "VMClone "+c.VM.Name+" "+img.LocalName)
	cs, err := n.s.ContainerStatus(ctx, &runtimeapi.ContainerStatusRequest{ContainerId: containerID})
	if err != nil || cs.GetStatus().GetState() != runtimeapi.ContainerState_CONTAINER_RUNNING {
		t.Fatalf("ContainerStatus %v, %v", cs, err)
	}

	n.net.reset()
	if _, err := n.s.StopContainer(ctx, &runtimeapi.StopContainerRequest{ContainerId: containerID, Timeout: 30}); err != nil {
		t.Fatal(err)
	}
	c = n.container(containerID)
	if c.State != store.ContainerExited || c.ExitCode != 0 || c.Reason != reasonCompleted || c.VM.PID != 0 || c.FinishedAt == 0 {
		t.Fatalf("stopped container %+v", c)
	}
	if vm, _ := n.cocoon.vm(c.VM.ID); vm.State != cocoon.VMStateStopped {
		t.Errorf("VM %s after the stop", vm.State)
	}
	// The pod interface stays wired to the stopped VM: nothing changes at a stop.
	wantCalls(t, "stop: network", n.net.calls())
	if at := n.net.servedBy(sandboxID); at != c.VM.NetNS {
		t.Errorf("after the stop the pod interface serves %q, want the stopped VM's %q", at, c.VM.NetNS)
	}

	if _, err := n.s.RemoveContainer(ctx, &runtimeapi.RemoveContainerRequest{ContainerId: containerID}); err != nil {
		t.Fatal(err)
	}
	if _, err := n.st.Containers.Get(containerID); !errors.Is(err, store.ErrNotFound) {
		t.Fatalf("container record after removal: %v", err)
	}
	if names := n.cocoon.vmNames(); len(names) != 0 {
		t.Fatalf("VMs left in cocoon: %q", names)
	}
	wantCalls(t, "VM", vmCalls(n.cocoon), "VMClone "+c.VM.Name+" "+img.LocalName, "VMStop "+c.VM.ID, "VMRemove "+c.VM.ID)
	if at := n.net.interfaceAt(sandboxID); at != sb.NetNS {
		t.Errorf("after vm rm the pod interface is in %q, want the pod's %q", at, sb.NetNS)
	}

	n.net.reset()
	if _, err := n.s.StopPodSandbox(ctx, &runtimeapi.StopPodSandboxRequest{PodSandboxId: sandboxID}); err != nil {
		t.Fatal(err)
	}
	if sb := n.sandbox(sandboxID); sb.State != store.SandboxNotReady || !sb.Network.Released {
		t.Fatalf("stopped sandbox %+v", sb)
	}
	if _, err := n.s.RemovePodSandbox(ctx, &runtimeapi.RemovePodSandboxRequest{PodSandboxId: sandboxID}); err != nil {
		t.Fatal(err)
	}
	wantCalls(t, "network", n.net.calls(), "RestorePodInterface "+sandboxID, "Del "+sandboxID, "RemoveCocoon "+sandboxID, "RemoveNetNS "+sb.NetNS)
	if held := n.net.held(); len(held) != 0 {
		t.Errorf("the network holds %q after the pod went", held)
	}
	if left := n.st.Sandboxes.List(nil); len(left) != 0 {
		t.Errorf("sandbox records left: %d", len(left))
	}
	// The image stays: only its removal gives up its snapshot.
	if snaps := n.cocoon.snapshotNames(); !slices.Equal(snaps, []string{img.LocalName}) {
		t.Errorf("snapshots %q", snaps)
	}
}

func TestBootedPodLife(t *testing.T) {
	n := newFakeNode(t, Config{})
	ctx := context.Background()
	img := n.importCloudImage(cloudRef)
	sandboxID := n.runPod("vm")
	containerID := n.createContainer(sandboxID, "os", cloudRef)
	c := n.container(containerID)
	if c.VM.Mode != store.VMBoot || c.VM.Source != img.LocalName || c.VM.CPU != 1 || c.VM.Memory != 1<<30 || c.VM.Storage != MinStorage || c.VM.DirectBoot {
		t.Fatalf("created container %+v", c.VM)
	}
	n.startContainer(containerID)
	c = n.container(containerID)
	if c.State != store.ContainerRunning || c.VM.ID == "" {
		t.Fatalf("started container %+v", c)
	}
	// The VM ID is recorded between create and start, so a crash between them leaves a VM
	// cocoon-cri can name.
	wantCalls(t, "start", vmCalls(n.cocoon), "VMCreate "+c.VM.Name+" "+img.LocalName, "VMStart "+c.VM.ID, "VMInspect "+c.VM.ID)

	// A stop with no time for the guest is a forced one.
	if _, err := n.s.StopContainer(ctx, &runtimeapi.StopContainerRequest{ContainerId: containerID}); err != nil {
		t.Fatal(err)
	}
	c = n.container(containerID)
	if c.State != store.ContainerExited || c.ExitCode != killedExitCode || c.Reason != reasonError || !strings.Contains(c.Message, "timeout 0") {
		t.Fatalf("stopped container %+v", c)
	}
	if _, err := n.s.RemovePodSandbox(ctx, &runtimeapi.RemovePodSandboxRequest{PodSandboxId: sandboxID}); err != nil {
		t.Fatal(err)
	}
	if names := n.cocoon.vmNames(); len(names) != 0 {
		t.Errorf("VMs left in cocoon: %q", names)
	}
	if held := n.net.held(); len(held) != 0 {
		t.Errorf("the network holds %q after the pod went", held)
	}
	if left := n.st.Containers.List(nil); len(left) != 0 {
		t.Errorf("container records left: %d", len(left))
	}
}

// A direct-boot cloud-hypervisor guest is asked to power off through the exec path first: cocoon
// would end it at once. Without a way into the guest it is stopped forcibly, and says why.
func TestStopOfADirectBootGuest(t *testing.T) {
	for _, tc := range []struct {
		name   string
		caps   cocoon.Capabilities
		code   int32
		reason string
		calls  []string
	}{
		{"no exec path", capsV038, killedExitCode, reasonError, []string{"VMStop"}},
		{"agent", capsV05, 0, reasonCompleted, []string{"VMExec poweroff", "VMStop"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			n := newFakeNode(t, Config{})
			n.cocoon.setCaps(tc.caps)
			direct := appSnapshot()
			direct.ImageType = cocoon.ImageTypeOCI
			n.importSnapshot(snapshotRef, direct)
			sandboxID := n.runPod("web")
			containerID := n.createContainer(sandboxID, "app", snapshotRef)
			n.startContainer(containerID)
			settle(n.s)
			n.cocoon.reset()
			if _, err := n.s.StopContainer(context.Background(), &runtimeapi.StopContainerRequest{ContainerId: containerID, Timeout: 10}); err != nil {
				t.Fatal(err)
			}
			c := n.container(containerID)
			if c.ExitCode != tc.code || c.Reason != tc.reason {
				t.Fatalf("stopped container: %d %s %q", c.ExitCode, c.Reason, c.Message)
			}
			var got []string
			for _, call := range n.cocoon.calls("VMExec", "VMStop") {
				method, args, _ := strings.Cut(call, " ")
				if method == "VMExec" {
					method += " " + strings.Fields(args)[1]
				}
				got = append(got, method)
			}
			wantCalls(t, "stop", got, tc.calls...)
		})
	}
}

// A power-off through the agent that comes before anything learned the VM's exec path (a stop
// right after the start, the guest's set-up still running) does not record the path: the VM will
// take no other command, and the record would be one more synced commit in StopContainer.
func TestPowerOffRecordsNoExecPath(t *testing.T) {
	n := newFakeNode(t, Config{})
	n.cocoon.setCaps(capsV05)
	direct := appSnapshot()
	direct.ImageType = cocoon.ImageTypeOCI
	n.importSnapshot(snapshotRef, direct)
	_, containerID := n.runningPod("web")
	settle(n.s)
	if _, err := n.st.Containers.Modify(containerID, func(r *store.Container) error {
		r.VM.GuestExec, r.VM.GuestExecKnown = "", false
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	n.cocoon.reset()
	if _, err := n.s.StopContainer(context.Background(), &runtimeapi.StopContainerRequest{ContainerId: containerID, Timeout: 10}); err != nil {
		t.Fatal(err)
	}
	c := n.container(containerID)
	if c.Reason != reasonCompleted || c.VM.GuestExecKnown {
		t.Fatalf("stopped container: %s %q, exec path known %v (%q)", c.Reason, c.Message, c.VM.GuestExecKnown, c.VM.GuestExec)
	}
	if execs := n.cocoon.calls("VMExec"); len(execs) != 1 || !strings.Contains(execs[0], "poweroff") {
		t.Fatalf("execs %q, want the power-off", execs)
	}
}

// On v0.5 the guest is configured for the pod through vm exec once it answers, and a clone is
// reseeded; StartContainer does not wait for either.
func TestStartConfiguresTheGuestThroughTheAgent(t *testing.T) {
	n := newFakeNode(t, Config{})
	n.cocoon.setCaps(capsV05)
	_, containerID := n.runningPod("web")
	settle(n.s)
	c := n.container(containerID)
	wantCalls(t, "guest", n.cocoon.calls("VMExec", "VMReseed"), "VMExec "+c.VM.ID+" /bin/sh", "VMReseed "+c.VM.ID)
	if !c.VM.GuestExecKnown || c.VM.GuestExec != ExecPathAgent {
		t.Errorf("the container did not learn its exec path: %+v", c.VM)
	}
}

// A start that fails removes what it made and leaves the container EXITED with StartError
// (docs/cri-support.md), so the kubelet makes a new one.
func TestFailedStartLeavesNoVM(t *testing.T) {
	for _, tc := range []struct {
		name, method string
		boot         bool
	}{
		{"clone fails", "VMClone", false},
		{"boot fails after create", "VMStart", true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			n := newFakeNode(t, Config{})
			ref := snapshotRef
			if tc.boot {
				n.importCloudImage(cloudRef)
				ref = cloudRef
			} else {
				n.importSnapshot(snapshotRef, appSnapshot())
			}
			sandboxID := n.runPod("web")
			containerID := n.createContainer(sandboxID, "app", ref)
			sub := n.s.events.subscribe()
			defer n.s.events.unsubscribe(sub)
			n.cocoon.failOnce(tc.method, cocoonErr(nil, "hypervisor did not come up", "vm"))
			_, err := n.s.StartContainer(context.Background(), &runtimeapi.StartContainerRequest{ContainerId: containerID})
			if err == nil || !strings.Contains(err.Error(), "hypervisor did not come up") {
				t.Fatalf("StartContainer: %v", err)
			}
			c := n.container(containerID)
			if c.State != store.ContainerExited || c.ExitCode != startErrorExitCode || c.Reason != reasonStartError ||
				!strings.Contains(c.Message, "hypervisor did not come up") || c.VM.ID != "" || c.VM.PID != 0 {
				t.Fatalf("container after a failed start %+v", c)
			}
			if names := n.cocoon.vmNames(); len(names) != 0 {
				t.Fatalf("a failed start left VMs %q", names)
			}
			if calls := n.cocoon.calls("VMRemove"); len(calls) != 1 || calls[0] != "VMRemove "+c.VM.Name {
				t.Errorf("clean-up calls %q, want the VM removed by its name", calls)
			}
			select {
			case ev := <-sub.ch:
				if ev.GetContainerEventType() != runtimeapi.ContainerEventType_CONTAINER_STOPPED_EVENT || ev.GetContainerId() != containerID {
					t.Errorf("event %v", ev)
				}
			default:
				t.Error("no event for the failed start")
			}
			// The kubelet removes it and makes another, which starts.
			if _, err := n.s.RemoveContainer(context.Background(), &runtimeapi.RemoveContainerRequest{ContainerId: containerID}); err != nil {
				t.Fatal(err)
			}
			n.startContainer(n.createContainer(sandboxID, "app2", ref))
			if names := n.cocoon.vmNames(); len(names) != 1 {
				t.Errorf("VMs %q after the next start", names)
			}
		})
	}
}

// A VM already holding the container's name was left by a start a crash cut short: it is
// removed and the start made again.
func TestStartReplacesALeftoverVM(t *testing.T) {
	n := newFakeNode(t, Config{})
	n.importSnapshot(snapshotRef, appSnapshot())
	sandboxID := n.runPod("web")
	containerID := n.createContainer(sandboxID, "app", snapshotRef)
	c := n.container(containerID)
	leftover := n.cocoon.addVM(cocoon.VM{State: cocoon.VMStateError, Config: cocoon.VMConfig{Name: c.VM.Name}})
	n.startContainer(containerID)
	c = n.container(containerID)
	if c.State != store.ContainerRunning || c.VM.ID == leftover.ID {
		t.Fatalf("container %+v", c)
	}
	if _, ok := n.cocoon.vm(leftover.ID); ok {
		t.Error("the leftover VM is still there")
	}
	wantCalls(t, "start", vmCalls(n.cocoon), "VMClone "+c.VM.Name+" "+c.VM.Source, "VMRemove "+c.VM.Name, "VMClone "+c.VM.Name+" "+c.VM.Source)
}

func TestStopAndRemoveAreIdempotent(t *testing.T) {
	n := newFakeNode(t, Config{})
	ctx := context.Background()
	sandboxID, containerID := n.runningPod("web")
	for range 2 {
		if _, err := n.s.StopContainer(ctx, &runtimeapi.StopContainerRequest{ContainerId: containerID, Timeout: 5}); err != nil {
			t.Fatal(err)
		}
	}
	if calls := n.cocoon.calls("VMStop"); len(calls) != 1 {
		t.Errorf("a second stop called cocoon: %q", calls)
	}
	for range 2 {
		if _, err := n.s.RemoveContainer(ctx, &runtimeapi.RemoveContainerRequest{ContainerId: containerID}); err != nil {
			t.Fatal(err)
		}
	}
	for range 2 {
		if _, err := n.s.StopPodSandbox(ctx, &runtimeapi.StopPodSandboxRequest{PodSandboxId: sandboxID}); err != nil {
			t.Fatal(err)
		}
	}
	if calls := n.net.calls("Del"); len(calls) != 1 {
		t.Errorf("CNI DEL ran %d times, want once", len(calls))
	}
	for range 2 {
		if _, err := n.s.RemovePodSandbox(ctx, &runtimeapi.RemovePodSandboxRequest{PodSandboxId: sandboxID}); err != nil {
			t.Fatal(err)
		}
	}
	// Unknown IDs: done already.
	if _, err := n.s.StopContainer(ctx, &runtimeapi.StopContainerRequest{ContainerId: "0123456789ab"}); err != nil {
		t.Error(err)
	}
	if _, err := n.s.RemoveContainer(ctx, &runtimeapi.RemoveContainerRequest{ContainerId: "0123456789ab"}); err != nil {
		t.Error(err)
	}
	if _, err := n.s.StopPodSandbox(ctx, &runtimeapi.StopPodSandboxRequest{PodSandboxId: "0123456789ab"}); err != nil {
		t.Error(err)
	}
	if _, err := n.s.RemovePodSandbox(ctx, &runtimeapi.RemovePodSandboxRequest{PodSandboxId: "0123456789ab"}); err != nil {
		t.Error(err)
	}
	if held := n.net.held(); len(held) != 0 {
		t.Errorf("the network holds %q", held)
	}
	if names := n.cocoon.vmNames(); len(names) != 0 {
		t.Errorf("VMs left: %q", names)
	}
}

// A VM removed from cocoon behind cocoon-cri's back: the stop records it gone, and the removal
// finds nothing to remove.
func TestStopAndRemoveOfAVanishedVM(t *testing.T) {
	n := newFakeNode(t, Config{})
	ctx := context.Background()
	sandboxID, containerID := n.runningPod("web")
	n.cocoon.forgetVM(n.container(containerID).VM.ID)
	if _, err := n.s.StopContainer(ctx, &runtimeapi.StopContainerRequest{ContainerId: containerID, Timeout: 5}); err != nil {
		t.Fatal(err)
	}
	c := n.container(containerID)
	if c.State != store.ContainerExited || c.ExitCode != killedExitCode || c.Reason != reasonVMGone {
		t.Fatalf("container %+v", c)
	}
	if calls := n.net.calls("ReclaimFromVM"); len(calls) != 1 {
		t.Errorf("the pod interface was not taken back: %q", calls)
	}
	if _, err := n.s.RemovePodSandbox(ctx, &runtimeapi.RemovePodSandboxRequest{PodSandboxId: sandboxID}); err != nil {
		t.Fatal(err)
	}
	if left := n.st.Containers.List(nil); len(left) != 0 {
		t.Errorf("container records left: %d", len(left))
	}
}

// RemovePodSandbox of a pod whose container still runs removes the VM forcibly, as the CRI asks.
func TestRemoveOfARunningPod(t *testing.T) {
	n := newFakeNode(t, Config{})
	sandboxID, containerID := n.runningPod("web")
	if _, err := n.s.RemovePodSandbox(context.Background(), &runtimeapi.RemovePodSandboxRequest{PodSandboxId: sandboxID}); err != nil {
		t.Fatal(err)
	}
	if names := n.cocoon.vmNames(); len(names) != 0 {
		t.Errorf("VMs left: %q", names)
	}
	if held := n.net.held(); len(held) != 0 {
		t.Errorf("the network holds %q", held)
	}
	if left := n.st.Containers.List(nil); len(left) != 0 {
		t.Errorf("container records left: %d", len(left))
	}
	if n.s.ioOf(containerID) != nil {
		t.Error("streams left open")
	}
}

// StopPodSandbox stops a running VM forcibly: the kubelet has stopped the containers gracefully
// first.
func TestStopPodSandboxStopsItsVM(t *testing.T) {
	n := newFakeNode(t, Config{})
	sandboxID, containerID := n.runningPod("web")
	if _, err := n.s.StopPodSandbox(context.Background(), &runtimeapi.StopPodSandboxRequest{PodSandboxId: sandboxID}); err != nil {
		t.Fatal(err)
	}
	c := n.container(containerID)
	if c.State != store.ContainerExited || c.ExitCode != killedExitCode {
		t.Fatalf("container %+v", c)
	}
	if sb := n.sandbox(sandboxID); sb.State != store.SandboxNotReady || !sb.Network.Released {
		t.Fatalf("sandbox %+v", sb)
	}
	// The order matters: the VM gives the pod interface back before CNI DEL releases it.
	got := n.net.calls("ReclaimFromVM", "Del")
	if len(got) != 2 || !strings.HasPrefix(got[0], "ReclaimFromVM") || got[1] != "Del "+sandboxID {
		t.Errorf("network calls %q", got)
	}
	_, err := n.s.CreateContainer(context.Background(), &runtimeapi.CreateContainerRequest{PodSandboxId: sandboxID, Config: containerConfig("late", snapshotRef)})
	wantCode(t, err, codes.FailedPrecondition)
}

func TestLifecycleRefusals(t *testing.T) {
	n := newFakeNode(t, Config{})
	ctx := context.Background()
	n.importSnapshot(snapshotRef, appSnapshot())
	sandboxID := n.runPod("web")
	n.net.reset()

	hostNetwork := podConfig("host")
	hostNetwork.Linux = &runtimeapi.LinuxPodSandboxConfig{SecurityContext: &runtimeapi.LinuxSandboxSecurityContext{
		NamespaceOptions: &runtimeapi.NamespaceOption{Network: runtimeapi.NamespaceMode_NODE},
	}}
	badAnnotation := podConfig("bad")
	badAnnotation.Annotations = map[string]string{AnnotationStorage: "lots"}
	otherNetwork := podConfig("other")
	otherNetwork.Annotations = map[string]string{AnnotationNetwork: "management"}
	relativeLogs, escapingLogs := podConfig("rel"), podConfig("esc")
	relativeLogs.LogDirectory, escapingLogs.LogDirectory = "var/log/pods/x", "/var/log/pods/../../../tmp"
	for _, tc := range []struct {
		name string
		req  *runtimeapi.RunPodSandboxRequest
		code codes.Code
	}{
		{"no config", &runtimeapi.RunPodSandboxRequest{RuntimeHandler: HandlerName}, codes.InvalidArgument},
		{"no metadata", &runtimeapi.RunPodSandboxRequest{Config: &runtimeapi.PodSandboxConfig{}, RuntimeHandler: HandlerName}, codes.InvalidArgument},
		{"other handler", &runtimeapi.RunPodSandboxRequest{Config: podConfig("x"), RuntimeHandler: "runc"}, codes.InvalidArgument},
		{"default handler", &runtimeapi.RunPodSandboxRequest{Config: podConfig("x")}, codes.InvalidArgument},
		{"host network", &runtimeapi.RunPodSandboxRequest{Config: hostNetwork, RuntimeHandler: HandlerName}, codes.InvalidArgument},
		{"bad annotation", &runtimeapi.RunPodSandboxRequest{Config: badAnnotation, RuntimeHandler: HandlerName}, codes.InvalidArgument},
		{"network not allowed", &runtimeapi.RunPodSandboxRequest{Config: otherNetwork, RuntimeHandler: HandlerName}, codes.InvalidArgument},
		{"relative log directory", &runtimeapi.RunPodSandboxRequest{Config: relativeLogs, RuntimeHandler: HandlerName}, codes.InvalidArgument},
		{"unclean log directory", &runtimeapi.RunPodSandboxRequest{Config: escapingLogs, RuntimeHandler: HandlerName}, codes.InvalidArgument},
		{"name taken", &runtimeapi.RunPodSandboxRequest{Config: podConfig("web"), RuntimeHandler: HandlerName}, codes.AlreadyExists},
	} {
		_, err := n.s.RunPodSandbox(ctx, tc.req)
		if grpcerr.Code(err) != tc.code {
			t.Errorf("RunPodSandbox, %s: %v, want %s", tc.name, err, tc.code)
		}
	}
	if calls := n.net.calls("CreateNetNS", "Add"); len(calls) != 0 {
		t.Errorf("refused sandboxes reached the network: %q", calls)
	}
	if got := len(n.st.Sandboxes.List(nil)); got != 1 {
		t.Errorf("%d sandbox records, want 1", got)
	}

	noName := containerConfig("", snapshotRef)
	badEnv := containerConfig("env", snapshotRef)
	badEnv.Envs = []*runtimeapi.KeyValue{{Key: "A=B", Value: []byte("x")}}
	escapingLog, absoluteLog := containerConfig("esc", snapshotRef), containerConfig("abs", snapshotRef)
	escapingLog.LogPath, absoluteLog.LogPath = "../../../../tmp/x.log", "/tmp/x.log"
	for _, tc := range []struct {
		name    string
		sandbox string
		cfg     *runtimeapi.ContainerConfig
		code    codes.Code
	}{
		{"no config", sandboxID, nil, codes.InvalidArgument},
		{"no name", sandboxID, noName, codes.InvalidArgument},
		{"no image", sandboxID, containerConfig("app", ""), codes.InvalidArgument},
		{"bad env", sandboxID, badEnv, codes.InvalidArgument},
		{"log path leaving the log directory", sandboxID, escapingLog, codes.InvalidArgument},
		{"absolute log path", sandboxID, absoluteLog, codes.InvalidArgument},
		{"image not on the node", sandboxID, containerConfig("app", "cocoon.local/missing:v1"), codes.NotFound},
		{"no sandbox ID", "", containerConfig("app", snapshotRef), codes.InvalidArgument},
	} {
		_, err := n.s.CreateContainer(ctx, &runtimeapi.CreateContainerRequest{PodSandboxId: tc.sandbox, Config: tc.cfg})
		if grpcerr.Code(err) != tc.code {
			t.Errorf("CreateContainer, %s: %v, want %s", tc.name, err, tc.code)
		}
	}
	_, err := n.s.CreateContainer(ctx, &runtimeapi.CreateContainerRequest{PodSandboxId: "0123456789ab", Config: containerConfig("app", snapshotRef)})
	if !errors.Is(err, store.ErrNotFound) {
		t.Errorf("CreateContainer in an unknown sandbox: %v, want not found", err)
	}
	first := n.createContainer(sandboxID, "app", snapshotRef)
	_, err = n.s.CreateContainer(ctx, &runtimeapi.CreateContainerRequest{PodSandboxId: sandboxID, Config: containerConfig("app", snapshotRef)})
	wantCode(t, err, codes.AlreadyExists)

	_, err = n.s.StartContainer(ctx, &runtimeapi.StartContainerRequest{})
	wantCode(t, err, codes.InvalidArgument)
	if _, err := n.s.StartContainer(ctx, &runtimeapi.StartContainerRequest{ContainerId: "0123456789ab"}); !errors.Is(err, store.ErrNotFound) {
		t.Errorf("StartContainer of an unknown container: %v, want not found", err)
	}
	second := n.createContainer(sandboxID, "sidecar", snapshotRef)
	n.startContainer(first)
	_, err = n.s.StartContainer(ctx, &runtimeapi.StartContainerRequest{ContainerId: first})
	wantCode(t, err, codes.FailedPrecondition)
	// One VM at a time in a sandbox.
	_, err = n.s.StartContainer(ctx, &runtimeapi.StartContainerRequest{ContainerId: second})
	wantCode(t, err, codes.FailedPrecondition)
	if c := n.container(second); c.State != store.ContainerCreated {
		t.Errorf("a refused start changed the container: %s", c.State)
	}
	_, err = n.s.StopContainer(ctx, &runtimeapi.StopContainerRequest{ContainerId: first, Timeout: -1})
	wantCode(t, err, codes.InvalidArgument)
	if calls := n.cocoon.calls("VMClone"); len(calls) != 1 {
		t.Errorf("refusals reached cocoon: %q", calls)
	}
}

// A RunPodSandbox that fails at any step leaves nothing: no namespace, no lease, no cocoon
// configuration, no record; the kubelet's retry then starts clean.
func TestFailedRunPodSandboxLeavesNothing(t *testing.T) {
	for _, step := range []string{"CreateNetNS", "Add", "PrepareCocoon"} {
		t.Run(step, func(t *testing.T) {
			n := newFakeNode(t, Config{})
			n.net.failOnce(step, errors.New("injected "+step+" failure"))
			_, err := n.s.RunPodSandbox(context.Background(), &runtimeapi.RunPodSandboxRequest{Config: podConfig("web"), RuntimeHandler: HandlerName})
			if err == nil || !strings.Contains(err.Error(), "injected "+step) {
				t.Fatalf("RunPodSandbox: %v", err)
			}
			if held := n.net.held(); len(held) != 0 {
				t.Errorf("the network holds %q", held)
			}
			if left := n.st.Sandboxes.List(nil); len(left) != 0 {
				t.Errorf("sandbox records left: %+v", left[0])
			}
			// CNI DEL ran whether or not ADD got through: a cut-short ADD may have leased an IP.
			if calls := n.net.calls("Del"); len(calls) != 1 {
				t.Errorf("CNI DEL calls %q", calls)
			}
			n.runPod("web")
		})
	}
}

// Status asks cocoon (its version) and the pod network (its readiness) and says why either is
// not ready.
func TestStatusOnTheFakes(t *testing.T) {
	ctx := context.Background()
	n := newFakeNode(t, Config{})
	resp, err := n.s.Status(ctx, &runtimeapi.StatusRequest{Verbose: true})
	if err != nil {
		t.Fatal(err)
	}
	for _, cond := range resp.GetStatus().GetConditions() {
		if !cond.GetStatus() {
			t.Errorf("condition %v", cond)
		}
	}
	if !strings.Contains(resp.GetInfo()["info"], `"cocoonBinary":"cocoon (in-process fake)"`) {
		t.Errorf("verbose info %s", resp.GetInfo()["info"])
	}
	// What of a pod's state can move, as this cocoon allows it.
	for _, tc := range []struct {
		caps cocoon.Capabilities
		want StateMobilityInfo
	}{
		{capsV05, StateMobilityInfo{PodCheckpoint: "snapshotDirectory", Hibernate: true}},
		{capsV038, StateMobilityInfo{PodCheckpoint: "archive", HibernateUnavailable: "cocoon v0.3.8 has no vm hibernate (v0.5 and later have)"}},
	} {
		n.cocoon.setCaps(tc.caps)
		resp, err := n.s.Status(ctx, &runtimeapi.StatusRequest{Verbose: true})
		if err != nil {
			t.Fatal(err)
		}
		var info struct {
			StateMobility StateMobilityInfo `json:"stateMobility"`
		}
		if err := json.Unmarshal([]byte(resp.GetInfo()["info"]), &info); err != nil || info.StateMobility != tc.want {
			t.Errorf("cocoon %s: state mobility %+v (%v), want %+v", tc.caps.Version, info.StateMobility, err, tc.want)
		}
	}

	n = newFakeNode(t, Config{})
	n.cocoon.failAlways("Version", cocoonErr(nil, "permission denied", "version"))
	n.net.failAlways("Ready", errors.New("no CNI configuration"))
	resp, err = n.s.Status(ctx, &runtimeapi.StatusRequest{})
	if err != nil {
		t.Fatal(err)
	}
	conds := resp.GetStatus().GetConditions()
	if len(conds) != 2 || conds[0].GetStatus() || conds[0].GetReason() != reasonCocoonUnavailable || !strings.Contains(conds[0].GetMessage(), "permission denied") ||
		conds[1].GetStatus() || conds[1].GetReason() != reasonNetworkNotReady || !strings.Contains(conds[1].GetMessage(), "no CNI configuration") {
		t.Errorf("conditions %v", conds)
	}
}
