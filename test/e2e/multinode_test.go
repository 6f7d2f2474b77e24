package e2e

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"net"
	"os"
	"os/exec"
	"strings"
	"testing"

	"github.com/cocoonstack/cocoon-cri/test/harness"

	"github.com/cocoonstack/cocoon-cri/pkg/cocoon"
	"github.com/cocoonstack/cocoon-cri/test/cocoonsim/guest"
	"github.com/cocoonstack/cocoon-cri/test/registry"
	"github.com/cocoonstack/cocoon-cri/test/testimage"
)

// twoNodePods are a VM pod serving HTTP on the second node behind a Service, and an ordinary pod
// on the first that serves HTTP too, for the way back.
const twoNodePods = `apiVersion: v1
kind: Pod
metadata: {name: web, labels: {app: web}}
spec:
  nodeName: cocoon-node-2
  runtimeClassName: cocoon
  terminationGracePeriodSeconds: 5
  containers:
  - {name: web, image: ` + harness.ClusterWebImage + `, imagePullPolicy: Never}
---
apiVersion: v1
kind: Service
metadata: {name: web}
spec:
  selector: {app: web}
  ports: [{port: 80, targetPort: 80}]
---
apiVersion: v1
kind: Pod
metadata: {name: client}
spec:
  nodeName: cocoon-node
  terminationGracePeriodSeconds: 2
  containers:
  - name: client
    image: ` + harness.ClusterBusyboxImage + `
    imagePullPolicy: Never
    command: [sh, -c, "mkdir -p /tmp/www && echo client here > /tmp/www/index.html && exec httpd -f -p 8080 -h /tmp/www"]
`

// sleepyDeployment is a Deployment of one VM pod on the second node that hibernates after 2 s of
// idleness, behind a Service.
const sleepyDeployment = `apiVersion: apps/v1
kind: Deployment
metadata: {name: sleepy}
spec:
  replicas: 1
  selector: {matchLabels: {app: sleepy}}
  template:
    metadata:
      labels: {app: sleepy}
      annotations: {vm.cocoonstack.io/hibernate-after: 2s}
    spec:
      nodeName: cocoon-node-2
      runtimeClassName: cocoon
      terminationGracePeriodSeconds: 5
      containers:
      - {name: sleepy, image: ` + harness.ClusterWebImage + `, imagePullPolicy: Never}
---
apiVersion: v1
kind: Service
metadata: {name: sleepy}
spec:
  selector: {app: sleepy}
  ports: [{port: 80, targetPort: 80}]
`

// vmPod is a VM pod of image pinned to node.
func vmPod(name, node, image string) string {
	return fmt.Sprintf(`apiVersion: v1
kind: Pod
metadata: {name: %s}
spec:
  nodeName: %s
  runtimeClassName: cocoon
  terminationGracePeriodSeconds: 5
  containers:
  - {name: app, image: %q}
`, name, node, image)
}

// httpGetWithNC is an HTTP GET through busybox nc (Debian's static busybox wget crashes), run in
// a pod: the answer's body and status line.
func httpGetWithNC(k kubectlUser, pod, hostport string) (string, error) {
	host, port, _ := net.SplitHostPort(hostport)
	return k.run(nil, "exec", pod, "--", "sh", "-c", fmt.Sprintf(`printf 'GET / HTTP/1.0\r\n\r\n' | nc -w 10 %s %s`, host, port))
}

