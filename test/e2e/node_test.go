package e2e

import (
	"bytes"
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"

	"github.com/containernetworking/plugins/pkg/ns"
	"github.com/vishvananda/netlink"

	"github.com/cocoonstack/cocoon-cri/pkg/cocoon"
	"github.com/cocoonstack/cocoon-cri/tapmanager"
	"github.com/cocoonstack/cocoon-cri/test/cocoonsim"
	"github.com/cocoonstack/cocoon-cri/test/testproc"
)

// node is one cocoon-cri daemon on the simulator, with every directory it uses under dir.
type node struct {
	t        *testing.T
	dir      string
	socket   string
	stateDir string
	rootDir  string // cocoon --root-dir
	runDir   string // cocoon --run-dir
	logDir   string // cocoon --log-dir
	netnsDir string // pod namespaces (cocoon-cri's)
	vmNetns  string // VM namespaces (the simulator's cocoon-<VMID>)
	nodeNS   string // the node's own namespace: the daemon, the CNI bridge and host ports live there
	cniConf  string
	ipamDir  string
	podLogs  string
	extra    []string
	env      []string // more environment for the daemon
	bin      string   // the daemon's executable; empty is bins.cocoonCRI
	logFile  string
	daemon   *testproc.Process
}

// newNode starts a daemon; extra are more cocoon-cri flags. Everything is stopped and removed when
// the test ends.
func newNode(t *testing.T, extra ...string) *node {
	t.Helper()
	return newNodeWithEnv(t, nil, extra...)
}

// newNodeWithEnv is newNode with more environment for the daemon (and the cocoon it runs).
func newNodeWithEnv(t *testing.T, env []string, extra ...string) *node {
	t.Helper()
	n := prepareNode(t, env, extra...)
	n.start()
	return n
}

// prepareNode makes a node's directories, namespace and network configuration, without starting
// the daemon yet.
func prepareNode(t *testing.T, env []string, extra ...string) *node {
	t.Helper()
	// Not t.TempDir: a unix socket path must stay under 108 bytes, and test names are long.
	dir, err := os.MkdirTemp("", "ccri")
	if err != nil {
		t.Fatal(err)
	}
	n := &node{
		t: t, dir: dir, extra: extra, env: env,
		socket:   filepath.Join(dir, "cri.sock"),
		stateDir: filepath.Join(dir, "state"),
		rootDir:  filepath.Join(dir, "cocoon", "root"),
		runDir:   filepath.Join(dir, "cocoon", "run"),
		logDir:   filepath.Join(dir, "cocoon", "log"),
		netnsDir: filepath.Join(dir, "netns"),
		vmNetns:  filepath.Join(dir, "vmnetns"),
		nodeNS:   filepath.Join(dir, "node", "netns"),
		cniConf:  filepath.Join(dir, "net.d"),
		ipamDir:  filepath.Join(dir, "ipam"),
		podLogs:  filepath.Join(dir, "pods"),
		logFile:  filepath.Join(dir, "cocoon-cri.log"),
	}
	t.Cleanup(n.cleanup)
	n.makeNodeNamespace()
	n.writeNetworkConfig(nodeSubnet, nodeGateway)
	return n
}

// nodeSubnet is the pod network of every test node; nodes do not share a namespace, so they may
// reuse it.
const (
	nodeSubnet  = "10.88.0.0/24"
	nodeGateway = "10.88.0.1"
)

// makeNodeNamespace gives the node a network namespace of its own, so nothing the tests do (the
// CNI bridge, veths, iptables rules for host ports) touches the host's network.
func (n *node) makeNodeNamespace() {
	n.t.Helper()
	if err := (&tapmanager.NetNS{}).CreateNetNS(n.nodeNS); err != nil {
		n.t.Fatal(err)
	}
	n.inNode(func() error {
		lo, err := netlink.LinkByName("lo")
		if err != nil {
			return err
		}
		return netlink.LinkSetUp(lo)
	})
}

// writeNetworkConfig installs the pod network: Debian's reference plugins, a bridge with
// host-local addresses of subnet (gateway, its first address, on the bridge) and host ports
// through portmap.
func (n *node) writeNetworkConfig(subnet, gateway string) {
	n.t.Helper()
	conf := fmt.Sprintf(`{"cniVersion": "1.0.0", "name": "pods", "plugins": [
  {"type": "bridge", "bridge": "cni0", "isGateway": true, "ipMasq": false,
   "ipam": {"type": "host-local", "ranges": [[{"subnet": %q, "gateway": %q}]], "routes": [{"dst": "0.0.0.0/0"}], "dataDir": %q}},
  {"type": "portmap", "capabilities": {"portMappings": true}}]}`, subnet, gateway, n.ipamDir)
	if err := os.MkdirAll(n.cniConf, 0o755); err != nil {
		n.t.Fatal(err)
	}
	n.writeFile("net.d/10-pods.conflist", []byte(conf))
}

