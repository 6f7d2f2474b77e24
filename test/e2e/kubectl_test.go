package e2e

import (
	"bufio"
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"maps"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/cocoonstack/cocoon-cri/test/harness"

	"github.com/cocoonstack/cocoon-cri/pkg/cocoon"
	containerdtest "github.com/cocoonstack/cocoon-cri/test/containerd"
	"github.com/cocoonstack/cocoon-cri/test/testproc"
)

// clusterHost is held by the test whose cluster is up: a cluster takes the host's link and routes
// (test/harness/cluster.go), so two cannot run at once.
var clusterHost sync.Mutex

// upCluster runs hack/cluster.sh up with args, serving with this run's cocoon-cluster (and so its
// race-built cocoon-cri), and down when the test ends. It returns the environment up printed and each node's file locations.
func upCluster(t *testing.T, args ...string) (env map[string]string, nodes []map[string]string) {
	t.Helper()
	clusterHost.Lock()
	t.Cleanup(clusterHost.Unlock)
	root, err := harness.RepoRoot()
	if err != nil {
		t.Fatal(err)
	}
	// cluster.sh up makes dir afresh; the directory around it records this test binary as its
	// owner, so that a later run removes the cluster (whose server runs in a session of its own) if
	// this one is killed.
	owned, err := harness.MkdirOwned("", "-cluster")
	if err != nil {
		t.Fatal(err)
	}
	dir := filepath.Join(owned, "cluster")
	script := func(verb string, args ...string) *exec.Cmd {
		cmd := exec.Command(filepath.Join(root, "hack", "cluster.sh"), append([]string{verb}, args...)...)
		cmd.Env = append(os.Environ(), "COCOON_CLUSTER_DIR="+dir, "COCOON_CLUSTER_SERVER="+clusterProgram,
			"COCOON_CRI_BIN="+filepath.Dir(bins.Kubectl))
		return cmd
	}
	t.Cleanup(func() {
		if t.Failed() {
			log, _ := os.ReadFile(filepath.Join(dir, "cluster.log"))
			// What failed comes first; the daemons' logs, printed as the cluster is undone, last.
			var failures []string
			for line := range strings.Lines(string(log)) {
				if strings.Contains(line, " error: ") {
					failures = append(failures, line)
				}
			}
			t.Logf("the cluster's failures:\n%s\nthe cluster's log (last 150 lines):\n%s",
				strings.Join(failures, ""), harness.LastLines(string(log), 150))
		}
		if out, err := script("down").CombinedOutput(); err != nil {
			t.Errorf("hack/cluster.sh down: %v: %s", err, out)
		}
		if _, err := os.Stat(dir); !os.IsNotExist(err) {
			t.Errorf("hack/cluster.sh down left %s", dir)
		}
		if err := os.RemoveAll(owned); err != nil {
			t.Error(err)
		}
	})
	out, err := script("up", args...).Output()
	if err != nil {
		var stderr []byte
		if exit, ok := errors.AsType[*exec.ExitError](err); ok {
			stderr = exit.Stderr
		}
		t.Fatalf("hack/cluster.sh up: %v\n%s", err, stderr)
	}
	env = map[string]string{}
	for _, line := range strings.Split(strings.TrimSpace(string(out)), "\n") {
		key, value, ok := strings.Cut(strings.TrimPrefix(line, "export "), "=")
		if !ok {
			t.Fatalf("hack/cluster.sh up printed %q, want export lines", out)
		}
		env[key] = value
	}
	if env["KUBECONFIG"] == "" || !strings.HasPrefix(env["CONTAINER_RUNTIME_ENDPOINT"], "unix://") || env["COCOON_REGISTRY"] == "" {
		t.Fatalf("hack/cluster.sh up printed %q, want KUBECONFIG, CONTAINER_RUNTIME_ENDPOINT and COCOON_REGISTRY", out)
	}
	for i := 1; ; i++ {
		file := "node"
		if i > 1 {
			file = fmt.Sprintf("node-%d", i)
		}
		data, err := os.ReadFile(filepath.Join(dir, file))
		if os.IsNotExist(err) && i > 1 {
			return env, nodes
		}
		if err != nil {
			t.Fatal(err)
		}
		files := map[string]string{}
		for _, line := range strings.Split(strings.TrimSpace(string(data)), "\n") {
			key, value, _ := strings.Cut(line, "=")
			files[key] = value
		}
		nodes = append(nodes, files)
	}
}

