package e2e

import (
	"cmp"
	"context"
	"encoding/json"
	"fmt"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"
	corev1 "k8s.io/api/core/v1"

	"github.com/cocoonstack/cocoon-cri/test/cocoonsim/guest"
	"github.com/cocoonstack/cocoon-cri/test/hostguard"
	"github.com/cocoonstack/cocoon-cri/test/registry"
	"github.com/cocoonstack/cocoon-cri/test/testimage"
	"github.com/cocoonstack/cocoon-cri/test/testproc"
)

// kubeletNodeName is the name the kubelet runs under; static pods are named <pod>-<node>.
const kubeletNodeName = "cocoon-node"

// kubelet is a standalone kubelet (no API server: static pods only) driving a node's cocoon-cri.
type kubelet struct {
	n         *node
	dir       string
	manifests string
	sysctls   string // the stand-in sysctl files
	logFile   string
	proc      *testproc.Process
}

// startKubelet runs the kubelet in the node's network namespace and in a mount namespace of its
// own: its bind mount of the root dir, the stand-in sysctls and a private /var/log and /var/lib
// (it makes /var/log/containers and /var/lib/kubelet/device-plugins whatever its flags say) all
// go with it. It is stopped when the test ends. Without an API server it runs static pods only.
func (n *node) startKubelet() *kubelet {
	n.t.Helper()
	return n.startKubeletWith(kubeletOptions{})
}

// kubeletOptions register the kubelet with an API server, and give it pod cgroups.
type kubeletOptions struct {
	// name is the node's name; empty is kubeletNodeName.
	name       string
	kubeconfig string
	nodeIP     string
	labels     string // --node-labels
	// cgroupRoot turns cgroupsPerQOS on under this cgroup, which must exist in every hierarchy:
	// the kubelet makes its kubepods tree there, each pod's cgroup in it.
	cgroupRoot string
	// clusterDNS is the cluster's DNS Service address, given to pods as their resolver, with
	// cluster.local as their domain.
	clusterDNS string
}

func (n *node) startKubeletWith(opts kubeletOptions) *kubelet {
	n.t.Helper()
	k := &kubelet{n: n, dir: filepath.Join(n.dir, "kubelet")}
	k.manifests = filepath.Join(k.dir, "manifests")
	k.sysctls = filepath.Join(k.dir, "sysctl")
	k.logFile = filepath.Join(k.dir, "kubelet.log")
	for _, d := range []string{k.manifests, k.sysctls, filepath.Join(k.dir, "pods")} {
		if err := os.MkdirAll(d, 0o755); err != nil {
			n.t.Fatal(err)
		}
	}
	cgroups := "cgroupsPerQOS: false\nenforceNodeAllocatable: []"
	if opts.cgroupRoot != "" {
		cgroups = "cgroupsPerQOS: true\ncgroupRoot: " + opts.cgroupRoot + "\nenforceNodeAllocatable: [pods]"
	}
	if opts.clusterDNS != "" {
		cgroups += "\nclusterDNS: [" + opts.clusterDNS + "]\nclusterDomain: cluster.local"
	}
	config := fmt.Sprintf(`apiVersion: kubelet.config.k8s.io/v1beta1
kind: KubeletConfiguration
staticPodPath: %[1]s/manifests
fileCheckFrequency: 1s
# ConfigMap and Secret volumes are rewritten on the pod's periodic sync: 10 s, not a minute.
syncFrequency: 10s
containerRuntimeEndpoint: unix://%[2]s
imageServiceEndpoint: unix://%[2]s
cgroupDriver: cgroupfs
failCgroupV1: false
failSwapOn: false
%[3]s
# Every address of the node's namespace: an API server reaches it at the node's.
address: 0.0.0.0
readOnlyPort: 0
healthzBindAddress: 127.0.0.1
podLogsDir: %[1]s/pods
authentication: {anonymous: {enabled: true}, webhook: {enabled: false}}
authorization: {mode: AlwaysAllow}
evictionHard: {memory.available: 100Mi, nodefs.available: "1%%", imagefs.available: "1%%"}
imageGCHighThresholdPercent: 100
imageGCLowThresholdPercent: 99
`, k.dir, n.socket, cgroups)
	configFile := filepath.Join(k.dir, "config.yaml")
	if err := os.WriteFile(configFile, []byte(config), 0o644); err != nil {
		n.t.Fatal(err)
	}
	var setup strings.Builder
	// The kubelet's root dir is the one mount it shares with the host, as on a node: the volumes
	// it mounts there (tmpfs for Secrets and projected tokens) are what cocoon-cri copies. Every
	// other mount of its namespace is made private first, so nothing else it mounts propagates.
	root := filepath.Join(k.dir, "root")
	k.shareRootDir(root)
	fmt.Fprintf(&setup, "set -e\nfindmnt -rno TARGET | while read -r m; do [ \"$m\" = %q ] || mount --make-private \"$m\"; done\n", root)
	setup.WriteString("mount -t tmpfs tmpfs /var/log\nmount -t tmpfs tmpfs /var/lib\n")
	// The kubelet sees stand-in files over the global sysctls it sets, so the host's values never
	// change.
	for _, s := range hostguard.KubeletSysctls {
		standIn := filepath.Join(k.sysctls, strings.ReplaceAll(s, "/", "."))
		fmt.Fprintf(&setup, "cp /proc/sys/%[1]s %[2]s\nmount --bind %[2]s /proc/sys/%[1]s\n", s, standIn)
	}
	setup.WriteString(`exec "$@"` + "\n")
	logFile, err := os.Create(k.logFile)
	if err != nil {
		n.t.Fatal(err)
	}
	defer logFile.Close()
	// nsenter, unshare and sh each exec the next: the PID is the kubelet's.
	cmd := exec.Command("nsenter", "--net="+n.nodeNS, "--", "unshare", "--mount", "--propagation", "unchanged", "--",
		"sh", "-c", setup.String(), "kubelet", bins.kubelet,
		"--config", configFile, "--root-dir", root, "--cert-dir", filepath.Join(k.dir, "pki"),
		"--hostname-override", cmp.Or(opts.name, kubeletNodeName), "--v", "2")
	if opts.kubeconfig != "" {
		cmd.Args = append(cmd.Args, "--kubeconfig", opts.kubeconfig, "--node-ip", opts.nodeIP, "--node-labels", opts.labels)
	}
	cmd.Stdout, cmd.Stderr = logFile, logFile
	if k.proc, err = testproc.Start(cmd); err != nil {
		n.t.Fatal(err)
	}
	n.t.Cleanup(k.stop)
	k.waitFor("the kubelet's health check", time.Minute, func() (bool, string) {
		status, body, err := n.httpGetInNode("http://127.0.0.1:10248/healthz")
		return err == nil && status == 200, fmt.Sprintf("%d %q %v", status, body, err)
	})
	return k
}

