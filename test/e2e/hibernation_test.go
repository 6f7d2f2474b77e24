package e2e

import (
	"fmt"
	"net/http"
	"os/exec"
	"strconv"
	"strings"
	"testing"
	"time"

	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"

	"github.com/cocoonstack/cocoon-cri/cri/vmruntime"
	"github.com/cocoonstack/cocoon-cri/test/cocoonsim/guest"
	"github.com/cocoonstack/cocoon-cri/test/testimage"
	"github.com/cocoonstack/cocoon-cri/test/testproc"
)

// waitHibernated waits until the container's VM hibernated, as crictl inspect shows it, and
// returns what it shows.
func (n *node) waitHibernated(ctrID string) map[string]any {
	n.t.Helper()
	for deadline := time.Now().Add(2 * time.Minute); ; time.Sleep(200 * time.Millisecond) {
		info := n.inspect("inspect", ctrID)
		if field(info, "info", "hibernation", "hibernated") == true {
			return info
		}
		if time.Now().After(deadline) {
			n.t.Fatalf("container %s never hibernated: %v", ctrID, field(info, "info", "hibernation"))
		}
	}
}

// waitHibernatedAway waits until the running container's VM hibernated, and checks that the
// container stays RUNNING while its hypervisor is gone; it returns what crictl inspect shows.
func (n *node) waitHibernatedAway(ctrID string) map[string]any {
	n.t.Helper()
	pid := n.vmPID(ctrID)
	info := n.waitHibernated(ctrID)
	if state := field(info, "status", "state"); state != "CONTAINER_RUNNING" {
		n.t.Fatalf("a hibernated container is %v", state)
	}
	if testproc.Running(pid) {
		n.t.Fatalf("the hypervisor (PID %d) of a hibernated VM still runs", pid)
	}
	return info
}

// awake says whether crictl inspect shows the container's VM awake.
func (n *node) awake(ctrID string) bool {
	n.t.Helper()
	return field(n.inspect("inspect", ctrID), "info", "hibernation", "hibernated") == false
}

// httpGetUntil GETs url from the node until the answer contains want; a hibernated guest's first
// packet wakes it, and TCP's retransmission reaches the woken one.
func (n *node) httpGetUntil(url, want string) {
	n.t.Helper()
	var status int
	var body string
	var err error
	for deadline := time.Now().Add(time.Minute); ; time.Sleep(300 * time.Millisecond) {
		status, body, err = n.HTTPGetInNode(url)
		if err == nil && status == http.StatusOK && strings.Contains(body, want) {
			return
		}
		if time.Now().After(deadline) {
			n.t.Fatalf("GET %s: %d %q %v", url, status, body, err)
		}
	}
}

