package e2e

import (
	"strings"
	"testing"

	"github.com/cocoonstack/cocoon-cri/pkg/cocoon"
	"github.com/cocoonstack/cocoon-cri/test/cocoonsim"
	"github.com/cocoonstack/cocoon-cri/test/testimage"
	"github.com/cocoonstack/cocoon-cri/test/testproc"
)

// field walks a decoded JSON object along keys.
func field(m map[string]any, keys ...string) any {
	var v any = m
	for _, k := range keys {
		obj, ok := v.(map[string]any)
		if !ok {
			return nil
		}
		v = obj[k]
	}
	return v
}

// TestPodLifecycle runs a snapshot pod on both cocoon releases, whose clones differ: v0.3.8 grows
// a clone to the container's limits, v0.5 runs it at its snapshot's size and gives it its own
// machine-id.
func TestPodLifecycle(t *testing.T) {
	t.Parallel()
	for _, version := range []string{"0.3.8", "0.5.1"} {
		t.Run(version, func(t *testing.T) {
			runLifecycle(t, newNodeWithEnv(t, []string{cocoonsim.VersionEnv + "=" + version}), version, false)
		})
	}
}

// TestPodLifecycleSurvivesRestarts runs the same flow with cocoon-cri restarted between every step:
// the state lives on disk, not in the daemon.
func TestPodLifecycleSurvivesRestarts(t *testing.T) {
	t.Parallel()
	runLifecycle(t, newNode(t), "0.5.1", true)
}