// kubectlUser runs kubectl as a user of hack/cluster.sh does: on the host, with the printed
// KUBECONFIG.
type kubectlUser struct {
	t   *testing.T
	env []string
}

func (k kubectlUser) cmd(stdin io.Reader, args ...string) *exec.Cmd {
	cmd := exec.Command(bins.Kubectl, append([]string{"--request-timeout", "90s"}, args...)...)
	cmd.Env, cmd.Stdin = k.env, stdin
	return cmd
}

// start runs a kubectl that keeps going (logs -f, port-forward), killed when the test ends at
// the latest, and returns its output.
func (k kubectlUser) start(args ...string) (*testproc.Process, io.Reader) {
	k.t.Helper()
	cmd := k.cmd(nil, args...)
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		k.t.Fatal(err)
	}
	proc, err := testproc.Start(cmd)
	if err != nil {
		k.t.Fatal(err)
	}
	k.t.Cleanup(proc.Kill)
	return proc, stdout
}

func (k kubectlUser) run(stdin io.Reader, args ...string) (string, error) {
	var stderr strings.Builder
	cmd := k.cmd(stdin, args...)
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		return string(out), fmt.Errorf("kubectl %s: %w: %s", strings.Join(args, " "), err, stderr.String())
	}
	return string(out), nil
}

func (k kubectlUser) must(args ...string) string {
	k.t.Helper()
	out, err := k.run(nil, args...)
	if err != nil {
		k.t.Fatal(err)
	}
	return out
}

// eventually polls fn for up to three minutes.
func (k kubectlUser) eventually(what string, fn func() error) {
	k.t.Helper()
	var last error
	for deadline := time.Now().Add(3 * time.Minute); time.Now().Before(deadline); time.Sleep(time.Second) {
		if last = fn(); last == nil {
			return
		}
	}
	k.t.Fatalf("%s: not within 3 minutes: %v", what, last)
}

// clusterDeployment is a Deployment of VM pods, at 0 replicas.
const clusterDeployment = `apiVersion: apps/v1
kind: Deployment
metadata: {name: sandboxes}
spec:
  replicas: 0
  selector: {matchLabels: {app: sandboxes}}
  template:
    metadata: {labels: {app: sandboxes}}
    spec:
      runtimeClassName: cocoon
      terminationGracePeriodSeconds: 5
      containers:
      - name: sandbox
        image: ` + harness.ClusterWebImage + `
        imagePullPolicy: Never
`