// TestIdlePodHibernatesAndWakesOnUse: a pod asking to hibernate after 2 s of idleness gives up its
// hypervisor while its container stays RUNNING, and wakes with its memory on a TCP connection to
// its IP, an exec, a port-forward and after a restart of cocoon-cri; its removal leaves nothing in
// cocoon.
func TestIdlePodHibernatesAndWakesOnUse(t *testing.T) {
	t.Parallel()
	n := newNode(t)
	n.ImportImage(snapRef, n.SnapshotImage("web", testimage.SnapshotOptions{Guest: guest.Spec{HTTPPort: 80}}))
	podID, ctr, _ := n.runningPodAnnotated("sleepy", snapRef, map[string]string{vmruntime.AnnotationHibernateAfter: "2s"}, func(*runtimeapi.ContainerConfig) {})
	// The guest's clock is set an hour back: it hibernates with it, and without a step at the wake
	// it would wake an hour and the hibernated time behind (the simulated guest's clock resumes
	// where its snapshot left it, as a real one does).
	n.mustCrictl("exec", ctr, "sh", "-c", "echo kept > /dev/shm/state; date -s @$(( $(date +%s) - 3600 )) >/dev/null")

	info := n.waitHibernatedAway(ctr)
	snap, _ := field(info, "info", "hibernation", "snapshot").(string)
	if snaps, _ := n.cocoon("snapshot", "list", "-o", "json"); snap == "" || !strings.Contains(snaps, snap) {
		t.Fatalf("the hibernation's snapshot %q is not in cocoon: %s", snap, snaps)
	}

	// A TCP connection to the pod IP wakes it; the guest goes on with its memory.
	ip := n.podIP(podID)
	n.httpGetUntil(fmt.Sprintf("http://%s/", ip), "sleepy")
	if !n.awake(ctr) {
		t.Fatal("the guest answered, but inspect shows it hibernated")
	}
	if out := n.mustCrictl("exec", ctr, "cat", "/dev/shm/state"); out != "kept" {
		t.Fatalf("the guest woken by traffic has %q in its tmpfs", out)
	}
	// Its clock was stepped from the host's at the wake.
	out := n.mustCrictl("exec", ctr, "date", "+%s")
	if guest, err := strconv.ParseInt(out, 10, 64); err != nil || guest < time.Now().Unix()-30 || guest > time.Now().Unix()+5 {
		t.Fatalf("the woken guest's clock reads %q; the host's %d", out, time.Now().Unix())
	}

	// Idle again, it hibernates again; an exec wakes it.
	n.waitHibernated(ctr)
	if out := n.mustCrictl("exec", ctr, "sh", "-c", "cat /dev/shm/state; hostname"); out != "kept\nsleepy" {
		t.Fatalf("the guest woken by exec: %q", out)
	}

	// And a port-forward.
	n.waitHibernated(ctr)
	stopForward, _ := n.portForward(podID, "18081:80")
	n.httpGetUntil("http://127.0.0.1:18081/", "sleepy")
	stopForward()

	// A restart of cocoon-cri while it hibernates loses nothing.
	n.waitHibernated(ctr)
	n.Stop()
	n.Start()
	if n.awake(ctr) {
		t.Fatal("the restart woke the VM, or forgot it hibernated")
	}
	// The operator wakes it.
	if out, err := exec.Command(bins.CocoonCRI, "--socket", n.Socket, "pod", "wake", "default/sleepy").CombinedOutput(); err != nil || strings.TrimSpace(string(out)) != ctr {
		t.Fatalf("cocoon-cri pod wake: %v: %s", err, out)
	}
	if !n.awake(ctr) {
		t.Fatal("cocoon-cri pod wake left the VM hibernated")
	}
	if out := n.mustCrictl("exec", ctr, "cat", "/dev/shm/state"); out != "kept" {
		t.Fatalf("the guest woken after a restart: %q", out)
	}

	// Removed while it hibernates, the pod leaves nothing in cocoon.
	n.waitHibernated(ctr)
	n.mustCrictl("stopp", podID)
	n.mustCrictl("rmp", podID)
	if vms, _ := n.cocoon("vm", "list", "-o", "json"); strings.Contains(vms, "cri-") {
		t.Fatalf("VMs left after the removal: %s", vms)
	}
	if snaps, _ := n.cocoon("snapshot", "list", "-o", "json"); strings.Contains(snaps, "cri-hib-") {
		t.Fatalf("a hibernation's snapshot left after the removal: %s", snaps)
	}
}

// TestPodWithACommandHibernates: a container whose command runs detached hibernates like one
// whose VM's init is the workload: its hypervisor ends, it stays RUNNING with the command's output
// in its log, and an exec wakes it. The simulator's guest keeps no processes across the
// hibernation (a real guest's memory holds them), so the woken container then ends as
// MainProcessLost: the command left no exit status, and is not run again.
func TestPodWithACommandHibernates(t *testing.T) {
	t.Parallel()
	n := newNode(t)
	n.withSnapshot()
	_, ctr, _ := n.runningPodAnnotated("worker", snapRef, map[string]string{vmruntime.AnnotationHibernateAfter: "2s"}, func(cfg *runtimeapi.ContainerConfig) {
		cfg.Command = []string{"sh", "-c", "echo working; exec sleep 3600"}
	})
	n.waitLog(ctr, "working")
	n.waitHibernatedAway(ctr)
	// The exec wakes the VM. Whether it gets to run depends on how soon the woken container is
	// found without its command, and stopped.
	_, _ = n.crictl("exec", ctr, "hostname")
	st := n.waitExited(ctr)
	if st["reason"] != "MainProcessLost" || st["exitCode"] != 137.0 {
		t.Fatalf("the woken container whose guest lost the command: %v", st)
	}
	if got := n.mustCrictl("logs", ctr); got != "working" {
		t.Fatalf("the log: %q", got)
	}
}
