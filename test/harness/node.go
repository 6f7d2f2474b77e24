package harness

import (
	"bytes"
	"cmp"
	"context"
	"crypto/tls"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"time"

	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"

	"github.com/cocoonstack/cocoon-cri/tapmanager"
	"github.com/cocoonstack/cocoon-cri/test/cocoonsim"
	"github.com/cocoonstack/cocoon-cri/test/stale"
	"github.com/cocoonstack/cocoon-cri/test/testimage"
	"github.com/cocoonstack/cocoon-cri/test/testproc"
	"github.com/containernetworking/plugins/pkg/ns"
	"github.com/vishvananda/netlink"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
)

// Node is one cocoon-cri daemon on the simulator, with every directory it uses under dir.
type Node struct {
	T        testproc.TB
	Dir      string
	Socket   string
	StateDir string
	RootDir  string // cocoon --root-dir
	RunDir   string // cocoon --run-dir
	LogDir   string // cocoon --log-dir
	NetnsDir string // pod namespaces (cocoon-cri's)
	VMNetns  string // VM namespaces (the simulator's cocoon-<VMID>)
	NodeNS   string // the node's own namespace: the daemon, the CNI bridge and host ports live there
	CNIConf  string
	IPAMDir  string
	PodLogs  string
	Extra    []string
	Env      []string // more environment for the daemon
	Bin      string   // the daemon's executable; empty is Bins.CocoonCRI
	LogFile  string
	Daemon   *testproc.Process
}

// PrepareNode makes a node's directories, namespace and network configuration, without starting
// the daemon yet.
func PrepareNode(t testproc.TB, env []string, extra ...string) *Node {
	t.Helper()
	// Not t.TempDir: a unix socket path must stay under 108 bytes, and test names are long.
	dir, err := MkdirOwned("", "")
	if err != nil {
		t.Fatal(err)
	}
	n := &Node{
		T: t, Dir: dir, Extra: extra, Env: env,
		Socket:   filepath.Join(dir, "cri.sock"),
		StateDir: filepath.Join(dir, "state"),
		RootDir:  filepath.Join(dir, "cocoon", "root"),
		RunDir:   filepath.Join(dir, "cocoon", "run"),
		LogDir:   filepath.Join(dir, "cocoon", "log"),
		NetnsDir: filepath.Join(dir, "netns"),
		VMNetns:  filepath.Join(dir, "vmnetns"),
		NodeNS:   filepath.Join(dir, "node", "netns"),
		CNIConf:  filepath.Join(dir, "net.d"),
		IPAMDir:  filepath.Join(dir, "ipam"),
		PodLogs:  filepath.Join(dir, "pods"),
		LogFile:  filepath.Join(dir, "cocoon-cri.log"),
	}
	t.Cleanup(n.cleanup)
	n.makeNodeNamespace()
	n.WriteNetworkConfig(NodeSubnet, NodeGateway)
	return n
}

// NodeSubnet is the pod network of every test node; nodes do not share a namespace, so they may
// reuse it.
const (
	NodeSubnet  = "10.88.0.0/24"
	NodeGateway = "10.88.0.1"
)

// makeNodeNamespace gives the node a network namespace of its own, so nothing the tests do (the
// CNI bridge, veths, iptables rules for host ports) touches the host's network.
func (n *Node) makeNodeNamespace() {
	n.T.Helper()
	if err := (&tapmanager.NetNS{}).CreateNetNS(n.NodeNS); err != nil {
		n.T.Fatal(err)
	}
	n.InNode(func() error {
		lo, err := netlink.LinkByName("lo")
		if err != nil {
			return err
		}
		return netlink.LinkSetUp(lo)
	})
}

// WriteNetworkConfig installs the pod network: Debian's reference plugins, a bridge with
// host-local addresses of subnet (gateway, its first address, on the bridge) and host ports
// through portmap.
func (n *Node) WriteNetworkConfig(subnet, gateway string) {
	n.T.Helper()
	conf := fmt.Sprintf(`{"cniVersion": "1.0.0", "name": "pods", "plugins": [
  {"type": "bridge", "bridge": "cni0", "isGateway": true, "ipMasq": false,
   "ipam": {"type": "host-local", "ranges": [[{"subnet": %q, "gateway": %q}]], "routes": [{"dst": "0.0.0.0/0"}], "dataDir": %q}},
  {"type": "portmap", "capabilities": {"portMappings": true}}]}`, subnet, gateway, n.IPAMDir)
	if err := os.MkdirAll(n.CNIConf, 0o755); err != nil {
		n.T.Fatal(err)
	}
	n.WriteFile("net.d/10-pods.conflist", []byte(conf))
}