// shareRootDir makes the kubelet's root dir a shared mount of the host's namespace; when the test
// ends, it goes with whatever volumes the kubelet left mounted in it.
func (k *kubelet) shareRootDir(root string) {
	k.n.t.Helper()
	if err := os.MkdirAll(root, 0o750); err != nil {
		k.n.t.Fatal(err)
	}
	if err := unix.Mount(root, root, "", unix.MS_BIND, ""); err != nil {
		k.n.t.Fatalf("bind the kubelet's root dir: %v", err)
	}
	k.n.t.Cleanup(func() {
		if err := unix.Unmount(root, unix.MNT_DETACH); err != nil {
			k.n.t.Errorf("unmount the kubelet's root dir: %v", err)
		}
	})
	if err := unix.Mount("", root, "", unix.MS_SHARED, ""); err != nil {
		k.n.t.Fatalf("share the kubelet's root dir: %v", err)
	}
}

// stop ends the kubelet by PID: SIGTERM, then SIGKILL.
func (k *kubelet) stop() {
	if k.proc == nil {
		return
	}
	_, _ = k.proc.Stop(30 * time.Second)
	k.proc = nil
	if k.n.t.Failed() {
		data, _ := os.ReadFile(k.logFile)
		k.n.t.Logf("kubelet log (last 200 lines):\n%s", lastLines(string(data), 200))
	}
}

func lastLines(s string, n int) string {
	lines := strings.Split(s, "\n")
	return strings.Join(lines[max(0, len(lines)-n):], "\n")
}

// waitFor polls ok until it holds, failing the test with ok's last account after timeout, or at
// once if the kubelet exits.
func (k *kubelet) waitFor(what string, timeout time.Duration, ok func() (bool, string)) {
	k.n.t.Helper()
	var last string
	for deadline := time.Now().Add(timeout); ; {
		var done bool
		if done, last = ok(); done {
			return
		}
		select {
		case <-k.proc.Done():
			k.n.t.Fatalf("the kubelet exited (%v) while waiting for %s", k.proc.Err(), what)
		case <-time.After(500 * time.Millisecond):
		}
		if time.Now().After(deadline) {
			k.n.t.Fatalf("%s: not within %s; last: %s", what, timeout, last)
		}
	}
}

// addPod writes a static pod manifest; removePod deletes it.
func (k *kubelet) addPod(name, manifest string) {
	k.n.t.Helper()
	if err := os.WriteFile(filepath.Join(k.manifests, name+".yaml"), []byte(manifest), 0o644); err != nil {
		k.n.t.Fatal(err)
	}
}

func (k *kubelet) removePod(name string) {
	k.n.t.Helper()
	if err := os.Remove(filepath.Join(k.manifests, name+".yaml")); err != nil {
		k.n.t.Fatal(err)
	}
}

// get fetches a path of the kubelet's authenticated API (its self-signed certificate, anonymous
// access).
func (k *kubelet) get(path string) (int, string, error) {
	return k.n.httpGetInNode("https://127.0.0.1:10250" + path)
}

