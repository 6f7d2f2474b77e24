package e2e

import (
	"strings"
	"testing"

	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"

	"github.com/cocoonstack/cocoon-cri/cri/vmruntime"
)

// TestForkCarriesMemoryWithANewIdentity: a pod with fork-from starts as a copy of a running pod's
// VM: the source's tmpfs, and its own hostname, IP and machine-id; the source runs on, and no save
// is left in cocoon.
func TestForkCarriesMemoryWithANewIdentity(t *testing.T) {
	t.Parallel()
	n := newNode(t)
	n.withSnapshot()
	srcPod, src, _ := n.runningPod("source", snapRef)
	n.mustCrictl("exec", src, "sh", "-c", "echo kept > /dev/shm/state")

	forkPod, fork, _ := n.runningPodAnnotated("fork", snapRef, map[string]string{vmruntime.AnnotationForkFrom: "default/source"}, func(*runtimeapi.ContainerConfig) {})

	if out := n.mustCrictl("exec", fork, "sh", "-c", "cat /dev/shm/state; hostname"); out != "kept\nfork" {
		t.Fatalf("the fork: %q, want the source's memory and its own hostname", out)
	}
	srcID, forkID := n.mustCrictl("exec", src, "cat", "/etc/machine-id"), n.mustCrictl("exec", fork, "cat", "/etc/machine-id")
	if srcID == "" || srcID == forkID {
		t.Fatalf("machine-ids %q and %q: a fork has its own", srcID, forkID)
	}
	if srcIP, forkIP := n.podIP(srcPod), n.podIP(forkPod); srcIP == forkIP {
		t.Fatalf("pod IPs %q and %q: a fork has its own", srcIP, forkIP)
	}
	if state := field(n.inspect("inspect", src), "status", "state"); state != "CONTAINER_RUNNING" {
		t.Fatalf("the source is %v after the fork", state)
	}
	if snaps, _ := n.cocoon("snapshot", "list", "-o", "json"); strings.Contains(snaps, "cri-fork-") {
		t.Fatalf("a fork's save is left in cocoon: %s", snaps)
	}

	// A fork of a pod of another namespace is refused before anything is made.
	other := n.podConfig("thief", "uid-thief")
	other.Metadata.Namespace = "other"
	other.Annotations[vmruntime.AnnotationForkFrom] = "default/source"
	n.crictlFails("PermissionDenied", "runp", "--runtime", "cocoon", n.configFile("thief-pod.json", other))
}