// TestClusterOfTwoNodes: hack/cluster.sh up --nodes 2 brings up two nodes joined by one network,
// with kube-proxy on each, CoreDNS, and a registry both pull from. An ordinary pod on the first
// node reaches a VM pod on the second by pod IP and through a ClusterIP Service, and the VM pod
// reaches it back; both resolve the Service's name. A Deployment's VM pod hibernated when idle
// wakes on a request through its Service from the other node, and on kubectl exec. An OCI VM image pushed once to the registry runs on both nodes. A VM pod moves: it is
// checkpointed on the first node through the kubelet's API, the archive pushed with cocoon-cri
// image push, and a pod of it on the second node resumes the guest's memory with an identity of
// its own, the second node fetching the base image it never had; a snapshot whose base is nowhere
// fails its pull, naming the base. Deleting the pods leaves nothing
// on either node, and down removes the cluster.
func TestClusterOfTwoNodes(t *testing.T) {
	t.Parallel()
	env, nodes := upCluster(t, "--nodes", "2")
	if len(nodes) != 2 {
		t.Fatalf("hack/cluster.sh up --nodes 2 described %d nodes", len(nodes))
	}
	k := kubectlUser{t: t, env: append(os.Environ(), "KUBECONFIG="+env["KUBECONFIG"])}
	if ready := k.must("get", "nodes", "-o", `jsonpath={range .items[*]}{.metadata.name}={.status.conditions[?(@.type=="Ready")].status} {end}`); ready != "cocoon-node=True cocoon-node-2=True " {
		t.Fatalf("the nodes: %q", ready)
	}
	if _, err := k.run(strings.NewReader(twoNodePods), "apply", "-f", "-"); err != nil {
		t.Fatal(err)
	}
	k.must("wait", "--for=condition=Ready", "--timeout=180s", "pod/web", "pod/client")
	webIP := k.must("get", "pod", "web", "-o", "jsonpath={.status.podIP}")
	clientIP := k.must("get", "pod", "client", "-o", "jsonpath={.status.podIP}")
	if !strings.HasPrefix(webIP, "10.88.1.") || !strings.HasPrefix(clientIP, "10.88.0.") {
		t.Fatalf("pod IPs: web %s, client %s; want each in its node's pod subnet", webIP, clientIP)
	}

	// Pod to pod across the nodes, both ways, and a Service on one node to a VM pod on the other.
	if out, err := httpGetWithNC(k, "client", net.JoinHostPort(webIP, "80")); err != nil || !strings.Contains(out, "cocoon-sim guest web") {
		t.Errorf("the VM pod on the other node by pod IP: %q %v", out, err)
	}
	if out, err := httpGetWithNC(k, "web", net.JoinHostPort(clientIP, "8080")); err != nil || !strings.Contains(out, "client here") {
		t.Errorf("the ordinary pod on the other node from the VM pod: %q %v", out, err)
	}
	serviceIP := k.must("get", "service", "web", "-o", "jsonpath={.spec.clusterIP}")
	k.eventually("the Service reaches the VM pod on the other node", func() error {
		out, err := httpGetWithNC(k, "client", net.JoinHostPort(serviceIP, "80"))
		if err == nil && !strings.Contains(out, "reached at "+webIP) {
			err = fmt.Errorf("answer %q", out)
		}
		return err
	})

	// Cluster DNS: CoreDNS on the first node answers for the Service, to an ordinary pod there and
	// to the VM pod on the other node (whose guest has the kubelet's resolver and search path).
	for _, pod := range []string{"client", "web"} {
		if out, err := k.run(nil, "exec", pod, "--", "nslookup", "web.default.svc.cluster.local"); err != nil || !strings.Contains(out, "Address: "+serviceIP) {
			t.Errorf("the Service's name from %s: %q %v", pod, out, err)
		}
	}
	if out := k.must("exec", "web", "--", "cat", "/etc/resolv.conf"); !strings.Contains(out, "nameserver "+harness.ClusterDNSIP) || !strings.Contains(out, "search default.svc.cluster.local svc.cluster.local cluster.local") {
		t.Errorf("the VM pod's resolv.conf: %q", out)
	}

	// The VM pod of a Deployment that hibernates when idle wakes on its first packet, here one a
	// Service on the other node sent on, and on kubectl exec.
	if _, err := k.run(strings.NewReader(sleepyDeployment), "apply", "-f", "-"); err != nil {
		t.Fatal(err)
	}
	k.must("rollout", "status", "deployment/sleepy", "--timeout=180s")
	secondCRI := "unix://" + nodes[1]["socket"]
	sleepy := mustCrictlOn(t, secondCRI, "ps", "--name", "^sleepy$", "-q")
	hibernated := func() {
		t.Helper()
		k.eventually("the idle VM pod hibernated", func() error {
			var info struct {
				Info struct {
					Hibernation struct{ Hibernated bool } `json:"hibernation"`
				} `json:"info"`
			}
			if err := json.Unmarshal([]byte(mustCrictlOn(t, secondCRI, "inspect", sleepy)), &info); err != nil || !info.Info.Hibernation.Hibernated {
				return fmt.Errorf("not hibernated (%v)", err)
			}
			return nil
		})
	}
	hibernated()
	sleepyIP := k.must("get", "service", "sleepy", "-o", "jsonpath={.spec.clusterIP}")
	k.eventually("the hibernated VM pod answers through its Service", func() error {
		out, err := httpGetWithNC(k, "client", net.JoinHostPort(sleepyIP, "80"))
		if err == nil && !strings.Contains(out, "cocoon-sim guest sleepy") {
			err = fmt.Errorf("answer %q", out)
		}
		return err
	})
	hibernated()
	if out := k.must("exec", "deployment/sleepy", "--", "cat", "/etc/hostname"); !strings.HasPrefix(out, "sleepy-") {
		t.Errorf("kubectl exec in the hibernated VM pod: %q", out)
	}

	// An OCI VM image pushed once runs on every node: the kubelet pulls it (containerd fetches
	// it, cocoon brings it in for the VM pod).
	reg := env["COCOON_REGISTRY"]
	var layer bytes.Buffer
	if err := testimage.WriteOCILayer(&layer, testimage.LayerOptions{Guest: guest.Spec{Busybox: true, HTTPPort: 80}}); err != nil {
		t.Fatal(err)
	}
	pushed, err := registry.Target{Host: reg}.PushOCIImage(context.Background(), "cocoon/web:v1", layer.Bytes())
	if err != nil {
		t.Fatal(err)
	}
	second := nodes[1]
	if images := cocoonImagesOf(t, second); len(images) != 0 {
		t.Fatalf("the second node's cocoon has images before any pull: %v", images)
	}
	if _, err := k.run(strings.NewReader(vmPod("src", "cocoon-node", pushed.Ref)), "apply", "-f", "-"); err != nil {
		t.Fatal(err)
	}
	k.must("wait", "--for=condition=Ready", "--timeout=180s", "pod/src")
	k.must("exec", "src", "--", "sh", "-c", "echo kept > /dev/shm/state")

	// The move: the kubelet's checkpoint API on the first node, a push, a pod on the second.
	var checkpointed struct{ Items []string }
	if err := json.Unmarshal([]byte(k.must("create", "--request-timeout=0", "--raw", "/api/v1/nodes/cocoon-node/proxy/checkpoint/default/src/app", "-f", os.DevNull)), &checkpointed); err != nil || len(checkpointed.Items) != 1 {
		t.Fatalf("the kubelet's checkpoint answer: %v %v", checkpointed, err)
	}
	moved := reg + "/checkpoints/src:1"
	push := exec.Command(bins.CocoonCRI, "image", "push", "--registry-insecure", reg, checkpointed.Items[0], moved)
	if out, err := push.CombinedOutput(); err != nil {
		t.Fatalf("cocoon-cri image push: %v: %s", err, out)
	}
	k.must("exec", "src", "--", "sh", "-c", "echo later > /dev/shm/later")
	if _, err := k.run(strings.NewReader(vmPod("moved", "cocoon-node-2", moved)), "apply", "-f", "-"); err != nil {
		t.Fatal(err)
	}
	k.must("wait", "--for=condition=Ready", "--timeout=180s", "pod/moved")
	if out := k.must("exec", "moved", "--", "sh", "-c", "cat /dev/shm/state; ls /dev/shm; hostname"); out != "kept\nstate\nmoved\n" {
		t.Errorf("the moved guest: %q, want its memory at the checkpoint and its own hostname", out)
	}
	if ip := k.must("get", "pod", "moved", "-o", "jsonpath={.status.podIP}"); !strings.HasPrefix(ip, "10.88.1.") {
		t.Errorf("the moved pod's IP %q is not on the second node's pod subnet", ip)
	}
	// The second node never had the checkpoint's base image: its pull fetched it by the digest the
	// snapshot records. (On one machine the nodes' cocoon roots are different directories, so the
	// base files the snapshot names stay readable; the pull shows in the second node's images.)
	base := reg + "/cocoon/web@" + pushed.Digest
	if images := cocoonImagesOf(t, second); len(images) != 1 || images[0] != base {
		t.Errorf("the second node's cocoon images after the move: %v, want the base %s", images, base)
	}

	// A snapshot whose base the registry does not have: the kubelet's pull fails (ErrImagePull)
	// and says which base and why.
	var orphan bytes.Buffer
	if err := testimage.WriteSnapshotArchive(&orphan, testimage.SnapshotOptions{Name: "orphan", Image: reg + "/cocoon/absent:v1"}); err != nil {
		t.Fatal(err)
	}
	if _, err := (registry.Target{Host: reg}).PushSnapshot(context.Background(), "checkpoints/orphan:1", &orphan, registry.SnapshotPush{}); err != nil {
		t.Fatal(err)
	}
	if _, err := k.run(strings.NewReader(vmPod("orphan", "cocoon-node-2", reg+"/checkpoints/orphan:1")), "apply", "-f", "-"); err != nil {
		t.Fatal(err)
	}
	k.eventually("the pull of a snapshot without its base fails", func() error {
		waiting := k.must("get", "pod", "orphan", "-o", "jsonpath={.status.containerStatuses[0].state.waiting.reason}: {.status.containerStatuses[0].state.waiting.message}")
		if !strings.HasPrefix(waiting, "ErrImagePull: ") || !strings.Contains(waiting, "FailedPrecondition") ||
			!strings.Contains(waiting, "the snapshot's base image is not on this node: "+reg+"/cocoon/absent@sha256:") {
			return fmt.Errorf("the pod waits with %q", waiting)
		}
		return nil
	})

	// The same image, pulled on the second node as well.
	if _, err := k.run(strings.NewReader(vmPod("src-2", "cocoon-node-2", pushed.Ref)), "apply", "-f", "-"); err != nil {
		t.Fatal(err)
	}
	k.must("wait", "--for=condition=Ready", "--timeout=180s", "pod/src-2")
	if out := k.must("exec", "src-2", "--", "hostname"); out != "src-2\n" {
		t.Errorf("the registry's image on the second node: hostname %q", out)
	}

	k.must("delete", "deployment", "sleepy", "--wait", "--timeout=180s")
	k.must("delete", "pod", "--all", "--wait", "--timeout=180s")
	k.eventually("nothing left of the pods on either node", func() error {
		var left []string
		for i, files := range nodes {
			pooled := 0
			if i == 0 {
				pooled = harness.ClusterPoolSize
			}
			for _, l := range nodeLeftovers(files, pooled) {
				left = append(left, files["name"]+": "+l)
			}
		}
		if len(left) > 0 {
			return fmt.Errorf("%s", strings.Join(left, "; "))
		}
		return nil
	})
}

// cocoonImagesOf lists the names of the OCI and cloud images a cluster node's cocoon holds.
func cocoonImagesOf(t *testing.T, files map[string]string) []string {
	t.Helper()
	out, err := exec.Command(bins.CocoonSim, "--root-dir", files["cocoon-root"], "--run-dir", files["cocoon-run"],
		"--log-dir", files["cocoon-log"], "image", "list", "-o", "json").Output()
	if err != nil {
		t.Fatalf("cocoon image list on %s: %v", files["name"], err)
	}
	images, err := decodeCocoonList[cocoon.Image](out)
	if err != nil {
		t.Fatal(err)
	}
	names := make([]string, len(images))
	for i, img := range images {
		names[i] = img.Name
	}
	return names
}
