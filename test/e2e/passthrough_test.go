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
	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"

	containerdtest "github.com/cocoonstack/cocoon-cri/test/containerd"
	"github.com/cocoonstack/cocoon-cri/test/harness"
	"github.com/cocoonstack/cocoon-cri/test/registry"
)

// busyboxContainer is a container of containerd's busybox image that says hello in its log and
// then stays up.
func busyboxContainer(name, image string) *runtimeapi.ContainerConfig {
	return &runtimeapi.ContainerConfig{
		Metadata: &runtimeapi.ContainerMetadata{Name: name},
		Image:    &runtimeapi.ImageSpec{Image: image},
		Command:  []string{"sh", "-c", "echo hello from " + name + "; exec sleep 3600"},
		LogPath:  name + ".log",
		Labels:   map[string]string{"tier": "container"},
	}
}

// containerdPod runs a pod on containerd (no runtime handler) with one busybox container, started.
func (n *node) containerdPod(name, image string, hostNetwork bool) (podID, ctrID string) {
	n.t.Helper()
	cfg := n.podConfig(name, "uid-"+name)
	if hostNetwork {
		cfg.Linux.SecurityContext = &runtimeapi.LinuxSandboxSecurityContext{
			NamespaceOptions: &runtimeapi.NamespaceOption{Network: runtimeapi.NamespaceMode_NODE},
		}
		cfg.Hostname = ""
	}
	podFile := n.configFile(name+"-pod.json", cfg)
	podID = n.mustCrictl("runp", podFile)
	ctrID = n.mustCrictl("create", "--no-pull", podID, n.configFile(name+"-ctr.json", busyboxContainer("app", image)), podFile)
	n.mustCrictl("start", ctrID)
	return podID, ctrID
}

// crictlPods is `crictl pods -o json`: each sandbox's ID and runtime handler.
func (n *node) crictlPods() map[string]string {
	n.t.Helper()
	var out struct {
		Items []struct {
			ID             string `json:"id"`
			RuntimeHandler string `json:"runtimeHandler"`
		} `json:"items"`
	}
	if err := json.Unmarshal([]byte(n.mustCrictl("pods", "-o", "json")), &out); err != nil {
		n.t.Fatal(err)
	}
	pods := map[string]string{}
	for _, p := range out.Items {
		pods[p.ID] = p.RuntimeHandler
	}
	return pods
}