const clusterPods = `apiVersion: v1
kind: ConfigMap
metadata: {name: app}
data: {greeting: hello}
---
apiVersion: v1
kind: Secret
metadata: {name: app}
stringData: {password: s3cret}
---
apiVersion: v1
kind: Pod
metadata: {name: vm}
spec:
  runtimeClassName: cocoon
  terminationGracePeriodSeconds: 5
  containers:
  - name: vm
    image: ` + harness.ClusterWebImage + `
    imagePullPolicy: Never
    env:
    - name: GREETING
      valueFrom: {configMapKeyRef: {name: app, key: greeting}}
    volumeMounts:
    - {name: config, mountPath: /etc/app}
    - {name: secret, mountPath: /etc/secret}
  volumes:
  - name: config
    configMap: {name: app}
  - name: secret
    secret: {secretName: app}
---
apiVersion: v1
kind: Pod
metadata: {name: crash}
spec:
  runtimeClassName: cocoon
  terminationGracePeriodSeconds: 5
  containers:
  - name: crash
    image: ` + harness.ClusterCrashImage + `
    imagePullPolicy: Never
---
apiVersion: v1
kind: Pod
metadata: {name: shell}
spec:
  runtimeClassName: cocoon
  restartPolicy: Never
  terminationGracePeriodSeconds: 5
  containers:
  - name: shell
    image: ` + harness.ClusterWebImage + `
    imagePullPolicy: Never
    command: [/bin/sh]
    stdin: true
    stdinOnce: true
---
apiVersion: v1
kind: Pod
metadata: {name: proxy}
spec:
  hostNetwork: true
  terminationGracePeriodSeconds: 2
  containers:
  - name: proxy
    image: ` + containerdtest.BusyboxImage + `
    imagePullPolicy: Never
    command: [sh, -c, "echo proxy up; exec sleep 3600"]
---
apiVersion: v1
kind: Pod
metadata: {name: agent}
spec:
  terminationGracePeriodSeconds: 2
  containers:
  - name: agent
    image: ` + containerdtest.BusyboxImage + `
    imagePullPolicy: Never
    command: [sh, -c, "echo agent up; exec sleep 3600"]
`