func runLifecycle(t *testing.T, n *node, version string, restartEachStep bool) {
	imageID := n.withSnapshot()
	step := func() {
		if restartEachStep {
			n.Restart()
		}
	}
	podFile := n.configFile("pod.json", n.podConfig("web", "uid-web"))
	ctrFile := n.configFile("ctr.json", containerConfig("app", snapRef))

	podID := n.mustCrictl("runp", "--runtime", "cocoon", podFile)
	step()
	sb := n.inspect("inspectp", podID)
	if field(sb, "status", "state") != "SANDBOX_READY" || field(sb, "status", "runtimeHandler") != "cocoon" ||
		field(sb, "status", "metadata", "name") != "web" || field(sb, "status", "labels", "app") != "web" {
		t.Fatalf("inspectp after runp: %v", sb["status"])
	}
	if ns := n.netns(); len(ns) != 1 {
		t.Fatalf("network namespaces after runp: %v", ns)
	}

	ctrID := n.mustCrictl("create", "--no-pull", podID, ctrFile, podFile)
	step()
	c := n.inspect("inspect", ctrID)
	if field(c, "status", "state") != "CONTAINER_CREATED" || field(c, "status", "imageId") != imageID {
		t.Fatalf("inspect after create: %v", c["status"])
	}
	if vms := n.vms(); len(vms) != 0 {
		t.Fatalf("a VM exists before start: %+v", vms)
	}

	n.mustCrictl("start", ctrID)
	step()
	c = n.inspect("inspect", ctrID)
	if field(c, "status", "state") != "CONTAINER_RUNNING" {
		t.Fatalf("inspect after start: %v", c["status"])
	}
	vmName, _ := field(c, "info", "vm", "name").(string)
	pid, _ := field(c, "info", "vm", "pid").(float64)
	vm, err := n.vm(vmName)
	if err != nil {
		t.Fatal(err)
	}
	if vm.State != cocoon.VMStateRunning || vm.PID != int(pid) || !testproc.Running(vm.PID) {
		t.Fatalf("cocoon VM %s: state %s pid %d (cocoon-cri says %v), alive %v", vmName, vm.State, vm.PID, pid, testproc.Running(vm.PID))
	}
	if !strings.HasPrefix(vmName, "cri-"+ctrID[:12]+"-web-app") {
		t.Fatalf("VM name %q", vmName)
	}
	switch version {
	case "0.3.8":
		if vm.Config.CPU != 1 || vm.Config.Memory != 1<<30 {
			t.Fatalf("VM size cpu=%d memory=%d, want the container's limits 1 and 1GiB", vm.Config.CPU, vm.Config.Memory)
		}
	default:
		if vm.Config.CPU != 1 || vm.Config.Memory != 512<<20 {
			t.Fatalf("VM size cpu=%d memory=%d, want the snapshot's 1 and 512MiB", vm.Config.CPU, vm.Config.Memory)
		}
		if mem, _ := field(c, "info", "vm", "memory").(float64); int64(mem) != vm.Config.Memory {
			t.Fatalf("crictl inspect shows memory %v, the VM has %d", field(c, "info", "vm", "memory"), vm.Config.Memory)
		}
		if id := n.mustCrictl("exec", ctrID, "cat", "/etc/machine-id"); len(id) != 32 || id == testimage.SnapshotMachineID("snap") {
			t.Fatalf("the clone's machine-id %q: want its own, not the snapshot's", id)
		}
	}
	if ps := n.mustCrictl("ps", "-q", "--state", "running"); ps != ctrID {
		t.Fatalf("crictl ps --state running: %q", ps)
	}

	// cocoon stops a direct-boot VM at once, whatever the timeout: only a guest asked to power off
	// through exec (v0.5's agent) stops cleanly; v0.3.8 has no way to ask it.
	n.mustCrictl("stop", "--timeout", "10", ctrID)
	step()
	c = n.inspect("inspect", ctrID)
	wantCode, wantReason, wantMsg := 0.0, "Completed", "the guest powered off when asked through exec"
	if version == "0.3.8" {
		wantCode, wantReason, wantMsg = 137.0, "Error", "no way to run commands in guests"
	}
	msg, _ := field(c, "status", "message").(string)
	if field(c, "status", "state") != "CONTAINER_EXITED" || field(c, "status", "exitCode") != wantCode ||
		field(c, "status", "reason") != wantReason || !strings.Contains(msg, wantMsg) {
		t.Fatalf("inspect after stop: %v; want exit code %v, reason %s, a message saying %q", c["status"], wantCode, wantReason, wantMsg)
	}
	if vm, err := n.vm(vm.ID); err != nil || vm.State != cocoon.VMStateStopped {
		t.Fatalf("cocoon VM after stop: %+v, %v", vm, err)
	}
	if testproc.Running(vm.PID) {
		t.Fatalf("hypervisor %d still runs after stop", vm.PID)
	}

	n.mustCrictl("rm", ctrID)
	step()
	if ps := n.mustCrictl("ps", "-a", "-q"); ps != "" {
		t.Fatalf("containers after rm: %q", ps)
	}
	if vms := n.vms(); len(vms) != 0 {
		t.Fatalf("VMs after rm: %+v", vms)
	}

	n.mustCrictl("stopp", podID)
	step()
	if st := field(n.inspect("inspectp", podID), "status", "state"); st != "SANDBOX_NOTREADY" {
		t.Fatalf("sandbox after stopp: %v", st)
	}

	n.mustCrictl("rmp", podID)
	step()
	if pods := n.mustCrictl("pods", "-q"); pods != "" {
		t.Fatalf("sandboxes after rmp: %q", pods)
	}
	if ns := n.netns(); len(ns) != 0 {
		t.Fatalf("network namespaces after rmp: %v", ns)
	}
}

// TestCloudImageBoots covers the VM-image path: vm create, then vm start, with the container's size.
func TestCloudImageBoots(t *testing.T) {
	t.Parallel()
	n := newNode(t)
	n.ImportImage(cloudRef, n.cloudImage("cloud"))
	podFile := n.configFile("pod.json", n.podConfig("desk", "uid-desk"))
	cfg := containerConfig("os", cloudRef)
	cfg.Linux.Resources.CpuQuota = 200000
	cfg.Linux.Resources.MemoryLimitInBytes = 1536 << 20
	ctrFile := n.configFile("ctr.json", cfg)

	podID := n.mustCrictl("runp", "--runtime", "cocoon", podFile)
	ctrID := n.mustCrictl("create", "--no-pull", podID, ctrFile, podFile)
	n.mustCrictl("start", ctrID)
	c := n.inspect("inspect", ctrID)
	if field(c, "status", "state") != "CONTAINER_RUNNING" || field(c, "info", "vm", "mode") != "boot" {
		t.Fatalf("inspect: %v / %v", c["status"], c["info"])
	}
	vm, err := n.vm(field(c, "info", "vm", "id").(string))
	if err != nil {
		t.Fatal(err)
	}
	if vm.Config.ImageType != cocoon.ImageTypeCloudImg || vm.Config.CPU != 2 || vm.Config.Memory != 1536<<20 || !testproc.Running(vm.PID) {
		t.Fatalf("cocoon VM: %+v", vm)
	}
	// A UEFI guest gets the ACPI power button and powers off within the timeout.
	n.mustCrictl("stop", "--timeout", "20", ctrID)
	if st := n.inspect("inspect", ctrID)["status"]; field(st.(map[string]any), "exitCode") != 0.0 {
		t.Fatalf("after stop: %v", st)
	}
	n.mustCrictl("rmp", "--force", podID)
	if vms := n.vms(); len(vms) != 0 {
		t.Fatalf("VMs after rmp: %+v", vms)
	}
}