// TestPassthroughRunsEveryPod: on one node, a hostNetwork pod (as kube-proxy) and an ordinary pod
// run on containerd through cocoon-cri, and a VM pod beside them. crictl's pods, ps, stats, exec,
// logs, inspect and images show and reach all three, each on its own runtime, and removing them
// leaves nothing on either.
func TestPassthroughRunsEveryPod(t *testing.T) {
	t.Parallel()
	n, ctrd := newPassthroughNode(t, containerdtest.Options{})
	n.Start()
	n.withSnapshot()
	busybox, _ := ctrd.Images()

	hostPod, hostCtr := n.containerdPod("kube-proxy", busybox, true)
	plainPod, plainCtr := n.containerdPod("plain", busybox, false)
	vmPod, vmCtr, _ := n.runningPod("vm", snapRef)

	pods := n.crictlPods()
	if len(pods) != 3 || pods[hostPod] != "" || pods[plainPod] != "" || pods[vmPod] != "cocoon" {
		t.Fatalf("crictl pods: %v, want the two containerd pods (default handler) and the cocoon one", pods)
	}
	// containerd itself has exactly its two, under the same IDs.
	direct := n.mustCrictlTo(ctrd.Endpoint(), "pods", "-q")
	if ids := strings.Fields(direct); len(ids) != 2 || !slices.Contains(ids, hostPod) || !slices.Contains(ids, plainPod) {
		t.Fatalf("containerd's own pods: %q", direct)
	}
	if ps := strings.Fields(n.mustCrictl("ps", "-q")); len(ps) != 3 {
		t.Fatalf("crictl ps: %v, want three running containers", ps)
	}

	// The ordinary pod has an address of the node's pod network, the hostNetwork one none.
	if ip, _ := field(n.inspect("inspectp", plainPod), "status", "network", "ip").(string); !strings.HasPrefix(ip, "10.88.0.") {
		t.Errorf("the containerd pod's IP %q is not on the node's pod network", ip)
	}
	if ip, _ := field(n.inspect("inspectp", hostPod), "status", "network", "ip").(string); ip != "" {
		t.Errorf("the hostNetwork pod has a pod IP %q", ip)
	}
	if ns, _ := field(n.inspect("inspectp", hostPod), "status", "linux", "namespaces", "options", "network").(string); ns != "NODE" {
		t.Errorf("the hostNetwork pod's network namespace mode: %q", ns)
	}

	for ctr, want := range map[string]string{hostCtr: "CONTAINER_RUNNING", plainCtr: "CONTAINER_RUNNING", vmCtr: "CONTAINER_RUNNING"} {
		if st := field(n.inspect("inspect", ctr), "status", "state"); st != want {
			t.Errorf("inspect %s: state %v", ctr, st)
		}
	}
	// exec through each runtime's own stream server, and ExecSync.
	for _, ctr := range []string{hostCtr, plainCtr, vmCtr} {
		if out := n.mustCrictl("exec", ctr, "echo", "hi-"+ctr[:6]); out != "hi-"+ctr[:6] {
			t.Errorf("exec in %s: %q", ctr, out)
		}
		if out := n.mustCrictl("exec", "--sync", ctr, "echo", "sync"); out != "sync" {
			t.Errorf("exec --sync in %s: %q", ctr, out)
		}
	}
	for ctr, name := range map[string]string{hostCtr: "app", plainCtr: "app"} {
		if logs := n.mustCrictl("logs", ctr); !strings.Contains(logs, "hello from "+name) {
			t.Errorf("logs of %s: %q", ctr, logs)
		}
	}
	if logs := n.mustCrictl("logs", vmCtr); !strings.Contains(logs, "cocoon-sim guest") {
		t.Errorf("the VM's console log: %q", logs)
	}
	var stats struct {
		Stats []struct {
			Attributes struct {
				ID string `json:"id"`
			} `json:"attributes"`
		} `json:"stats"`
	}
	if err := json.Unmarshal([]byte(n.mustCrictl("stats", "-o", "json")), &stats); err != nil {
		t.Fatal(err)
	}
	var statIDs []string
	for _, s := range stats.Stats {
		statIDs = append(statIDs, s.Attributes.ID)
	}
	for _, ctr := range []string{hostCtr, plainCtr, vmCtr} {
		if !slices.Contains(statIDs, ctr) {
			t.Errorf("crictl stats has no figures for %s (has %v)", ctr, statIDs)
		}
	}
	images := n.mustCrictl("images", "-o", "json")
	for _, ref := range []string{busybox, snapRef} {
		if !strings.Contains(images, strings.SplitN(ref, ":", 2)[0]) {
			t.Errorf("crictl images lacks %s: %s", ref, images)
		}
	}
	// Both runtimes are in Status, and both are ready.
	handlers := n.info().RuntimeHandlers
	var names []string
	for _, h := range handlers {
		names = append(names, h.Name)
	}
	if !slices.Contains(names, "cocoon") || !slices.Contains(names, "") {
		t.Errorf("runtime handlers %q: want containerd's default and cocoon", names)
	}
	if c := n.conditions()["RuntimeReady"]; !c.Status {
		t.Errorf("RuntimeReady with both runtimes up: %+v", c)
	}

	for _, pod := range []string{hostPod, plainPod, vmPod} {
		n.mustCrictl("stopp", pod)
		n.mustCrictl("rmp", pod)
	}
	if left := n.crictlPods(); len(left) != 0 {
		t.Fatalf("pods left: %v", left)
	}
	if direct := n.mustCrictlTo(ctrd.Endpoint(), "pods", "-q"); direct != "" {
		t.Fatalf("containerd keeps pods: %q", direct)
	}
	if left := n.leftovers(); len(left) != 0 {
		t.Fatalf("left on the node: %v", left)
	}
}