// inNode runs fn in the node's network namespace, as a process on the node would.
func (n *node) inNode(fn func() error) {
	n.t.Helper()
	if err := ns.WithNetNSPath(n.nodeNS, func(ns.NetNS) error { return fn() }); err != nil {
		n.t.Fatal(err)
	}
}

// start runs the daemon and waits until it answers.
func (n *node) start() {
	n.t.Helper()
	n.launch()
	// Asked in-process: a crictl per poll cost more CPU than the daemon's whole start, on every
	// restart of the crash harness. A connection per poll: one that failed would wait out gRPC's
	// reconnect backoff (a second and more) before it tried again.
	if err := n.daemon.WaitReady(time.Minute, 20*time.Millisecond, func() error {
		conn, err := grpc.NewClient("unix://"+n.socket, grpc.WithTransportCredentials(insecure.NewCredentials()))
		if err != nil {
			return err
		}
		defer conn.Close()
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		_, err = runtimeapi.NewRuntimeServiceClient(conn).Version(ctx, &runtimeapi.VersionRequest{})
		return err
	}); err != nil {
		n.t.Fatalf("cocoon-cri: %v\n%s", err, n.log())
	}
}

// launch starts the daemon process without waiting for it.
func (n *node) launch() {
	n.t.Helper()
	args := []string{
		"--socket", n.socket, "--state-dir", n.stateDir,
		"--cocoon-binary", bins.cocoonSim,
		"--cocoon-root-dir", n.rootDir, "--cocoon-run-dir", n.runDir, "--cocoon-log-dir", n.logDir,
		"--netns-dir", n.netnsDir, "--log-level", "debug",
		"--cni-conf-dir", n.cniConf, "--cni-bin-dir", "/usr/lib/cni",
	}
	logFile, err := os.OpenFile(n.logFile, os.O_CREATE|os.O_APPEND|os.O_WRONLY, 0o644)
	if err != nil {
		n.t.Fatal(err)
	}
	defer logFile.Close()
	// nsenter execs cocoon-cri in the node's namespace: the PID is the daemon's.
	nsenter := append([]string{"--net=" + n.nodeNS, "--", cmp.Or(n.bin, bins.cocoonCRI)}, append(args, n.extra...)...)
	cmd := exec.Command("nsenter", nsenter...)
	cmd.Stdout, cmd.Stderr = logFile, logFile
	// A race fails the daemon at once (exit 66); without atexit_sleep_ms=0 the race runtime would
	// sleep a second at every exit, a second per restart of the daemon.
	cmd.Env = append(os.Environ(), "GORACE=halt_on_error=1 exitcode=66 atexit_sleep_ms=0", "COCOON_SIM_NETNS_DIR="+n.vmNetns)
	cmd.Env = append(cmd.Env, n.env...)
	if n.daemon, err = testproc.Start(cmd); err != nil {
		n.t.Fatal(err)
	}
}

// stop sends SIGTERM and expects a clean exit.
func (n *node) stop() {
	n.t.Helper()
	if n.daemon == nil {
		return
	}
	clean, err := n.daemon.Stop(30 * time.Second)
	n.daemon = nil
	if !clean {
		n.t.Fatalf("cocoon-cri ignored SIGTERM for 30s\n%s", n.log())
	}
	if err != nil {
		n.t.Fatalf("cocoon-cri exited with %v after SIGTERM\n%s", err, n.log())
	}
}

// kill stops the daemon with SIGKILL, as a crash would.
func (n *node) kill() {
	if n.daemon == nil {
		return
	}
	n.daemon.Kill()
	n.daemon = nil
}

// died waits up to within for the daemon to exit and reports whether it did.
func (n *node) died(within time.Duration) bool {
	if n.daemon == nil {
		return true
	}
	if !n.daemon.Exited(within) {
		return false
	}
	n.daemon = nil
	return true
}

func (n *node) restart() {
	n.t.Helper()
	n.stop()
	n.start()
}