// TestStopEscalatesForAGuestThatIgnoresThePowerButton: the stop timeout is honoured and the result
// says the VM was stopped forcibly.
func TestStopEscalatesForAGuestThatIgnoresThePowerButton(t *testing.T) {
	t.Parallel()
	n := newNode(t)
	n.ImportImage(snapRef, n.SnapshotImage("stubborn", stubbornSnapshot()))
	_, ctrID, _ := n.runningPod("stubborn", snapRef)
	pid := n.vmPID(ctrID)

	n.mustCrictl("stop", "--timeout", "2", ctrID)
	st := n.inspect("inspect", ctrID)["status"].(map[string]any)
	if st["state"] != "CONTAINER_EXITED" || st["exitCode"] != 137.0 || !strings.Contains(st["message"].(string), "did not power off within 2s") {
		t.Fatalf("after stop: %v", st)
	}
	if testproc.Running(pid) {
		t.Fatalf("hypervisor %d survived the escalation", pid)
	}
}

// TestOneRunningVMPerSandbox: a second container may be created (restarts, init containers) but not
// started while another runs.
func TestOneRunningVMPerSandbox(t *testing.T) {
	t.Parallel()
	n := newNode(t)
	n.withSnapshot()
	podFile := n.configFile("pod.json", n.podConfig("pair", "uid-p"))
	podID := n.mustCrictl("runp", "--runtime", "cocoon", podFile)
	first := n.mustCrictl("create", "--no-pull", podID, n.configFile("a.json", containerConfig("a", snapRef)), podFile)
	second := n.mustCrictl("create", "--no-pull", podID, n.configFile("b.json", containerConfig("b", snapRef)), podFile)
	n.mustCrictl("start", first)

	msg := n.crictlFails("FailedPrecondition", "start", second)
	if !strings.Contains(msg, "one VM at a time") || !strings.Contains(msg, first) {
		t.Fatalf("message does not say why: %s", msg)
	}
	if st := field(n.inspect("inspect", second), "status", "state"); st != "CONTAINER_CREATED" {
		t.Fatalf("refused container is %v", st)
	}
	if vms := n.vms(); len(vms) != 1 {
		t.Fatalf("%d VMs, want 1", len(vms))
	}
	// Once the first stops, the second may run: a restart in the kubelet's way.
	n.mustCrictl("stop", "--timeout", "5", first)
	n.mustCrictl("start", second)
	if ps := n.mustCrictl("ps", "-q", "--state", "running"); ps != second {
		t.Fatalf("running: %q", ps)
	}
}

// TestFailedStartLeavesNoVM: a VM that does not boot leaves the container EXITED with StartError and
// no VM in cocoon.
func TestFailedStartLeavesNoVM(t *testing.T) {
	t.Parallel()
	n := newNode(t)
	opts := testimage.SnapshotOptions{}
	opts.Guest.FailBoot = true
	n.ImportImage(snapRef, n.SnapshotImage("broken", opts))
	podFile := n.configFile("pod.json", n.podConfig("broken", "uid-b"))
	podID := n.mustCrictl("runp", "--runtime", "cocoon", podFile)
	ctrID := n.mustCrictl("create", "--no-pull", podID, n.configFile("ctr.json", containerConfig("app", snapRef)), podFile)

	if _, err := n.crictl("start", ctrID); err == nil {
		t.Fatal("a VM that cannot boot started")
	}
	st := n.inspect("inspect", ctrID)["status"].(map[string]any)
	if st["state"] != "CONTAINER_EXITED" || st["exitCode"] != 128.0 || st["reason"] != "StartError" || st["message"] == "" {
		t.Fatalf("after a failed start: %v", st)
	}
	if vms := n.vms(); len(vms) != 0 {
		t.Fatalf("the failed start left VMs: %+v", vms)
	}
	n.crictlFails("FailedPrecondition", "start", ctrID)
}