// TestPassthroughOutlivesContainerd: containerd killed mid-run. Its pods' RPCs and the node's
// lists answer Unavailable naming it, the node is not Ready, and the VM pods go on (a new one
// even starts); once containerd is back all is well again by itself, and a restart of cocoon-cri
// finds every pod where it was.
func TestPassthroughOutlivesContainerd(t *testing.T) {
	t.Parallel()
	n, ctrd := newPassthroughNode(t, containerdtest.Options{})
	n.Start()
	n.withSnapshot()
	busybox, _ := ctrd.Images()
	ctrdPod, ctrdCtr := n.containerdPod("plain", busybox, false)
	vmPod, vmCtr, _ := n.runningPod("vm", snapRef)

	ctrd.Kill()
	for _, args := range [][]string{{"inspectp", ctrdPod}, {"inspect", ctrdCtr}, {"pods"}, {"ps"}} {
		msg := n.crictlFails("Unavailable", args...)
		if !strings.Contains(msg, ctrd.Endpoint()) {
			t.Errorf("crictl %v: %s; want the passthrough runtime named", args, msg)
		}
	}
	rr := n.conditions()["RuntimeReady"]
	if rr.Status || rr.Reason != "PassthroughRuntimeUnavailable" || !strings.Contains(rr.Message, ctrd.Endpoint()) {
		t.Errorf("RuntimeReady with containerd down: %+v", rr)
	}
	// The VM pods need no containerd.
	if out := n.mustCrictl("exec", "--sync", vmCtr, "echo", "still here"); out != "still here" {
		t.Errorf("exec in the VM pod with containerd down: %q", out)
	}
	if st := field(n.inspect("inspect", vmCtr), "status", "state"); st != "CONTAINER_RUNNING" {
		t.Errorf("the VM container with containerd down: %v", st)
	}
	secondPod, secondCtr, _ := n.runningPod("vm2", snapRef)

	ctrd.Restart()
	deadline := time.Now().Add(time.Minute)
	for {
		if _, err := n.crictl("pods"); err == nil && n.conditions()["RuntimeReady"].Status {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("cocoon-cri did not reach containerd again within a minute:\n%s", n.Log())
		}
		time.Sleep(200 * time.Millisecond)
	}
	n.Restart()
	pods := n.crictlPods()
	for _, pod := range []string{ctrdPod, vmPod, secondPod} {
		if _, ok := pods[pod]; !ok {
			t.Errorf("pod %s is not listed after containerd and cocoon-cri restarted: %v", pod, pods)
		}
	}
	for _, ctr := range []string{ctrdCtr, vmCtr, secondCtr} {
		if out := n.mustCrictl("exec", "--sync", ctr, "echo", "back"); out != "back" {
			t.Errorf("exec in %s after the restarts: %q", ctr, out)
		}
	}
	for _, pod := range []string{ctrdPod, vmPod, secondPod} {
		n.mustCrictl("stopp", pod)
		n.mustCrictl("rmp", pod)
	}
}

// TestCgroupDriverMismatchIsRefused: a containerd with the systemd cgroup driver and cocoon-cri
// with cgroupfs would put VMs where the kubelet does not look: cocoon-cri refuses to start, and
// says which drivers.
func TestCgroupDriverMismatchIsRefused(t *testing.T) {
	t.Parallel()
	n, ctrd := newPassthroughNode(t, containerdtest.Options{SystemdCgroup: true}, "--cgroup-driver", "cgroupfs")
	n.Launch()
	daemon := n.Daemon
	if !n.Died(time.Minute) {
		t.Fatalf("cocoon-cri still runs with a cgroup driver other than containerd's\n%s", n.Log())
	}
	if daemon.Err() == nil {
		t.Fatal("cocoon-cri exited 0")
	}
	log := n.Log()
	if !strings.Contains(log, "cocoon-cri uses cgroupfs") || !strings.Contains(log, ctrd.Endpoint()+" uses systemd") {
		t.Fatalf("the refusal does not name both drivers:\n%s", log)
	}
}

