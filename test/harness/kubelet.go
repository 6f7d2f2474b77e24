package harness

import (
	"cmp"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"

	"github.com/cocoonstack/cocoon-cri/test/hostguard"
	"github.com/cocoonstack/cocoon-cri/test/testproc"
	"golang.org/x/sys/unix"
)

// KubeletNodeName is the name the kubelet runs under; static pods are named <pod>-<node>.
const KubeletNodeName = "cocoon-node"

// Kubelet is a standalone Kubelet (no API server: static pods only) driving a node's cocoon-cri.
type Kubelet struct {
	Node      *Node
	Dir       string
	Manifests string
	Sysctls   string // the stand-in sysctl files
	LogFile   string
	Proc      *testproc.Process
}

// StartKubelet runs the kubelet in the node's network namespace and in a mount namespace of its
// own: its bind mount of the root dir, the stand-in sysctls and a private /var/log and /var/lib
// (it makes /var/log/containers and /var/lib/kubelet/device-plugins whatever its flags say) all
// go with it. It is stopped when the test ends. Without an API server it runs static pods only.
func (n *Node) StartKubelet() *Kubelet {
	n.T.Helper()
	return n.StartKubeletWith(KubeletOptions{})
}

// KubeletOptions register the kubelet with an API server, and give it pod cgroups.
type KubeletOptions struct {
	// Name is the node's Name; empty is kubeletNodeName.
	Name       string
	Kubeconfig string
	NodeIP     string
	Labels     string // --node-labels
	// CgroupRoot turns cgroupsPerQOS on under this cgroup, which must exist in every hierarchy:
	// the kubelet makes its kubepods tree there, each pod's cgroup in it.
	CgroupRoot string
	// ClusterDNS is the cluster's DNS Service address, given to pods as their resolver, with
	// cluster.local as their domain.
	ClusterDNS string
}

