package e2e

import (
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	bolt "go.etcd.io/bbolt"
	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"

	"github.com/cocoonstack/cocoon-cri/pkg/store"
	"github.com/cocoonstack/cocoon-cri/tapmanager"
	"github.com/cocoonstack/cocoon-cri/test/testproc"
)

// TestDaemonSurvivesSIGKILL: after a kill -9 the next start replaces the stale socket and serves the
// same pods; the VMs kept running meanwhile.
func TestDaemonSurvivesSIGKILL(t *testing.T) {
	t.Parallel()
	n := newNode(t)
	n.withSnapshot()
	_, ctrID, _ := n.runningPod("web", snapRef)
	pid := n.vmPID(ctrID)

	n.Kill()
	if _, err := os.Lstat(n.Socket); err != nil {
		t.Fatalf("the killed daemon left no socket to replace: %v", err)
	}
	if !testproc.Running(pid) {
		t.Fatal("the VM died with cocoon-cri")
	}
	n.Start()
	if st := field(n.inspect("inspect", ctrID), "status", "state"); st != "CONTAINER_RUNNING" {
		t.Fatalf("after restart: %v", st)
	}
	info, err := os.Stat(n.Socket)
	if err != nil || info.Mode().Perm() != 0o660 {
		t.Fatalf("socket %v, %v", info, err)
	}
}

// TestSecondDaemonRefusesTheSameSocketAndState: a second cocoon-cri pointed at a live node fails
// with a clear message and does not disturb it.
func TestSecondDaemonRefusesTheSameSocketAndState(t *testing.T) {
	t.Parallel()
	n := newNode(t)
	for name, args := range map[string][]string{
		"socket": {"--socket", n.Socket, "--state-dir", n.Dir + "/other-state"},
		"state":  {"--socket", n.Dir + "/other.sock", "--state-dir", n.StateDir},
	} {
		out, err := exec.Command(bins.CocoonCRI, append(args, "--cocoon-binary", bins.CocoonSim)...).CombinedOutput()
		if err == nil {
			t.Fatalf("a second daemon on the same %s started", name)
		}
		if !strings.Contains(string(out), "another cocoon-cri") {
			t.Fatalf("second daemon on the same %s: %s", name, out)
		}
	}
	n.mustCrictl("version")
}