// TestCritestThroughPassthrough runs the CRI validation suite without a runtime handler, as for
// any ordinary pod, straight against containerd and then through cocoon-cri: the same specs must
// pass both ways. The specs listed in testdata/critest-passthrough-skips.txt are left out of both
// runs, each for its reason (no registry here, host security modules).
func TestCritestThroughPassthrough(t *testing.T) {
	t.Parallel()
	n, ctrd := newPassthroughNode(t, containerdtest.Options{})
	n.Start()
	skip := skipList(t, "testdata/critest-passthrough-skips.txt")
	passed := func(endpoint, tag string) []string {
		report := filepath.Join(n.Dir, "critest-"+tag+".json")
		out, err := n.critest(endpoint, "", skip, "--ginkgo.json-report", report)
		if _, statErr := os.Stat(report); statErr != nil {
			t.Fatalf("critest against %s wrote no report: %v\n%s", tag, err, out)
		}
		var names, failed []string
		for _, spec := range readCritestReport(t, report) {
			switch spec.State {
			case "passed":
				names = append(names, spec.name())
			case "skipped", "pending":
			default:
				failed = append(failed, spec.name())
			}
		}
		slices.Sort(names)
		t.Logf("critest %s: %d specs passed, %d failed: %q", tag, len(names), len(failed), failed)
		return names
	}
	direct := passed(ctrd.Endpoint(), "containerd")
	through := passed("unix://"+n.Socket, "passthrough")
	// A broken set-up must not pass by having nothing pass either way.
	if len(direct) < 30 {
		t.Fatalf("only %d specs passed straight against containerd: %q", len(direct), direct)
	}
	var onlyDirect, onlyThrough []string
	for _, name := range direct {
		if !slices.Contains(through, name) {
			onlyDirect = append(onlyDirect, name)
		}
	}
	for _, name := range through {
		if !slices.Contains(direct, name) {
			onlyThrough = append(onlyThrough, name)
		}
	}
	if len(onlyDirect)+len(onlyThrough) > 0 {
		t.Fatalf("critest results differ:\npassed only against containerd: %q\npassed only through cocoon-cri: %q\n%s",
			onlyDirect, onlyThrough, n.Log())
	}
	if pods := n.mustCrictl("pods", "-q"); pods != "" {
		t.Fatalf("critest left sandboxes: %q", pods)
	}
}

// containerdStaticPod is a static pod of containerd's busybox image (never pulled: no registry)
// that logs a line, then sleeps, with an exec readiness probe.
func containerdStaticPod(name, image string, hostNetwork bool) string {
	return fmt.Sprintf(`apiVersion: v1
kind: Pod
metadata: {name: %[1]s, namespace: default}
spec:
  hostNetwork: %[3]t
  terminationGracePeriodSeconds: 2
  containers:
  - name: %[1]s
    image: %[2]s
    imagePullPolicy: Never
    command: [sh, -c, "echo %[1]s up; exec sleep 3600"]
    readinessProbe:
      exec: {command: [sh, -c, "test -d /proc/1"]}
      periodSeconds: 1
`, name, image, hostNetwork)
}

// TestKubeletThroughPassthrough: a real kubelet pointed at cocoon-cri runs what every node runs
// beside its workloads, a hostNetwork pod (as kube-proxy) and an ordinary pod (as a CNI agent's
// helper), on containerd: both turn Running and Ready, the ordinary one with an address of the
// node's pod network, their logs and exec reach containerd through the kubelet's own API, and
// removing the manifests removes them from containerd. (A standalone kubelet has no RuntimeClass
// objects, so it gives every pod the default handler; TestKubelet covers the VM pods.)
func TestKubeletThroughPassthrough(t *testing.T) {
	t.Parallel()
	n, ctrd := newPassthroughNode(t, containerdtest.Options{})
	n.Start()
	busybox, _ := ctrd.Images()
	k := n.StartKubelet()
	k.AddPod("proxy", containerdStaticPod("proxy", busybox, true))
	k.AddPod("agent", containerdStaticPod("agent", busybox, false))

	for _, name := range []string{"proxy", "agent"} {
		pod, _ := k.WaitPod(name, "running and Ready", func(p *corev1.Pod, c corev1.ContainerStatus) bool {
			return p.Status.Phase == corev1.PodRunning && c.State.Running != nil && harness.PodReady(p)
		})
		if name == "agent" && !strings.HasPrefix(pod.Status.PodIP, "10.88.0.") {
			t.Errorf("the ordinary pod's IP %q is not on the node's pod network", pod.Status.PodIP)
		}
		k.WaitFor(name+"'s log through the kubelet", time.Minute, func() (bool, string) {
			status, body, err := k.Get("/containerLogs/default/" + pod.Name + "/" + name)
			return err == nil && status == 200 && strings.Contains(body, name+" up"), fmt.Sprintf("%d %q %v", status, body, err)
		})
		q := url.Values{"command": {"echo", "exec in " + name}, "output": {"1"}, "error": {"1"}}
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		res := n.stream(ctx, "https://127.0.0.1:10250/exec/default/"+pod.Name+"/"+name+"?"+q.Encode(), nil, streamOpts{stderr: true})
		cancel()
		if res.err != nil || strings.TrimSpace(res.stdout) != "exec in "+name {
			t.Errorf("exec in %s through the kubelet: %v, stdout %q stderr %q", name, res.err, res.stdout, res.stderr)
		}
	}
	pods := n.crictlPods()
	direct := strings.Fields(n.mustCrictlTo(ctrd.Endpoint(), "pods", "-q", "--state", "ready"))
	if len(direct) != 2 {
		t.Fatalf("containerd's ready pods: %q; through cocoon-cri: %v", direct, pods)
	}
	for _, id := range direct {
		if handler, ok := pods[id]; !ok || handler != "" {
			t.Errorf("containerd's pod %s through cocoon-cri: listed %t, handler %q", id, ok, handler)
		}
	}

	k.RemovePod("proxy")
	k.RemovePod("agent")
	k.WaitFor("the pods removed from containerd", 3*time.Minute, func() (bool, string) {
		left := n.mustCrictlTo(ctrd.Endpoint(), "pods", "-q")
		return left == "", "containerd still has " + left
	})
}