// pod is the kubelet's view of a static pod: for a kubelet without an API server, /pods carries
// the status it would have reported.
func (k *kubelet) pod(name string) (*corev1.Pod, string) {
	status, body, err := k.get("/pods")
	if err != nil || status != 200 {
		return nil, fmt.Sprintf("GET /pods: %d %v", status, err)
	}
	var pods corev1.PodList
	if err := json.Unmarshal([]byte(body), &pods); err != nil {
		return nil, fmt.Sprintf("GET /pods: %v", err)
	}
	for i := range pods.Items {
		if pods.Items[i].Name == name+"-"+kubeletNodeName {
			return &pods.Items[i], ""
		}
	}
	return nil, "no pod " + name + " in /pods"
}

// waitPod waits until the kubelet reports pod name with its one container as ok says.
func (k *kubelet) waitPod(name, what string, ok func(*corev1.Pod, corev1.ContainerStatus) bool) (*corev1.Pod, corev1.ContainerStatus) {
	k.n.t.Helper()
	var pod *corev1.Pod
	var ctr corev1.ContainerStatus
	k.waitFor(name+": "+what, 3*time.Minute, func() (bool, string) {
		var why string
		if pod, why = k.pod(name); pod == nil {
			return false, why
		}
		if len(pod.Status.ContainerStatuses) != 1 {
			return false, fmt.Sprintf("phase %s, container statuses %v", pod.Status.Phase, pod.Status.ContainerStatuses)
		}
		ctr = pod.Status.ContainerStatuses[0]
		status, _ := json.Marshal(pod.Status)
		return ok(pod, ctr), string(status)
	})
	return pod, ctr
}

func podReady(p *corev1.Pod) bool {
	for _, c := range p.Status.Conditions {
		if c.Type == corev1.PodReady {
			return c.Status == corev1.ConditionTrue
		}
	}
	return false
}

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
	n := newNode(t, "--serve-default-handler")
	reg := n.registry(registry.Options{})
	n.pushSnapshot(reg.Target(), "kubelet/web:1", "web", testimage.SnapshotOptions{Guest: guest.Spec{Busybox: true, HTTPPort: 80}}, registry.SnapshotPush{})
	n.pushSnapshot(reg.Target(), "kubelet/crash:1", "crash", testimage.SnapshotOptions{Guest: guest.Spec{CrashAfter: guest.Duration(2 * time.Second)}}, registry.SnapshotPush{})
	k := n.startKubelet()

	// A hostPath volume: the kubelet hands cocoon-cri its mounts (this one, /etc/hosts and the
	// termination log), which are copied into the guest.
	config := t.TempDir()
	if err := os.WriteFile(filepath.Join(config, "greeting"), []byte("from the node"), 0o644); err != nil {
		t.Fatal(err)
	}
	k.addPod("web", staticPod("web", reg.Host+"/kubelet/web:1", `    volumeMounts:
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
	k.addPod("crash", staticPod("crash", reg.Host+"/kubelet/crash:1", ""))

	pod, _ := k.waitPod("web", "running", func(p *corev1.Pod, c corev1.ContainerStatus) bool {
		return p.Status.Phase == corev1.PodRunning && c.State.Running != nil
	})
	if podReady(pod) {
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
	k.waitPod("web", "Ready once the probe's file exists", func(p *corev1.Pod, c corev1.ContainerStatus) bool {
		return podReady(p) && c.Ready
	})

	k.waitFor("/containerLogs with the guest's boot banner", time.Minute, func() (bool, string) {
		status, body, err := k.get("/containerLogs/default/" + pod.Name + "/web")
		return err == nil && status == 200 && strings.Contains(body, "cocoon-sim guest") && strings.Contains(body, "ready"),
			fmt.Sprintf("%d %q %v", status, body, err)
	})

	_, crashed := k.waitPod("crash", "restarted after its guest crashed", func(_ *corev1.Pod, c corev1.ContainerStatus) bool {
		return c.RestartCount >= 1 && c.LastTerminationState.Terminated != nil
	})
	if last := crashed.LastTerminationState.Terminated; last.Reason != "VMCrashed" || last.ExitCode != 137 {
		t.Fatalf("the crashed container's last state: %+v, want reason VMCrashed, exit code 137", last)
	}
	// The restarted container is a new CRI container whose attempt is the restart count.
	if attempts := n.attempts("crash"); !slices.Contains(attempts, 1) {
		t.Fatalf("attempts of the crashing container in crictl ps -a: %v, want a second one (1)", attempts)
	}
	if _, web := k.waitPod("web", "still running", func(*corev1.Pod, corev1.ContainerStatus) bool { return true }); web.RestartCount != 0 {
		t.Fatalf("the healthy pod was restarted %d times (its liveness probe failed?)", web.RestartCount)
	}

	k.removePod("web")
	k.removePod("crash")
	k.waitFor("the pods' VMs, network namespaces and sandboxes removed", 3*time.Minute, func() (bool, string) {
		pods, vms, netns := n.mustCrictl("pods", "-q"), n.vms(), n.netns()
		return pods == "" && len(vms) == 0 && len(netns) == 0, fmt.Sprintf("sandboxes %q, VMs %v, netns %v", pods, vms, netns)
	})
	k.stop()
	if data, err := os.ReadFile(filepath.Join(k.sysctls, "vm.overcommit_memory")); err != nil || strings.TrimSpace(string(data)) != "1" {
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
