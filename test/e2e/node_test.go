package e2e

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"strings"
	"testing"
	"time"

	containerdtest "github.com/cocoonstack/cocoon-cri/test/containerd"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"

	"github.com/cocoonstack/cocoon-cri/pkg/cocoon"
	"github.com/cocoonstack/cocoon-cri/test/harness"
)

// node is a node of the harness (cocoon-cri on the simulator, in its own namespace) owned by one
// test, with what the tests ask of it (crictl, the simulator's view, fixtures) as methods.
type node struct {
	*harness.Node
	t *testing.T
	// podCgroupParent, when set, is every pod's cgroup_parent, as a kubelet gives one.
	podCgroupParent string
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
	n.Start()
	return n
}

// prepareNode makes a node's directories, namespace and network configuration, without starting
// the daemon yet.
func prepareNode(t *testing.T, env []string, extra ...string) *node {
	t.Helper()
	return &node{Node: harness.PrepareNode(t, env, extra...), t: t}
}

// newPassthroughNode is a node with a real containerd beside cocoon-cri (harness.NewPassthroughNode).
func newPassthroughNode(t *testing.T, opts containerdtest.Options, extra ...string) (*node, *containerdtest.Daemon) {
	t.Helper()
	n, ctrd := harness.NewPassthroughNode(t, opts, extra...)
	return &node{Node: n, t: t}, ctrd
}

// crictl runs crictl against the node and returns its stdout; the error carries stderr.
func (n *node) crictl(args ...string) (string, error) {
	return n.crictlWithStdin(nil, args...)
}

// crictlWithStdin is crictl with its standard input read from stdin.
func (n *node) crictlWithStdin(stdin io.Reader, args ...string) (string, error) {
	return n.crictlTo("unix://"+n.Socket, stdin, args...)
}

// crictlTo runs crictl against another runtime of the node (its containerd).
func (n *node) crictlTo(endpoint string, stdin io.Reader, args ...string) (string, error) {
	// Generous per RPC: fifty pods start at once in one test, through the race-built daemon on two
	// cores, and the simulator's clones then take seconds each.
	full := append([]string{"--runtime-endpoint", endpoint, "--image-endpoint", endpoint, "--timeout", "3m"}, args...)
	ctx, cancel := context.WithTimeout(context.Background(), 7*time.Minute)
	defer cancel()
	// In the node's namespace: exec, attach and port-forward URLs point at its loopback.
	cmd := exec.CommandContext(ctx, "nsenter", append([]string{"--net=" + n.NodeNS, "--", bins.Crictl}, full...)...)
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
	return n.mustCrictlTo("unix://"+n.Socket, args...)
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
	full := append([]string{"--root-dir", n.RootDir, "--run-dir", n.RunDir, "--log-dir", n.LogDir}, args...)
	out, err := exec.Command(bins.CocoonSim, full...).Output()
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
	for _, dir := range []string{n.NetnsDir, n.VMNetns} {
		entries, _ := os.ReadDir(dir)
		for _, e := range entries {
			names = append(names, e.Name())
		}
	}
	return names
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
	conn, err := grpc.NewClient("unix://"+n.Socket, grpc.WithTransportCredentials(insecure.NewCredentials()),
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
