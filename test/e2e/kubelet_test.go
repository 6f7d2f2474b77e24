package e2e

import (
	"context"
	"encoding/json"
	"fmt"
	"net/url"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"

	"github.com/cocoonstack/cocoon-cri/test/cocoonsim/guest"
	"github.com/cocoonstack/cocoon-cri/test/harness"
	"github.com/cocoonstack/cocoon-cri/test/registry"
	"github.com/cocoonstack/cocoon-cri/test/testimage"
)

// staticPod is a manifest with one container from image.
func staticPod(name, image, probes string) string {
	return fmt.Sprintf(`apiVersion: v1
kind: Pod
metadata: {name: %[1]s, namespace: default}
spec:
  terminationGracePeriodSeconds: 5
  containers:
  - name: %[1]s
    image: %[2]s
    imagePullPolicy: IfNotPresent
%[3]s`, name, image, probes)
}

// TestKubelet: a real kubelet (standalone, static pods) runs VM pods through cocoon-cri on the
// default handler. It pulls the images from a registry, the pods run, an exec readiness probe
// turns Ready only once the guest has the file it tests, a TCP liveness probe to the pod IP holds
// once a startup probe saw the guest answer (a clone answers at the pod IP only once it is set up),
// /containerLogs serves the VM's console, /exec runs a command in the guest, a guest that crashes
// is restarted by the kubelet, and removing the manifests removes the VMs, the pods' network
// namespaces and the sandboxes. The host's sysctls stay as they were (the run's host guard checks
// them).
func TestKubelet(t *testing.T) {
	t.Parallel()
	n := newNode(t, "--serve-default-handler")
	reg := n.registry(registry.Options{})
	n.pushSnapshot(reg.Target(), "kubelet/web:1", "web", testimage.SnapshotOptions{Guest: guest.Spec{Busybox: true, HTTPPort: 80}}, registry.SnapshotPush{})
	n.pushSnapshot(reg.Target(), "kubelet/crash:1", "crash", testimage.SnapshotOptions{Guest: guest.Spec{CrashAfter: guest.Duration(2 * time.Second)}}, registry.SnapshotPush{})
	k := n.StartKubelet()

	// A hostPath volume: the kubelet hands cocoon-cri its mounts (this one, /etc/hosts and the
	// termination log), which are copied into the guest.
	config := t.TempDir()
	if err := os.WriteFile(filepath.Join(config, "greeting"), []byte("from the node"), 0o644); err != nil {
		t.Fatal(err)
	}
	k.AddPod("web", staticPod("web", reg.Host+"/kubelet/web:1", `    volumeMounts:
    - {name: config, mountPath: /etc/config, readOnly: true}
    readinessProbe:
      exec: {command: [sh, -c, "test -e /run/ready"]}
      periodSeconds: 1
    startupProbe:
      tcpSocket: {port: 80}
      periodSeconds: 1
      failureThreshold: 180
    livenessProbe:
      tcpSocket: {port: 80}
      periodSeconds: 2
  volumes:
  - {name: config, hostPath: {path: `+config+`, type: Directory}}
`))
	k.AddPod("crash", staticPod("crash", reg.Host+"/kubelet/crash:1", ""))

	pod, _ := k.WaitPod("web", "running", func(p *corev1.Pod, c corev1.ContainerStatus) bool {
		return p.Status.Phase == corev1.PodRunning && c.State.Running != nil
	})
	if harness.PodReady(pod) {
		t.Fatal("the pod is Ready before its readiness probe can pass (/run/ready does not exist yet)")
	}
	if pod.Status.PodIP == "" || pod.Status.PodIP != n.podIP(n.sandboxOf(pod.Name)) {
		t.Fatalf("the kubelet reports pod IP %q, cocoon-cri's sandbox has %q", pod.Status.PodIP, n.podIP(n.sandboxOf(pod.Name)))
	}

	// exec through the kubelet's own streaming endpoint, as kubectl exec reaches it.
	q := url.Values{"command": {"sh", "-c", "touch /run/ready && hostname && cat /etc/config/greeting && echo && grep -c " +
		pod.Status.PodIP + " /etc/hosts"}, "output": {"1"}, "error": {"1"}}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	res := n.stream(ctx, "https://127.0.0.1:10250/exec/default/"+pod.Name+"/web?"+q.Encode(), nil, streamOpts{stderr: true})
	if want := pod.Name + "\nfrom the node\n1"; res.err != nil || strings.TrimSpace(res.stdout) != want {
		t.Fatalf("exec through the kubelet: %v, stdout %q stderr %q; want the guest's hostname, the hostPath volume's file "+
			"and the kubelet's /etc/hosts with the pod IP: %q", res.err, res.stdout, res.stderr, want)
	}
	k.WaitPod("web", "Ready once the probe's file exists", func(p *corev1.Pod, c corev1.ContainerStatus) bool {
		return harness.PodReady(p) && c.Ready
	})

	k.WaitFor("/containerLogs with the guest's boot banner", time.Minute, func() (bool, string) {
		status, body, err := k.Get("/containerLogs/default/" + pod.Name + "/web")
		return err == nil && status == 200 && strings.Contains(body, "cocoon-sim guest") && strings.Contains(body, "ready"),
			fmt.Sprintf("%d %q %v", status, body, err)
	})

	_, crashed := k.WaitPod("crash", "restarted after its guest crashed", func(_ *corev1.Pod, c corev1.ContainerStatus) bool {
		return c.RestartCount >= 1 && c.LastTerminationState.Terminated != nil
	})
	if last := crashed.LastTerminationState.Terminated; last.Reason != "VMCrashed" || last.ExitCode != 137 {
		t.Fatalf("the crashed container's last state: %+v, want reason VMCrashed, exit code 137", last)
	}
	// The restarted container is a new CRI container whose attempt is the restart count.
	if attempts := n.attempts("crash"); !slices.Contains(attempts, 1) {
		t.Fatalf("attempts of the crashing container in crictl ps -a: %v, want a second one (1)", attempts)
	}
	if _, web := k.WaitPod("web", "still running", func(*corev1.Pod, corev1.ContainerStatus) bool { return true }); web.RestartCount != 0 {
		t.Fatalf("the healthy pod was restarted %d times (its liveness probe failed?)", web.RestartCount)
	}

	k.RemovePod("web")
	k.RemovePod("crash")
	k.WaitFor("the pods' VMs, network namespaces and sandboxes removed", 3*time.Minute, func() (bool, string) {
		pods, vms, netns := n.mustCrictl("pods", "-q"), n.vms(), n.netns()
		return pods == "" && len(vms) == 0 && len(netns) == 0, fmt.Sprintf("sandboxes %q, VMs %v, netns %v", pods, vms, netns)
	})
	k.Stop()
	if data, err := os.ReadFile(filepath.Join(k.Sysctls, "vm.overcommit_memory")); err != nil || strings.TrimSpace(string(data)) != "1" {
		t.Errorf("the kubelet did not set its stand-in vm.overcommit_memory (%q, %v): the stand-ins may not cover what it changes", data, err)
	}
}

// attempts lists the attempt numbers of the containers named name, as crictl ps -a shows them.
func (n *node) attempts(name string) []int {
	n.t.Helper()
	var list struct {
		Containers []struct {
			Metadata struct {
				Name    string
				Attempt int
			}
		}
	}
	if err := json.Unmarshal([]byte(n.mustCrictl("ps", "-a", "-o", "json")), &list); err != nil {
		n.t.Fatal(err)
	}
	var attempts []int
	for _, c := range list.Containers {
		if c.Metadata.Name == name {
			attempts = append(attempts, c.Metadata.Attempt)
		}
	}
	return attempts
}

// sandboxOf is the ID of the ready sandbox of the pod with this name.
func (n *node) sandboxOf(podName string) string {
	n.t.Helper()
	id := n.mustCrictl("pods", "-q", "--name", "^"+podName+"$", "--state", "ready")
	if id == "" || strings.Contains(id, "\n") {
		n.t.Fatalf("ready sandboxes of %s: %q", podName, id)
	}
	return id
}