func TestVersionAndBadFlags(t *testing.T) {
	t.Parallel()
	out, err := exec.Command(bins.CocoonCRI, "--version").CombinedOutput()
	if err != nil || !strings.HasPrefix(string(out), "cocoon-cri ") {
		t.Fatalf("--version: %s, %v", out, err)
	}
	for _, args := range [][]string{{"--log-level", "loud"}, {"--log-format", "xml"}, {"--cocoon-timeout", "-1s"}, {"--max-cocoon-calls", "-1"}} {
		out, err := exec.Command(bins.CocoonCRI, args...).CombinedOutput()
		if err == nil || !strings.Contains(string(out), args[0]) {
			t.Errorf("%v: %s, %v", args, out, err)
		}
	}
	notADir := t.TempDir() + "/file"
	if err := os.WriteFile(notADir, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	out, err = exec.Command(bins.CocoonCRI, "--socket", notADir+"/cri.sock", "--state-dir", t.TempDir()).CombinedOutput()
	if err == nil || !strings.Contains(string(out), "socket dir") {
		t.Errorf("a socket under a regular file: %s, %v", out, err)
	}
}

// TestRuntimeReadyFollowsCocoon: RuntimeReady is false, with a reason, while the cocoon binary does
// not run.
func TestRuntimeReadyFollowsCocoon(t *testing.T) {
	t.Parallel()
	n := newNode(t, "--cocoon-binary", "/nonexistent/cocoon", "--serve-default-handler")
	ready, ok := n.conditions()["RuntimeReady"]
	if !ok || ready.Status || ready.Reason != "CocoonUnavailable" || !strings.Contains(ready.Message, "/nonexistent/cocoon") {
		t.Fatalf("RuntimeReady with no cocoon: %+v", ready)
	}
	var handlers []string
	for _, h := range n.info().RuntimeHandlers {
		handlers = append(handlers, h.Name)
	}
	if strings.Join(handlers, ",") != ",cocoon" {
		t.Fatalf("handlers %q, want the default and cocoon", handlers)
	}
}

// TestRecoveryRollsBackAnInterruptedRunPodSandbox: a sandbox left half-made by a crash (its record
// says creating, its namespace exists) is rolled back at the next start, so the kubelet's retry of
// the same pod succeeds.
func TestRecoveryRollsBackAnInterruptedRunPodSandbox(t *testing.T) {
	t.Parallel()
	n := newNode(t)
	pod := n.podConfig("web", "uid-web")
	n.Stop()
	id := n.plantHalfMadeSandbox(pod, nil)

	n.Start()
	if ns := n.netns(); len(ns) != 0 {
		t.Fatalf("the half-made sandbox's namespace survived: %v", ns)
	}
	if pods := n.mustCrictl("pods", "-q"); pods != "" {
		t.Fatalf("the half-made sandbox is listed: %q", pods)
	}
	podID := n.mustCrictl("runp", "--runtime", "cocoon", n.configFile("pod.json", pod))
	if podID == id {
		t.Fatal("the retry reused the half-made sandbox")
	}
}

// TestStartupServesDespiteAFailingRollback: a RunPodSandbox cut short whose CNI DEL keeps failing
// does not keep the daemon from serving; its record (and the pod's name) is kept and the roll-back
// retried in the background until DEL works.
func TestStartupServesDespiteAFailingRollback(t *testing.T) {
	t.Parallel()
	plugins := t.TempDir()
	n := newNode(t, "--cni-bin-dir", plugins)
	pod := n.podConfig("web", "uid-web")
	n.Stop()
	// Added to a network whose plugin the node does not have (yet): its DEL fails.
	n.plantHalfMadeSandbox(pod, &store.PodNetwork{ConfList: json.RawMessage(`{"cniVersion": "1.0.0", "name": "gone", "plugins": [{"type": "e2e-late-plugin"}]}`)})

	n.Start()
	if out := n.mustCrictl("version"); !strings.Contains(out, "cocoon-cri") {
		t.Fatalf("crictl version: %q", out)
	}
	n.crictlFails("AlreadyExists", "runp", "--runtime", "cocoon", n.configFile("pod.json", pod))
	if !strings.Contains(n.Log(), "retrying in the background") {
		t.Fatalf("the failed roll-back is not reported:\n%s", n.Log())
	}

	// The plugin appears; the next try deletes the network and the record.
	if err := os.WriteFile(filepath.Join(plugins, "e2e-late-plugin"), []byte("#!/bin/sh\nexit 0\n"), 0o755); err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(2 * time.Minute)
	for len(n.netns()) != 0 {
		if time.Now().After(deadline) {
			t.Fatalf("the roll-back was not retried: namespaces %v\n%s", n.netns(), n.Log())
		}
		time.Sleep(200 * time.Millisecond)
	}
	for {
		if _, err := n.crictl("runp", "--runtime", "cocoon", n.configFile("pod.json", pod)); err == nil {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the pod's name is still taken after the roll-back\n%s", n.Log())
		}
		time.Sleep(200 * time.Millisecond)
	}
}

// TestCorruptRecordIsQuarantinedAtStart: a state record that cannot be read does not keep the
// daemon from starting: it is moved aside and reported (log, crictl info), and the other pods are
// served as before.
func TestCorruptRecordIsQuarantinedAtStart(t *testing.T) {
	t.Parallel()
	n := newNode(t)
	good := n.mustCrictl("runp", "--runtime", "cocoon", n.configFile("good.json", n.podConfig("good", "uid-good")))
	bad := n.mustCrictl("runp", "--runtime", "cocoon", n.configFile("bad.json", n.podConfig("bad", "uid-bad")))
	n.Stop()
	db, err := bolt.Open(filepath.Join(n.StateDir, "cocoon-cri.db"), 0o600, nil)
	if err != nil {
		t.Fatal(err)
	}
	err = db.Update(func(tx *bolt.Tx) error { return tx.Bucket([]byte("sandboxes")).Put([]byte(bad), []byte("{not json")) })
	if cerr := db.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		t.Fatal(err)
	}

	n.Start()
	if pods := n.mustCrictl("pods", "-q"); pods != good {
		t.Fatalf("pods after the restart: %q, want only %s", pods, good)
	}
	if info := n.mustCrictl("info"); !strings.Contains(info, "quarantinedRecords") || !strings.Contains(info, bad) {
		t.Fatalf("crictl info does not report the quarantined record:\n%s", info)
	}
	if !strings.Contains(n.Log(), "quarantine") {
		t.Fatalf("the quarantined record is not logged:\n%s", n.Log())
	}
}

// plantHalfMadeSandbox leaves, on a stopped node, what a crash in the middle of RunPodSandbox
// leaves: a record that says creating (with the network it was being added to, if any) and its
// namespace. It returns the sandbox's ID.
func (n *node) plantHalfMadeSandbox(pod *runtimeapi.PodSandboxConfig, network *store.PodNetwork) string {
	n.t.Helper()
	st, err := store.Open(filepath.Join(n.StateDir, "cocoon-cri.db"))
	if err != nil {
		n.t.Fatal(err)
	}
	nets := &tapmanager.NetNS{Dir: n.NetnsDir}
	id := strings.Repeat("c", 64)
	half := &store.Sandbox{
		ID: id, State: store.SandboxCreating, RuntimeHandler: "cocoon", NetNS: nets.NetNSPath(id), Network: network,
		Name:   fmt.Sprintf("%s_%s_%s_%d", pod.Metadata.Name, pod.Metadata.Namespace, pod.Metadata.Uid, pod.Metadata.Attempt),
		Config: store.Proto[*runtimeapi.PodSandboxConfig]{Msg: pod},
	}
	if err := st.Sandboxes.Create(half); err != nil {
		n.t.Fatal(err)
	}
	st.Close()
	if err := nets.CreateNetNS(half.NetNS); err != nil {
		n.t.Fatal(err)
	}
	return id
}