// InNode runs fn in the node's network namespace, as a process on the node would.
func (n *Node) InNode(fn func() error) {
	n.T.Helper()
	if err := ns.WithNetNSPath(n.NodeNS, func(ns.NetNS) error { return fn() }); err != nil {
		n.T.Fatal(err)
	}
}

// StartWithin is how long a daemon of the tests (cocoon-cri, a kubelet) may take to answer after
// its start. A quick machine takes seconds; a loaded CI machine once took more than a minute for
// cocoon-cri, whose start asks cocoon for its version and helps.
const StartWithin = 3 * time.Minute

// Start runs the daemon and waits until it answers.
func (n *Node) Start() {
	n.T.Helper()
	n.Launch()
	// Asked in-process: a crictl per poll cost more CPU than the daemon's whole start, on every
	// restart of the crash harness. A connection per poll: one that failed would wait out gRPC's
	// reconnect backoff (a second and more) before it tried again.
	if err := n.Daemon.WaitReady(StartWithin, 20*time.Millisecond, func() error {
		conn, err := grpc.NewClient("unix://"+n.Socket, grpc.WithTransportCredentials(insecure.NewCredentials()))
		if err != nil {
			return err
		}
		defer conn.Close()
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		_, err = runtimeapi.NewRuntimeServiceClient(conn).Version(ctx, &runtimeapi.VersionRequest{})
		return err
	}); err != nil {
		n.T.Fatalf("cocoon-cri: %v\n%s", err, n.Log())
	}
}

// Launch starts the daemon process without waiting for it.
func (n *Node) Launch() {
	n.T.Helper()
	args := []string{
		"--socket", n.Socket, "--state-dir", n.StateDir,
		"--cocoon-binary", Bins.CocoonSim,
		"--cocoon-root-dir", n.RootDir, "--cocoon-run-dir", n.RunDir, "--cocoon-log-dir", n.LogDir,
		"--netns-dir", n.NetnsDir, "--log-level", "debug",
		"--cni-conf-dir", n.CNIConf, "--cni-bin-dir", "/usr/lib/cni",
	}
	logFile, err := os.OpenFile(n.LogFile, os.O_CREATE|os.O_APPEND|os.O_WRONLY, 0o644)
	if err != nil {
		n.T.Fatal(err)
	}
	defer logFile.Close()
	// nsenter execs cocoon-cri in the node's namespace: the PID is the daemon's.
	nsenter := append([]string{"--net=" + n.NodeNS, "--", cmp.Or(n.Bin, Bins.CocoonCRI)}, append(args, n.Extra...)...)
	cmd := exec.Command("nsenter", nsenter...)
	cmd.Stdout, cmd.Stderr = logFile, logFile
	// A race fails the daemon at once (exit 66); without atexit_sleep_ms=0 the race runtime would
	// sleep a second at every exit, a second per restart of the daemon.
	cmd.Env = append(os.Environ(), "GORACE=halt_on_error=1 exitcode=66 atexit_sleep_ms=0", "COCOON_SIM_NETNS_DIR="+n.VMNetns)
	cmd.Env = append(cmd.Env, n.Env...)
	if n.Daemon, err = testproc.Start(cmd); err != nil {
		n.T.Fatal(err)
	}
}

// Stop sends SIGTERM and expects a clean exit.
func (n *Node) Stop() {
	n.T.Helper()
	if n.Daemon == nil {
		return
	}
	clean, err := n.Daemon.Stop(30 * time.Second)
	n.Daemon = nil
	if !clean {
		n.T.Fatalf("cocoon-cri ignored SIGTERM for 30s\n%s", n.Log())
	}
	if err != nil {
		n.T.Fatalf("cocoon-cri exited with %v after SIGTERM\n%s", err, n.Log())
	}
}

// Kill stops the daemon with SIGKILL, as a crash would.
func (n *Node) Kill() {
	if n.Daemon == nil {
		return
	}
	n.Daemon.Kill()
	n.Daemon = nil
}

// Died waits up to within for the daemon to exit and reports whether it did.
func (n *Node) Died(within time.Duration) bool {
	if n.Daemon == nil {
		return true
	}
	if !n.Daemon.Exited(within) {
		return false
	}
	n.Daemon = nil
	return true
}

func (n *Node) Restart() {
	n.T.Helper()
	n.Stop()
	n.Start()
}