func (n *Node) StartKubeletWith(opts KubeletOptions) *Kubelet {
	n.T.Helper()
	k := &Kubelet{Node: n, Dir: filepath.Join(n.Dir, "kubelet")}
	k.Manifests = filepath.Join(k.Dir, "manifests")
	k.Sysctls = filepath.Join(k.Dir, "sysctl")
	k.LogFile = filepath.Join(k.Dir, "kubelet.log")
	for _, d := range []string{k.Manifests, k.Sysctls, filepath.Join(k.Dir, "pods")} {
		if err := os.MkdirAll(d, 0o755); err != nil {
			n.T.Fatal(err)
		}
	}
	cgroups := "cgroupsPerQOS: false\nenforceNodeAllocatable: []"
	if opts.CgroupRoot != "" {
		cgroups = "cgroupsPerQOS: true\ncgroupRoot: " + opts.CgroupRoot + "\nenforceNodeAllocatable: [pods]"
	}
	if opts.ClusterDNS != "" {
		cgroups += "\nclusterDNS: [" + opts.ClusterDNS + "]\nclusterDomain: cluster.local"
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
`, k.Dir, n.Socket, cgroups)
	configFile := filepath.Join(k.Dir, "config.yaml")
	if err := os.WriteFile(configFile, []byte(config), 0o644); err != nil {
		n.T.Fatal(err)
	}
	var setup strings.Builder
	// The kubelet's root dir is the one mount it shares with the host, as on a node: the volumes
	// it mounts there (tmpfs for Secrets and projected tokens) are what cocoon-cri copies. Every
	// other mount of its namespace is made private first, so nothing else it mounts propagates. A
	// mount that goes meanwhile (another test's, unmounted on the host) has nothing to make private.
	root := filepath.Join(k.Dir, "root")
	k.shareRootDir(root)
	fmt.Fprintf(&setup, "set -e\nfindmnt -rno TARGET | while read -r m; do [ \"$m\" = %q ] || mount --make-private \"$m\" || ! mountpoint -q \"$m\"; done\n", root)
	setup.WriteString("mount -t tmpfs tmpfs /var/log\nmount -t tmpfs tmpfs /var/lib\n")
	// The kubelet sees stand-in files over the global sysctls it sets, so the host's values never
	// change.
	for _, s := range hostguard.KubeletSysctls {
		standIn := filepath.Join(k.Sysctls, strings.ReplaceAll(s, "/", "."))
		fmt.Fprintf(&setup, "cp /proc/sys/%[1]s %[2]s\nmount --bind %[2]s /proc/sys/%[1]s\n", s, standIn)
	}
	setup.WriteString(`exec "$@"` + "\n")
	logFile, err := os.Create(k.LogFile)
	if err != nil {
		n.T.Fatal(err)
	}
	defer logFile.Close()
	// nsenter, unshare and sh each exec the next: the PID is the kubelet's.
	cmd := exec.Command("nsenter", "--net="+n.NodeNS, "--", "unshare", "--mount", "--propagation", "unchanged", "--",
		"sh", "-c", setup.String(), "kubelet", Bins.Kubelet,
		"--config", configFile, "--root-dir", root, "--cert-dir", filepath.Join(k.Dir, "pki"),
		"--hostname-override", cmp.Or(opts.Name, KubeletNodeName), "--v", "2")
	if opts.Kubeconfig != "" {
		cmd.Args = append(cmd.Args, "--kubeconfig", opts.Kubeconfig, "--node-ip", opts.NodeIP, "--node-labels", opts.Labels)
	}
	cmd.Stdout, cmd.Stderr = logFile, logFile
	if k.Proc, err = testproc.Start(cmd); err != nil {
		n.T.Fatal(err)
	}
	n.T.Cleanup(k.Stop)
	k.WaitFor("the kubelet's health check", StartWithin, func() (bool, string) {
		status, body, err := n.HTTPGetInNode("http://127.0.0.1:10248/healthz")
		return err == nil && status == 200, fmt.Sprintf("%d %q %v", status, body, err)
	})
	return k
}

// shareRootDir makes the kubelet's root dir a shared mount of the host's namespace; when the test
// ends, it goes with whatever volumes the kubelet left mounted in it.
func (k *Kubelet) shareRootDir(root string) {
	k.Node.T.Helper()
	if err := os.MkdirAll(root, 0o750); err != nil {
		k.Node.T.Fatal(err)
	}
	if err := unix.Mount(root, root, "", unix.MS_BIND, ""); err != nil {
		k.Node.T.Fatalf("bind the kubelet's root dir: %v", err)
	}
	k.Node.T.Cleanup(func() {
		if err := unix.Unmount(root, unix.MNT_DETACH); err != nil {
			k.Node.T.Errorf("unmount the kubelet's root dir: %v", err)
		}
	})
	if err := unix.Mount("", root, "", unix.MS_SHARED, ""); err != nil {
		k.Node.T.Fatalf("share the kubelet's root dir: %v", err)
	}
}

// Stop ends the kubelet by PID: SIGTERM, then SIGKILL.
func (k *Kubelet) Stop() {
	if k.Proc == nil {
		return
	}
	_, _ = k.Proc.Stop(30 * time.Second)
	k.Proc = nil
	if k.Node.T.Failed() {
		data, _ := os.ReadFile(k.LogFile)
		k.Node.T.Logf("kubelet log (last 200 lines):\n%s", LastLines(string(data), 200))
	}
}

func LastLines(s string, n int) string {
	lines := strings.Split(s, "\n")
	return strings.Join(lines[max(0, len(lines)-n):], "\n")
}

// WaitFor polls ok until it holds, failing the test with ok's last account after timeout, or at
// once if the kubelet exits.
func (k *Kubelet) WaitFor(what string, timeout time.Duration, ok func() (bool, string)) {
	k.Node.T.Helper()
	var last string
	for deadline := time.Now().Add(timeout); ; {
		var done bool
		if done, last = ok(); done {
			return
		}
		select {
		case <-k.Proc.Done():
			k.Node.T.Fatalf("the kubelet exited (%v) while waiting for %s", k.Proc.Err(), what)
		case <-time.After(500 * time.Millisecond):
		}
		if time.Now().After(deadline) {
			k.Node.T.Fatalf("%s: not within %s; last: %s", what, timeout, last)
		}
	}
}

// AddPod writes a static pod manifest; removePod deletes it.
func (k *Kubelet) AddPod(name, manifest string) {
	k.Node.T.Helper()
	if err := os.WriteFile(filepath.Join(k.Manifests, name+".yaml"), []byte(manifest), 0o644); err != nil {
		k.Node.T.Fatal(err)
	}
}

func (k *Kubelet) RemovePod(name string) {
	k.Node.T.Helper()
	if err := os.Remove(filepath.Join(k.Manifests, name+".yaml")); err != nil {
		k.Node.T.Fatal(err)
	}
}

// Get fetches a path of the kubelet's authenticated API (its self-signed certificate, anonymous
// access).
func (k *Kubelet) Get(path string) (int, string, error) {
	return k.Node.HTTPGetInNode("https://127.0.0.1:10250" + path)
}

// Pod is the kubelet's view of a static Pod: for a kubelet without an API server, /pods carries
// the status it would have reported.
func (k *Kubelet) Pod(name string) (*corev1.Pod, string) {
	status, body, err := k.Get("/pods")
	if err != nil || status != 200 {
		return nil, fmt.Sprintf("GET /pods: %d %v", status, err)
	}
	var pods corev1.PodList
	if err := json.Unmarshal([]byte(body), &pods); err != nil {
		return nil, fmt.Sprintf("GET /pods: %v", err)
	}
	for i := range pods.Items {
		if pods.Items[i].Name == name+"-"+KubeletNodeName {
			return &pods.Items[i], ""
		}
	}
	return nil, "no pod " + name + " in /pods"
}

// WaitPod waits until the kubelet reports pod name with its one container as ok says.
func (k *Kubelet) WaitPod(name, what string, ok func(*corev1.Pod, corev1.ContainerStatus) bool) (*corev1.Pod, corev1.ContainerStatus) {
	k.Node.T.Helper()
	var pod *corev1.Pod
	var ctr corev1.ContainerStatus
	k.WaitFor(name+": "+what, 3*time.Minute, func() (bool, string) {
		var why string
		if pod, why = k.Pod(name); pod == nil {
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

func PodReady(p *corev1.Pod) bool {
	for _, c := range p.Status.Conditions {
		if c.Type == corev1.PodReady {
			return c.Status == corev1.ConditionTrue
		}
	}
	return false
}