// cleanup stops the daemon and whatever it left: guest processes, namespaces, files.
func (n *node) cleanup() {
	if n.daemon != nil {
		_, _ = n.daemon.Stop(30 * time.Second)
		n.daemon = nil
	}
	if err := cocoonsim.KillGuests(n.runDir); err != nil {
		n.t.Errorf("stop guests: %v", err)
	}
	for _, dir := range []string{n.netnsDir, n.vmNetns, filepath.Dir(n.nodeNS)} {
		entries, _ := os.ReadDir(dir)
		for _, e := range entries {
			if err := (&tapmanager.NetNS{}).RemoveNetNS(filepath.Join(dir, e.Name())); err != nil {
				n.t.Errorf("remove netns: %v", err)
			}
		}
	}
	if log := n.log(); strings.Contains(log, "DATA RACE") {
		n.t.Errorf("cocoon-cri reported a data race:\n%s", log)
	} else if n.t.Failed() {
		n.t.Logf("cocoon-cri log:\n%s", log)
	}
	// A share's binds are undone before the directory goes, or RemoveAll would descend into the
	// volumes bound there; cocoon-cri undoes them when a container ends, so a test that passed
	// leaves none.
	for _, pid := range n.virtiofsds() {
		_ = syscall.Kill(pid, syscall.SIGKILL)
	}
	if mounts := mountsUnder(n.t, n.dir); len(mounts) > 0 {
		n.t.Logf("undoing mounts left under the node: %v", mounts)
		for _, m := range slices.Backward(mounts) {
			_ = unix.Unmount(m, unix.MNT_DETACH)
		}
	}
	if err := os.RemoveAll(n.dir); err != nil {
		n.t.Errorf("remove node dir: %v", err)
	}
}

func (n *node) log() string {
	data, _ := os.ReadFile(n.logFile)
	return string(data)
}

// crictl runs crictl against the node and returns its stdout; the error carries stderr.
func (n *node) crictl(args ...string) (string, error) {
	return n.crictlWithStdin(nil, args...)
}

// crictlWithStdin is crictl with its standard input read from stdin.
func (n *node) crictlWithStdin(stdin io.Reader, args ...string) (string, error) {
	return n.crictlTo("unix://"+n.socket, stdin, args...)
}

// crictlTo runs crictl against another runtime of the node (its containerd).
func (n *node) crictlTo(endpoint string, stdin io.Reader, args ...string) (string, error) {
	// Generous per RPC: fifty pods start at once in one test, through the race-built daemon on two
	// cores, and the simulator's clones then take seconds each.
	full := append([]string{"--runtime-endpoint", endpoint, "--image-endpoint", endpoint, "--timeout", "3m"}, args...)
	ctx, cancel := context.WithTimeout(context.Background(), 7*time.Minute)
	defer cancel()
	// In the node's namespace: exec, attach and port-forward URLs point at its loopback.
	cmd := exec.CommandContext(ctx, "nsenter", append([]string{"--net=" + n.nodeNS, "--", bins.crictl}, full...)...)
	// crictl warns on stderr about a missing /etc/crictl.yaml; point it at an empty one.
	cmd.Env = append(os.Environ(), "CRI_CONFIG_FILE="+os.DevNull)
	cmd.Stdin = stdin
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	if err := cmd.Run(); err != nil {
		return stdout.String(), fmt.Errorf("crictl %s: %v: %s", strings.Join(args, " "), err, strings.TrimSpace(stderr.String()))
	}
	return strings.TrimSpace(stdout.String()), nil
}

func (n *node) mustCrictl(args ...string) string {
	n.t.Helper()
	return n.mustCrictlTo("unix://"+n.socket, args...)
}

func (n *node) mustCrictlTo(endpoint string, args ...string) string {
	n.t.Helper()
	out, err := n.crictlTo(endpoint, nil, args...)
	if err != nil {
		n.t.Fatal(err)
	}
	return out
}

// crictlFails runs crictl expecting a gRPC error with the given code.
func (n *node) crictlFails(code string, args ...string) string {
	n.t.Helper()
	_, err := n.crictl(args...)
	if err == nil {
		n.t.Fatalf("crictl %s succeeded, want %s", strings.Join(args, " "), code)
	}
	if !strings.Contains(err.Error(), "code = "+code) {
		n.t.Fatalf("crictl %s: want code %s, got: %v", strings.Join(args, " "), code, err)
	}
	return err.Error()
}

// inspect runs a crictl inspect command and decodes its JSON.
func (n *node) inspect(args ...string) map[string]any {
	n.t.Helper()
	var out map[string]any
	full := append([]string{args[0], "-o", "json"}, args[1:]...)
	if err := json.Unmarshal([]byte(n.mustCrictl(full...)), &out); err != nil {
		n.t.Fatal(err)
	}
	return out
}