// cleanup stops the daemon and whatever it left: guest processes, namespaces, files.
func (n *Node) cleanup() {
	if n.Daemon != nil {
		_, _ = n.Daemon.Stop(30 * time.Second)
		n.Daemon = nil
	}
	poolCgroups := n.poolCgroups()
	if err := cocoonsim.KillGuests(n.RunDir); err != nil {
		n.T.Errorf("stop guests: %v", err)
	}
	n.killCocoonProcesses()
	if err := removeCgroups(poolCgroups); err != nil {
		n.T.Errorf("%v", err)
	}
	for _, dir := range []string{n.NetnsDir, n.VMNetns, filepath.Dir(n.NodeNS)} {
		entries, _ := os.ReadDir(dir)
		for _, e := range entries {
			if err := (&tapmanager.NetNS{}).RemoveNetNS(filepath.Join(dir, e.Name())); err != nil {
				n.T.Errorf("remove netns: %v", err)
			}
		}
	}
	if log := n.Log(); strings.Contains(log, "DATA RACE") {
		n.T.Errorf("cocoon-cri reported a data race:\n%s", log)
	} else if n.T.Failed() {
		n.T.Logf("cocoon-cri log:\n%s", log)
	}
	// A share's binds are undone before the directory goes, or RemoveAll would descend into the
	// volumes bound there; cocoon-cri undoes them when a container ends, so a test that passed
	// leaves none.
	for _, pid := range n.Virtiofsds() {
		_ = syscall.Kill(pid, syscall.SIGKILL)
	}
	if mounts := MountsUnder(n.T, n.Dir); len(mounts) > 0 {
		n.T.Logf("undoing mounts left under the node: %v", mounts)
		if err := stale.Unmount(mounts); err != nil {
			n.T.Errorf("undo mounts left under the node: %v", err)
		}
	}
	if err := os.RemoveAll(n.Dir); err != nil {
		n.T.Errorf("remove node dir: %v", err)
	}
}

func (n *Node) Log() string {
	data, _ := os.ReadFile(n.LogFile)
	return string(data)
}

// WriteFile writes a file under the node's directory and returns its path.
func (n *Node) WriteFile(name string, data []byte) string {
	n.T.Helper()
	path := filepath.Join(n.Dir, name)
	if err := os.WriteFile(path, data, 0o644); err != nil {
		n.T.Fatal(err)
	}
	return path
}

// ImportImage runs cocoon-cri image import and returns the image ID.
func (n *Node) ImportImage(ref, file string) string {
	n.T.Helper()
	out, err := exec.Command(Bins.CocoonCRI, "image", "import", "--socket", n.Socket, "--ref", ref, file).CombinedOutput()
	if err != nil {
		n.T.Fatalf("image import %s: %v: %s", ref, err, out)
	}
	return strings.TrimSpace(string(out))
}

// HTTPGetInNode fetches url from the node's network namespace. The connection is dialled there
// explicitly: net/http dials on goroutines of its own, which run in whatever namespace their
// thread has.
func (n *Node) HTTPGetInNode(url string) (status int, body string, err error) {
	// Generous: sixteen of these run at once through the race-built daemon on two cores.
	client := &http.Client{Timeout: time.Minute, Transport: &http.Transport{
		DisableKeepAlives: true,
		TLSClientConfig:   &tls.Config{InsecureSkipVerify: true}, //nolint:gosec // the test kubelet's self-signed certificate
		DialContext: func(ctx context.Context, network, addr string) (conn net.Conn, err error) {
			nsErr := ns.WithNetNSPath(n.NodeNS, func(ns.NetNS) error {
				var d net.Dialer
				conn, err = d.DialContext(ctx, network, addr)
				return nil
			})
			if nsErr != nil {
				return nil, nsErr
			}
			return conn, err
		},
	}}
	resp, err := client.Get(url)
	if err != nil {
		return 0, "", err
	}
	defer resp.Body.Close()
	var buf strings.Builder
	_, err = io.Copy(&buf, resp.Body)
	return resp.StatusCode, buf.String(), err
}

// SnapshotImage writes a snapshot archive for this node (its base files installed, as a node that
// has the snapshot's base image would) and returns the file.
func (n *Node) SnapshotImage(name string, opts testimage.SnapshotOptions) string {
	n.T.Helper()
	opts.RootDir = n.RootDir
	if opts.Name == "" {
		opts.Name = name
	}
	if err := testimage.InstallBaseFiles(opts); err != nil {
		n.T.Fatal(err)
	}
	var buf bytes.Buffer
	if err := testimage.WriteSnapshotArchive(&buf, opts); err != nil {
		n.T.Fatal(err)
	}
	return n.WriteFile(name+".tar", buf.Bytes())
}