// TestPassthroughOCIVMImage: on a passthrough node the kubelet's PullImage carries no handler, so
// a plain OCI image, an OCI VM image among them, goes to containerd. A VM pod that then needs it
// gets it brought into cocoon at CreateContainer, with the credentials the pull was given, and
// boots from it; containerd's copy stays where it was.
func TestPassthroughOCIVMImage(t *testing.T) {
	t.Parallel()
	n, ctrd := newPassthroughNode(t, containerdtest.Options{})
	n.Start()
	if !erofsHasTar() {
		t.Skip("mkfs.erofs has no --tar: cocoon cannot bring in an OCI VM image here (make setup builds one)")
	}
	reg := n.registry(registry.Options{Username: "puller", Password: "s3cret"})
	pushed := n.pushOCIImage(reg.Target(), "e2e/vm:v1")
	ref := reg.Host + "/e2e/vm:v1"
	n.mustCrictl("pull", "--creds", "puller:s3cret", ref)
	if images := n.mustCrictlTo(ctrd.Endpoint(), "images", "-q"); !strings.Contains(images, "sha256:") {
		t.Fatalf("containerd did not pull %s: %q", ref, images)
	}
	if len(n.cocoonImages()) != 0 {
		t.Fatalf("an OCI image without a handler went to cocoon: %v", n.cocoonImages())
	}

	_, ctrID, _ := n.runningPod("vm", ref)
	n.assertRunning(ctrID)
	if len(n.cocoonImages()) != 1 || !strings.Contains(n.Log(), "image brought into cocoon for a VM pod") {
		t.Fatalf("the image was not brought into cocoon: %+v", n.cocoonImages())
	}
	if got, _ := field(n.inspect("inspect", ctrID), "status", "imageRef").(string); got != reg.Host+"/e2e/vm@"+pushed.Digest {
		t.Errorf("the VM container's image: %q, want the pulled manifest %s", got, pushed.Digest)
	}

	// containerd's busybox is no VM image, and its registry is out of reach: a clear refusal.
	busybox, _ := ctrd.Images()
	podFile := n.configFile("bb-pod.json", n.podConfig("bb", "uid-bb"))
	podID := n.mustCrictl("runp", "--runtime", "cocoon", podFile)
	_, err := n.crictl("create", "--no-pull", podID, n.configFile("bb-ctr.json", containerConfig("app", busybox)), podFile)
	if err == nil || !strings.Contains(err.Error(), "is not in cocoon and bringing it in from its registry failed") {
		t.Fatalf("a VM pod of a container image cocoon cannot get: %v", err)
	}
	if len(n.cocoonImages()) != 1 {
		t.Fatalf("a failed bring-in left an image in cocoon: %+v", n.cocoonImages())
	}
}