// cocoon runs the simulator with the node's cocoon directories.
func (n *node) cocoon(args ...string) (string, error) {
	full := append([]string{"--root-dir", n.rootDir, "--run-dir", n.runDir, "--log-dir", n.logDir}, args...)
	out, err := exec.Command(bins.cocoonSim, full...).Output()
	var exit *exec.ExitError
	if errors.As(err, &exit) {
		err = fmt.Errorf("cocoon %s: %v: %s", strings.Join(args, " "), err, cocoon.StripANSI(string(exit.Stderr)))
	}
	return string(out), err
}

// cocoonList runs a simulator list command ("vm", "snapshot", "image") and decodes it.
func cocoonList[T any](n *node, what string) []T {
	n.t.Helper()
	out, err := n.cocoon(what, "list", "-o", "json")
	if err != nil {
		n.t.Fatal(err)
	}
	items, err := decodeCocoonList[T]([]byte(out))
	if err != nil {
		n.t.Fatal(err)
	}
	return items
}

// decodeCocoonList reads a cocoon "list -o json": cocoon says "No … found." instead of an empty
// list.
func decodeCocoonList[T any](out []byte) ([]T, error) {
	if bytes.HasPrefix(bytes.TrimSpace(out), []byte("No ")) {
		return nil, nil
	}
	var items []T
	err := json.Unmarshal(out, &items)
	return items, err
}

// vms lists the simulator's VMs.
func (n *node) vms() []cocoon.VM { return cocoonList[cocoon.VM](n, "vm") }

// vm inspects one VM in the simulator.
func (n *node) vm(ref string) (*cocoon.VM, error) {
	out, err := n.cocoon("vm", "inspect", ref)
	if err != nil {
		return nil, err
	}
	var vm cocoon.VM
	if err := json.Unmarshal([]byte(out), &vm); err != nil {
		return nil, err
	}
	return &vm, nil
}

// netns lists the network namespaces on the node: the pods' and the VMs'.
func (n *node) netns() []string {
	var names []string
	for _, dir := range []string{n.netnsDir, n.vmNetns} {
		entries, _ := os.ReadDir(dir)
		for _, e := range entries {
			names = append(names, e.Name())
		}
	}
	return names
}

// writeFile writes a file under the node's directory and returns its path.
func (n *node) writeFile(name string, data []byte) string {
	n.t.Helper()
	path := filepath.Join(n.dir, name)
	if err := os.WriteFile(path, data, 0o644); err != nil {
		n.t.Fatal(err)
	}
	return path
}

// importImage runs cocoon-cri image import and returns the image ID.
func (n *node) importImage(ref, file string) string {
	n.t.Helper()
	out, err := exec.Command(bins.cocoonCRI, "image", "import", "--socket", n.socket, "--ref", ref, file).CombinedOutput()
	if err != nil {
		n.t.Fatalf("image import %s: %v: %s", ref, err, out)
	}
	return strings.TrimSpace(string(out))
}

// kubeletMaxMessage is the largest gRPC message the kubelet's CRI client sends or receives.
const kubeletMaxMessage = 16 << 20

// clients connects to the node's CRI services directly, for requests crictl cannot make, with the
// kubelet's message size limits.
func (n *node) clients() (runtimeapi.RuntimeServiceClient, runtimeapi.ImageServiceClient) {
	n.t.Helper()
	conn := n.conn()
	return runtimeapi.NewRuntimeServiceClient(conn), runtimeapi.NewImageServiceClient(conn)
}

// conn is a gRPC connection to the daemon's socket, as the kubelet opens one, closed at the
// test's end.
func (n *node) conn() *grpc.ClientConn {
	n.t.Helper()
	conn, err := grpc.NewClient("unix://"+n.socket, grpc.WithTransportCredentials(insecure.NewCredentials()),
		grpc.WithDefaultCallOptions(grpc.MaxCallRecvMsgSize(kubeletMaxMessage), grpc.MaxCallSendMsgSize(kubeletMaxMessage)))
	if err != nil {
		n.t.Fatal(err)
	}
	n.t.Cleanup(func() { conn.Close() })
	return conn
}

// execOutput runs a command and returns its stdout; the error carries stderr.
func execOutput(name string, args ...string) ([]byte, error) {
	out, err := exec.Command(name, args...).Output()
	var exit *exec.ExitError
	if errors.As(err, &exit) {
		err = fmt.Errorf("%s %s: %v: %s", name, strings.Join(args, " "), err, exit.Stderr)
	}
	return out, err
}