// TestCluster: hack/cluster.sh brings up a one-node Kubernetes, and kubectl on the host drives
// it as a user would. A VM pod selects cocoon-cri with runtimeClassName (no default handler),
// while a hostNetwork pod and an ordinary one run on containerd through passthrough; exec (with
// and without a terminal), logs (-f, and --previous after a guest crash), attach and
// port-forward reach the guest through the API server and the kubelet; env from a ConfigMap, a
// ConfigMap and a Secret volume and the service-account token reach the guest, and so does an
// edit of the ConfigMap; the node's summary shows
// the VM's CPU and memory, and the kubelet's pod cgroup holds the VM's hypervisor; a Deployment
// scaled from 0 to 5 takes its VMs from the node's warm pool; deleting the pods leaves no sandbox,
// VM (but the pool's), namespace, veth, address lease or pod cgroup; and down removes the whole
// cluster.
func TestCluster(t *testing.T) {
	t.Parallel()
	env, nodes := upCluster(t)
	nodeFiles := nodes[0]
	k := kubectlUser{t: t, env: append(os.Environ(), "KUBECONFIG="+env["KUBECONFIG"])}

	if handler := k.must("get", "runtimeclass", "cocoon", "-o", "jsonpath={.handler} {.overhead.podFixed.memory}"); handler != "cocoon 64Mi" {
		t.Fatalf("the cocoon RuntimeClass: %q, want deploy/runtimeclass.yaml's", handler)
	}
	if _, err := k.run(strings.NewReader(clusterPods), "apply", "-f", "-"); err != nil {
		t.Fatal(err)
	}
	k.must("wait", "--for=condition=Ready", "--timeout=180s", "pod/vm", "pod/proxy", "pod/agent")
	k.must("wait", "--for=jsonpath={.status.phase}=Running", "--timeout=180s", "pod/shell")

	// Each pod ran where its runtime class says: the VM pod in a cocoon VM, the others on
	// containerd (cocoon-cri's ListPodSandbox shows the handler of each).
	crictl := func(args ...string) string {
		t.Helper()
		return mustCrictlOn(t, env["CONTAINER_RUNTIME_ENDPOINT"], args...)
	}
	var sandboxes struct {
		Items []struct {
			Metadata       struct{ Name string } `json:"metadata"`
			RuntimeHandler string                `json:"runtimeHandler"`
		} `json:"items"`
	}
	if err := json.Unmarshal([]byte(crictl("pods", "-o", "json")), &sandboxes); err != nil {
		t.Fatal(err)
	}
	handlers := map[string]string{}
	for _, sb := range sandboxes.Items {
		handlers[sb.Metadata.Name] = sb.RuntimeHandler
	}
	if want := map[string]string{"vm": "cocoon", "crash": "cocoon", "shell": "cocoon", "proxy": "", "agent": ""}; !maps.Equal(handlers, want) {
		t.Errorf("the sandboxes' runtime handlers: %v, want %v", handlers, want)
	}
	if ip := k.must("get", "pod", "agent", "-o", "jsonpath={.status.podIP}"); !strings.HasPrefix(ip, "10.88.0.") {
		t.Errorf("the ordinary pod's IP %q is not on the node's pod network", ip)
	}

	// The pod spec reaches the guest: env from a ConfigMap, the ConfigMap and Secret volumes
	// (read-only) and the service-account token, which the API server accepts.
	const show = `echo "$GREETING"; cat /etc/app/greeting; echo; cat /etc/secret/password; echo; touch /etc/secret/x 2>/dev/null || echo read-only`
	if out := k.must("exec", "vm", "--", "sh", "-c", show); out != "hello\nhello\ns3cret\nread-only\n" {
		t.Errorf("env and volumes in the guest: %q, want the ConfigMap's greeting twice, the Secret's password and a read-only mount", out)
	}
	token := k.must("exec", "vm", "--", "cat", "/var/run/secrets/kubernetes.io/serviceaccount/token")
	if who, err := k.run(nil, "auth", "whoami", "--token", token, "-o", "jsonpath={.status.userInfo.username}"); err != nil || who != "system:serviceaccount:default:default" {
		t.Errorf("the guest's service-account token: %q, %v", who, err)
	}
	k.must("patch", "configmap", "app", "-p", `{"data": {"greeting": "edited"}}`)

	// exec, without and with a terminal (script gives kubectl one).
	if out := k.must("exec", "vm", "--", "hostname"); strings.TrimSpace(out) != "vm" {
		t.Errorf("kubectl exec vm -- hostname: %q", out)
	}
	for _, pod := range []string{"proxy", "agent"} {
		if out := k.must("exec", pod, "--", "echo", "exec in "+pod); strings.TrimSpace(out) != "exec in "+pod {
			t.Errorf("kubectl exec %s: %q", pod, out)
		}
	}
	tty := exec.Command("script", "-qec", bins.Kubectl+" exec -it vm -- sh -c 'test -t 0 && echo on a terminal: $((6*7))'", os.DevNull)
	tty.Env = k.env
	if out, err := tty.CombinedOutput(); err != nil || !strings.Contains(string(out), "on a terminal: 42") {
		t.Errorf("kubectl exec -it: %v: %q", err, out)
	}

	// The kubelet's checkpoint API (ContainerCheckpoint, on by default) checkpoints a VM pod's
	// container through cocoon-cri into one archive under the kubelet's checkpoints directory. The
	// kubelet reads a timeout parameter as seconds, and kubectl's --request-timeout sends a
	// duration ("90s") it cannot parse: none is sent, as by a kubectl without the flag.
	nodeName := k.must("get", "nodes", "-o", "jsonpath={.items[0].metadata.name}")
	var checkpointed struct{ Items []string }
	if err := json.Unmarshal([]byte(k.must("create", "--request-timeout=0", "--raw", "/api/v1/nodes/"+nodeName+"/proxy/checkpoint/default/shell/shell", "-f", os.DevNull)), &checkpointed); err != nil || len(checkpointed.Items) != 1 {
		t.Errorf("the kubelet's checkpoint answer: %v %v", checkpointed, err)
	} else if md := readCheckpointMetadata(t, checkpointed.Items[0]); md.Pod.Name != "shell" || md.Pod.Namespace != "default" || md.Container.Name != "shell" {
		t.Errorf("the kubelet's checkpoint %s holds %+v", checkpointed.Items[0], md)
	}
	if phase := k.must("get", "pod", "shell", "-o", "jsonpath={.status.phase}"); phase != "Running" {
		t.Errorf("the checkpointed pod is %s", phase)
	}

	// The kubelet rewrites the ConfigMap's volume on its next sync of the pod, cocoon-cri the
	// guest's copy within seconds of that.
	k.eventually("the edited ConfigMap in the guest", func() error {
		out, err := k.run(nil, "exec", "vm", "--", "cat", "/etc/app/greeting")
		if err == nil && out != "edited" {
			err = fmt.Errorf("the guest's /etc/app/greeting: %q", out)
		}
		return err
	})

	// logs: the guest's console, followed.
	proc, stdout := k.start("logs", "-f", "vm")
	banner := make(chan string, 1)
	go func() {
		scanner := bufio.NewScanner(stdout)
		for scanner.Scan() {
			if strings.Contains(scanner.Text(), "cocoon-sim guest") {
				banner <- scanner.Text()
				return
			}
		}
		close(banner)
	}()
	select {
	case _, ok := <-banner:
		if !ok {
			t.Error("kubectl logs -f vm ended without the guest's boot banner")
		}
		if proc.Exited(0) {
			t.Error("kubectl logs -f vm did not keep following")
		}
	case <-time.After(time.Minute):
		t.Error("kubectl logs -f vm: no boot banner within a minute")
	}
	proc.Kill()
	for _, pod := range []string{"proxy", "agent"} {
		if out := k.must("logs", pod); strings.TrimSpace(out) != pod+" up" {
			t.Errorf("kubectl logs %s: %q", pod, out)
		}
	}

	// logs --previous: the crashed guest's console, after the kubelet restarted the container.
	k.eventually("the crashing VM restarted", func() error {
		out, err := k.run(nil, "get", "pod", "crash", "-o", "jsonpath={.status.containerStatuses[0].restartCount} {.status.containerStatuses[0].lastState.terminated.reason}")
		if err == nil && !strings.HasSuffix(out, " VMCrashed") {
			err = fmt.Errorf("restart count and last reason: %q", out)
		}
		return err
	})
	// The guest crashes 10 s after each start, so by now the kubelet may have restarted it more
	// than once, and its garbage collection may take the exited container its status still names
	// ("unable to retrieve container logs"): asked again, it names the one it kept.
	k.eventually("kubectl logs --previous after the crash", func() error {
		out, err := k.run(nil, "logs", "crash", "--previous")
		if err == nil && !strings.Contains(out, "cocoon-sim guest") {
			err = fmt.Errorf("%q, want the crashed guest's console", out)
		}
		return err
	})

	// attach: the shell reads what kubectl sends, and ends with it (stdinOnce).
	if out, err := k.run(strings.NewReader("echo attached $((6*7))\n"), "attach", "-i", "shell"); err != nil || !strings.Contains(out, "attached 42") {
		t.Errorf("kubectl attach -i shell: %q, %v", out, err)
	}

	// port-forward: a port on the host's loopback reaches the guest's port 80.
	fwd, fwdOut := k.start("port-forward", "pod/vm", ":80")
	local := regexp.MustCompile(`Forwarding from 127\.0\.0\.1:(\d+) -> 80`)
	line, err := bufio.NewReader(fwdOut).ReadString('\n')
	m := local.FindStringSubmatch(line)
	if err != nil || m == nil {
		t.Fatalf("kubectl port-forward printed %q, %v", line, err)
	}
	resp, err := (&http.Client{Timeout: time.Minute}).Get("http://127.0.0.1:" + m[1] + "/")
	if err != nil {
		t.Fatalf("GET through kubectl port-forward: %v", err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		t.Errorf("GET through kubectl port-forward: %s", resp.Status)
	}
	fwd.Kill()

	// The node's summary, through the API server's node proxy: the VM's CPU and memory.
	k.eventually("the VM pod's CPU and memory in the node's summary", func() error {
		var summary struct {
			Pods []struct {
				PodRef struct{ Name string } `json:"podRef"`
				CPU    *struct {
					UsageCoreNanoSeconds uint64 `json:"usageCoreNanoSeconds"`
				} `json:"cpu"`
				Memory *struct {
					WorkingSetBytes uint64 `json:"workingSetBytes"`
				} `json:"memory"`
			} `json:"pods"`
		}
		out, err := k.run(nil, "get", "--raw", "/api/v1/nodes/"+harness.KubeletNodeName+"/proxy/stats/summary")
		if err != nil {
			return err
		}
		if err := json.Unmarshal([]byte(out), &summary); err != nil {
			return err
		}
		for _, p := range summary.Pods {
			if p.PodRef.Name != "vm" {
				continue
			}
			if p.CPU == nil || p.CPU.UsageCoreNanoSeconds == 0 || p.Memory == nil || p.Memory.WorkingSetBytes == 0 {
				return fmt.Errorf("the VM pod's stats: %s", out)
			}
			return nil
		}
		return fmt.Errorf("no VM pod in the summary: %s", out)
	})

	// The kubelet's own pod cgroup (cgroupsPerQOS, under the cluster's cgroup root) holds the VM's
	// hypervisor, and counts its memory.
	uid := k.must("get", "pod", "vm", "-o", "jsonpath={.metadata.uid}")
	podCgroup := nodeFiles["cgroup-root"] + "/kubepods/besteffort/pod" + uid
	var inspect struct {
		Info struct {
			VM struct{ PID int } `json:"vm"`
		} `json:"info"`
	}
	if err := json.Unmarshal([]byte(crictl("inspect", crictl("ps", "--name", "^vm$", "-q"))), &inspect); err != nil {
		t.Fatal(err)
	}
	if got := procCgroups(t, inspect.Info.VM.PID)["memory"]; !strings.HasPrefix(got, podCgroup) {
		t.Errorf("the VM's hypervisor (PID %d) is in memory cgroup %q, want the kubelet's pod cgroup %s", inspect.Info.VM.PID, got, podCgroup)
	}
	usage, err := os.ReadFile(filepath.Join("/sys/fs/cgroup/memory", podCgroup, "memory.usage_in_bytes"))
	if err != nil || strings.TrimSpace(string(usage)) == "0" {
		t.Errorf("the pod cgroup's memory usage: %q, %v", usage, err)
	}

	// A Deployment scaled from 0 to 5 takes its VMs from the warm pool, once it is full again.
	if _, err := k.run(strings.NewReader(clusterDeployment), "apply", "-f", "-"); err != nil {
		t.Fatal(err)
	}
	k.eventually("the warm pool full", func() error {
		var info struct {
			Info struct {
				WarmPools []struct{ Ready int } `json:"warmPools"`
			} `json:"info"`
		}
		if err := json.Unmarshal([]byte(crictl("info", "-o", "json")), &info); err != nil {
			return err
		}
		if len(info.Info.WarmPools) != 1 || info.Info.WarmPools[0].Ready != harness.ClusterPoolSize {
			return fmt.Errorf("warm pools %+v", info.Info.WarmPools)
		}
		return nil
	})
	k.must("scale", "deployment", "sandboxes", "--replicas", strconv.Itoa(harness.ClusterPoolSize))
	k.must("rollout", "status", "deployment/sandboxes", "--timeout=180s")
	sandboxCtrs := strings.Fields(crictl("ps", "--name", "^sandbox$", "-q"))
	if len(sandboxCtrs) != harness.ClusterPoolSize {
		t.Errorf("the Deployment's containers %q, want %d", sandboxCtrs, harness.ClusterPoolSize)
	}
	for _, id := range sandboxCtrs {
		var vm struct {
			Info struct {
				VM struct{ Name string } `json:"vm"`
			} `json:"info"`
		}
		if err := json.Unmarshal([]byte(crictl("inspect", id)), &vm); err != nil || !strings.HasPrefix(vm.Info.VM.Name, "cri-pool-") {
			t.Errorf("the Deployment's container %s runs VM %q (%v), not one from the warm pool", id, vm.Info.VM.Name, err)
		}
	}
	k.must("delete", "deployment", "sandboxes", "--wait", "--timeout=180s")

	// delete: nothing of the pods is left on the node but the warm pool's VMs.
	k.must("delete", "pod", "--all", "--wait", "--timeout=180s")
	k.eventually("nothing left of the pods", func() error {
		left := nodeLeftovers(nodeFiles, harness.ClusterPoolSize)
		if dirs := harness.CgroupDirs(podCgroup); len(dirs) > 0 {
			left = append(left, fmt.Sprintf("the pod's cgroups %v", dirs))
		}
		if len(left) > 0 {
			return fmt.Errorf("%s", strings.Join(left, "; "))
		}
		return nil
	})
}

// nodeLeftovers lists what a cluster node (as its file locations describe it) has left with no
// pod on it: sandboxes, VMs beyond a warm pool of pooled, pod namespaces, address leases and
// veths.
func nodeLeftovers(files map[string]string, pooled int) []string {
	var left []string
	if pods, err := crictlOn("unix://"+files["socket"], "pods", "-q").Output(); err != nil || len(bytes.TrimSpace(pods)) > 0 {
		left = append(left, fmt.Sprintf("sandboxes %q %v", pods, err))
	}
	vms, err := exec.Command(bins.CocoonSim, "--root-dir", files["cocoon-root"], "--run-dir", files["cocoon-run"],
		"--log-dir", files["cocoon-log"], "vm", "list", "-o", "json").Output()
	var listed []cocoon.VM
	if err == nil {
		listed, err = decodeCocoonList[cocoon.VM](vms)
	}
	inPool := 0
	for _, vm := range listed {
		if strings.HasPrefix(vm.Config.Name, "cri-pool-") {
			inPool++
		} else {
			left = append(left, "VM "+vm.Config.Name)
		}
	}
	if err != nil || inPool > pooled {
		left = append(left, fmt.Sprintf("VMs %s %v", vms, err))
	}
	entries, _ := os.ReadDir(files["netns"])
	for _, e := range entries {
		if !strings.HasPrefix(e.Name(), "cocoon-cri-pool") {
			left = append(left, "pod network namespace "+e.Name())
		}
	}
	if leases, _ := filepath.Glob(filepath.Join(files["ipam"], "pods", "10.*")); len(leases) > 0 {
		left = append(left, fmt.Sprintf("address leases %v", leases))
	}
	links, err := exec.Command("nsenter", "--net="+files["node-netns"], "--", "ip", "-o", "link", "show", "type", "veth").Output()
	if err != nil {
		left = append(left, fmt.Sprintf("the node's links: %v", err))
	}
	for _, line := range strings.Split(strings.TrimSpace(string(links)), "\n") {
		// The links to the host and to the fabric are the node's own.
		if fields := strings.Fields(line); len(fields) > 1 && !strings.HasPrefix(fields[1], harness.ClusterNodeLink+"@") && !strings.HasPrefix(fields[1], harness.FabricNodeLink+"@") {
			left = append(left, "veth "+fields[1])
		}
	}
	return left
}

// crictlOn is crictl for the runtime at endpoint, as a user on the node runs it.
func crictlOn(endpoint string, args ...string) *exec.Cmd {
	cmd := exec.Command(bins.Crictl, append([]string{"--runtime-endpoint", endpoint, "--timeout", "60s"}, args...)...)
	cmd.Env = append(os.Environ(), "CRI_CONFIG_FILE="+os.DevNull)
	return cmd
}

// mustCrictlOn runs crictlOn and returns its trimmed output.
func mustCrictlOn(t *testing.T, endpoint string, args ...string) string {
	t.Helper()
	out, err := crictlOn(endpoint, args...).Output()
	if err != nil {
		t.Fatalf("crictl %v: %v", args, err)
	}
	return strings.TrimSpace(string(out))
}
