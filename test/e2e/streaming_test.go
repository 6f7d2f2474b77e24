package e2e

import (
	"context"
	"crypto/ed25519"
	"encoding/pem"
	"errors"
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"golang.org/x/crypto/ssh"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"
	utilexec "k8s.io/utils/exec"

	"github.com/cocoonstack/cocoon-cri/pkg/syncio"
	"github.com/cocoonstack/cocoon-cri/test/cocoonsim"
	"github.com/cocoonstack/cocoon-cri/test/cocoonsim/guest"
	"github.com/cocoonstack/cocoon-cri/test/testimage"
	"github.com/cocoonstack/cocoon-cri/test/testproc"
)

// TestExecThroughCrictl: commands run in the guest (its hostname is the pod's), with their output,
// stdin and exit code.
func TestExecThroughCrictl(t *testing.T) {
	t.Parallel()
	n := newNode(t)
	n.withSnapshot()
	_, ctrID, _ := n.runningPod("web", snapRef)

	// The guest is set up for the pod in the background after the start; a command waits for
	// that, so even the first one sees the pod's hostname.
	if out := n.mustCrictl("exec", ctrID, "sh", "-c", "echo out; hostname"); out != "out\nweb" {
		t.Fatalf("exec output %q", out)
	}
	if got, err := n.crictlWithStdin(strings.NewReader("typed into the guest"), "exec", "-i", ctrID, "cat"); err != nil || got != "typed into the guest" {
		t.Fatalf("exec -i cat: %q, %v", got, err)
	}
	if _, err := n.crictl("exec", ctrID, "sh", "-c", "exit 3"); err == nil || !strings.Contains(err.Error(), "exit code 3") {
		t.Fatalf("a failing command: %v", err)
	}
}

// TestExecWithATerminal: a TTY exec gets a terminal in the guest, and ends when its command does
// even though the client's stdin stays open.
func TestExecWithATerminal(t *testing.T) {
	t.Parallel()
	n := newNode(t)
	n.withSnapshot()
	_, ctrID, _ := n.runningPod("web", snapRef)
	ctx, cancel := within()
	defer cancel()
	url := n.execURL(&runtimeapi.ExecRequest{ContainerId: ctrID, Cmd: []string{"sh"}, Tty: true, Stdin: true, Stdout: true})
	res := n.stream(ctx, url, &slowReader{ctx: ctx, data: []byte("tty; echo from-the-guest; exit\n")}, streamOpts{tty: true})
	if res.err != nil {
		t.Fatalf("tty exec: %v (output %q)", res.err, res.stdout)
	}
	if !strings.Contains(res.stdout, "/dev/pts/") || !strings.Contains(res.stdout, "from-the-guest") {
		t.Fatalf("tty exec output %q", res.stdout)
	}
	if ctx.Err() != nil {
		t.Fatal("the stream outlived its command")
	}
}

// TestStreamsOverWebSocket: exec and attach over WebSocket, as a legacy WebSocket client or a
// kubelet proxying one reaches the stream server. The v4 channel protocol cannot close stdin, so
// the command reads one line rather than to the end.
func TestStreamsOverWebSocket(t *testing.T) {
	t.Parallel()
	n := newNode(t)
	n.withSnapshot()
	_, ctrID, _ := n.runningPod("web", snapRef)
	ctx, cancel := within()
	defer cancel()
	url := n.execURL(&runtimeapi.ExecRequest{ContainerId: ctrID, Cmd: []string{"sh", "-c", "read -r line; echo \"$line\"; echo err >&2; exit 3"}, Stdin: true, Stdout: true, Stderr: true})
	res := n.stream(ctx, url, strings.NewReader("over a websocket\n"), streamOpts{stderr: true, websocket: true})
	var exit utilexec.ExitError
	if !errors.As(res.err, &exit) || exit.ExitStatus() != 3 || res.stdout != "over a websocket\n" || res.stderr != "err\n" {
		t.Fatalf("exec over WebSocket: %+v", res)
	}

	vmName, _ := field(n.inspect("inspect", ctrID), "info", "vm", "name").(string)
	n.waitLog(ctrID, "cocoon-sim guest "+vmName+" ready")
	attachCtx, stop := context.WithTimeout(context.Background(), 30*time.Second)
	defer stop()
	url = n.attachURL(&runtimeapi.AttachRequest{ContainerId: ctrID, Stdin: true, Stdout: true})
	done := make(chan streamResult, 1)
	go func() {
		done <- n.stream(attachCtx, url, &slowReader{ctx: attachCtx, data: []byte("typed-over-a-websocket\n")}, streamOpts{websocket: true})
	}()
	n.waitLog(ctrID, "you typed: typed-over-a-websocket", done)
	stop()
	if r := <-done; !strings.Contains(r.stdout, "you typed: typed-over-a-websocket") {
		t.Fatalf("attach over WebSocket saw %q", r.stdout)
	}
}

// TestExecSyncAPI: output, exit code, and a timeout that kills the command.
func TestExecSyncAPI(t *testing.T) {
	t.Parallel()
	n := newNode(t)
	n.withSnapshot()
	_, ctrID, _ := n.runningPod("web", snapRef)
	rt, _ := n.clients()
	ctx := context.Background()
	resp, err := rt.ExecSync(ctx, &runtimeapi.ExecSyncRequest{ContainerId: ctrID, Cmd: []string{"sh", "-c", "echo out; echo err >&2; exit 3"}, Timeout: 30})
	if err != nil || string(resp.GetStdout()) != "out\n" || string(resp.GetStderr()) != "err\n" || resp.GetExitCode() != 3 {
		t.Fatalf("ExecSync: %+v, %v", resp, err)
	}
	start := time.Now()
	_, err = rt.ExecSync(ctx, &runtimeapi.ExecSyncRequest{ContainerId: ctrID, Cmd: []string{"sleep", "1234"}, Timeout: 1})
	if status.Code(err) != codes.DeadlineExceeded || strings.Contains(err.Error(), "1234") {
		t.Fatalf("ExecSync past its timeout: %v after %s (want DeadlineExceeded, without the command)", err, time.Since(start))
	}
	// The timed-out command goes from the guest: the kill travels through cocoon's exec session to
	// the guest's agent, so the next exec may still see it for a moment.
	deadline := time.Now().Add(30 * time.Second)
	for {
		resp, err = rt.ExecSync(ctx, &runtimeapi.ExecSyncRequest{ContainerId: ctrID, Cmd: []string{"sh", "-c", "pgrep -f 'slee[p] 1234' || true"}, Timeout: 30})
		if err == nil && strings.TrimSpace(string(resp.GetStdout())) == "" {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the timed-out command still runs 30 s later: %q, %v", resp.GetStdout(), err)
		}
		time.Sleep(200 * time.Millisecond)
	}
	// A command that floods both streams: each is cut, and the answer still fits the kubelet's
	// messages.
	resp, err = rt.ExecSync(ctx, &runtimeapi.ExecSyncRequest{ContainerId: ctrID, Cmd: []string{"sh", "-c", "head -c 41943040 /dev/zero; head -c 41943040 /dev/zero >&2"}, Timeout: 60})
	if err != nil || len(resp.GetStdout()) != 7<<20 || len(resp.GetStderr()) != 7<<20 || resp.GetExitCode() != 0 {
		t.Fatalf("ExecSync of 40 MiB per stream: %d and %d bytes, exit %d, %v; want 7 MiB of each", len(resp.GetStdout()), len(resp.GetStderr()), resp.GetExitCode(), err)
	}
	if _, err := rt.ExecSync(ctx, &runtimeapi.ExecSyncRequest{ContainerId: ctrID}); status.Code(err) != codes.InvalidArgument {
		t.Fatalf("ExecSync without a command: %v", err)
	}
}

var timestamped = regexp.MustCompile(`^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d+Z `)

// TestConsoleIsTheLogAndAttachReachesIt: a container whose VM's init is the workload logs its
// console; attach sees the console and types into it; crictl logs' options work. On both cocoon
// releases, whose VMs' console is found through the hypervisor's API.
func TestConsoleIsTheLogAndAttachReachesIt(t *testing.T) {
	t.Parallel()
	for _, version := range []string{"0.3.8", "0.5.1"} {
		t.Run(version, func(t *testing.T) {
			checkConsole(t, newNodeWithEnv(t, []string{cocoonsim.VersionEnv + "=" + version}))
		})
	}
}

func checkConsole(t *testing.T, n *node) {
	n.withSnapshot()
	_, ctrID, _ := n.runningPod("web", snapRef)
	vmName, _ := field(n.inspect("inspect", ctrID), "info", "vm", "name").(string)
	ready := "cocoon-sim guest " + vmName + " ready"
	n.waitLog(ctrID, ready)

	if tail := n.mustCrictl("logs", "--tail", "1", ctrID); tail != ready {
		t.Fatalf("logs --tail 1: %q", tail)
	}
	if stamped := n.mustCrictl("logs", "--tail", "1", "--timestamps", ctrID); !timestamped.MatchString(stamped) || !strings.HasSuffix(stamped, ready) {
		t.Fatalf("logs --timestamps: %q", stamped)
	}
	if future := n.mustCrictl("logs", "--since", time.Now().Add(time.Hour).Format(time.RFC3339), ctrID); future != "" {
		t.Fatalf("logs --since an hour ahead: %q", future)
	}
	// The guest echoes what is typed, and answers the line: both reach the log and the client.
	n.typeAtConsole(ctrID, "typed-at-the-console")
}

// typeAtConsole types line at the container's console through attach and waits for the guest's
// answer in the log and the session.
func (n *node) typeAtConsole(ctrID, line string) {
	n.t.Helper()
	ctx, cancel := within()
	defer cancel()
	url := n.attachURL(&runtimeapi.AttachRequest{ContainerId: ctrID, Stdin: true, Stdout: true})
	res := make(chan streamResult, 1)
	go func() {
		res <- n.stream(ctx, url, &slowReader{ctx: ctx, data: []byte(line + "\n")}, streamOpts{})
	}()
	n.waitLog(ctrID, "you typed: "+line, res)
	cancel()
	if r := <-res; !strings.Contains(r.stdout, "you typed: "+line) {
		n.t.Fatalf("attach saw %q", r.stdout)
	}
}

// waitLog waits for the container's log to show want. A stream given as ended fails the wait at
// once: what it printed says why.
func (n *node) waitLog(ctrID, want string, ended ...<-chan streamResult) {
	n.t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for !strings.Contains(n.mustCrictl("logs", ctrID), want) {
		if time.Now().After(deadline) {
			n.t.Fatalf("the log never showed %q:\n%s", want, n.mustCrictl("logs", ctrID))
		}
		for _, ch := range ended {
			select {
			case r := <-ch:
				n.t.Fatalf("the stream ended before the log showed %q: %v (stdout %q, stderr %q)", want, r.err, r.stdout, r.stderr)
			default:
			}
		}
		time.Sleep(200 * time.Millisecond)
	}
}

// TestCommandIsTheMainProcess: a container's command runs in the guest as its main process: its
// output is the log (stdout and stderr apart), crictl logs -f follows it to the end, its exit code
// is the container's, and its end powers the VM off.
func TestCommandIsTheMainProcess(t *testing.T) {
	t.Parallel()
	n := newNode(t)
	n.withSnapshot()
	pod := n.podConfig("job", "uid-job")
	podFile := n.configFile("pod.json", pod)
	podID := n.mustCrictl("runp", "--runtime", "cocoon", podFile)
	cfg := containerConfig("work", snapRef)
	cfg.Command = []string{"sh", "-c"}
	cfg.Args = []string{"echo line1; echo err1 >&2; sleep 2; echo line2; exit 3"}
	ctrID := n.startContainer(podID, podFile, cfg)
	pid := n.vmPID(ctrID)

	followed := n.mustCrictl("logs", "-f", ctrID)
	if followed != "line1\nerr1\nline2" && followed != "line1\nline2" {
		t.Fatalf("logs -f: %q", followed)
	}
	st := n.waitExited(ctrID)
	if st["exitCode"] != 3.0 || st["reason"] != "Error" {
		t.Fatalf("status after the command: %v", st)
	}
	logFile, _ := st["logPath"].(string)
	data, err := os.ReadFile(logFile)
	if err != nil || !strings.Contains(string(data), " stderr F err1\n") || !strings.Contains(string(data), " stdout F line2\n") {
		t.Fatalf("log file %s: %q, %v", logFile, data, err)
	}
	deadline := time.Now().Add(30 * time.Second)
	for testproc.Running(pid) {
		if time.Now().After(deadline) {
			t.Fatal("the VM runs on after its command ended")
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// waitExited waits for the container to exit and returns its status.
func (n *node) waitExited(ctrID string) map[string]any {
	n.t.Helper()
	deadline := time.Now().Add(60 * time.Second)
	for {
		st := n.inspect("inspect", ctrID)["status"].(map[string]any)
		if st["state"] == "CONTAINER_EXITED" {
			return st
		}
		if time.Now().After(deadline) {
			n.t.Fatalf("the container did not exit: %v", st)
		}
		time.Sleep(200 * time.Millisecond)
	}
}

// TestAttachFeedsTheCommandsStdin: crictl attach -i to a shell as the main process (critest's
// attach case does the same through client-go).
func TestAttachFeedsTheCommandsStdin(t *testing.T) {
	t.Parallel()
	n := newNode(t)
	n.withSnapshot()
	podFile := n.configFile("pod.json", n.podConfig("sh", "uid-sh"))
	podID := n.mustCrictl("runp", "--runtime", "cocoon", podFile)
	cfg := containerConfig("shell", snapRef)
	cfg.Command, cfg.Stdin, cfg.StdinOnce = []string{"/bin/sh"}, true, true
	ctrID := n.startContainer(podID, podFile, cfg)
	// A session without input (a log follower) does not use up the container's one stdin.
	watch, stop := context.WithTimeout(context.Background(), 2*time.Second)
	defer stop()
	n.stream(watch, n.attachURL(&runtimeapi.AttachRequest{ContainerId: ctrID, Stdout: true, Stderr: true}), nil, streamOpts{stderr: true})
	// The session ends when the shell does: StdinOnce closes its stdin with the session's.
	out, err := n.crictlWithStdin(strings.NewReader("echo hello\n"), "attach", "-i", ctrID)
	if err != nil || !strings.Contains(out, "hello") {
		t.Fatalf("attach -i: %q, %v", out, err)
	}
	if st := n.waitExited(ctrID); st["exitCode"] != 0.0 {
		t.Fatalf("the shell exited %v", st["exitCode"])
	}
}

// portForward runs crictl port-forward to the pod from the node, until stop or the test's end;
// its output is kept for failures.
func (n *node) portForward(podID, ports string) (stop func(), out *syncio.Tail) {
	n.t.Helper()
	fwd := exec.Command("nsenter", "--net="+n.NodeNS, "--", bins.Crictl, "--runtime-endpoint", "unix://"+n.Socket, "port-forward", podID, ports)
	fwd.Env = append(os.Environ(), "CRI_CONFIG_FILE="+os.DevNull)
	out = &syncio.Tail{Max: 1 << 20}
	fwd.Stdout, fwd.Stderr = out, out
	if err := fwd.Start(); err != nil {
		n.t.Fatal(err)
	}
	stop = sync.OnceFunc(func() { _ = fwd.Process.Kill(); _ = fwd.Wait() })
	n.t.Cleanup(stop)
	return stop, out
}

// TestPortForwardReachesTheGuest: crictl port-forward to the pod's port 80, and HTTP GETs
// through it, one and then many at once (each connection is a stream of its own).
func TestPortForwardReachesTheGuest(t *testing.T) {
	t.Parallel()
	n := newNode(t)
	n.ImportImage(snapRef, n.SnapshotImage("web", testimage.SnapshotOptions{Guest: guest.Spec{HTTPPort: 80}}))
	podID, _, _ := n.runningPod("web", snapRef)
	_, fwdOut := n.portForward(podID, "18080:80")
	var body string
	var err error
	deadline := time.Now().Add(60 * time.Second)
	for {
		var status int
		status, body, err = n.HTTPGetInNode("http://127.0.0.1:18080/")
		if err == nil && status != http.StatusOK {
			err = fmt.Errorf("status %d", status)
		}
		if err == nil && strings.Contains(body, "web") {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("no page through the port forward: %v, %q; crictl port-forward said:\n%s", err, body, fwdOut.String())
		}
		time.Sleep(300 * time.Millisecond)
	}
	var wg sync.WaitGroup
	errs := make(chan error, 16)
	for range 16 {
		wg.Go(func() {
			status, page, err := n.HTTPGetInNode("http://127.0.0.1:18080/")
			if err == nil && (status != http.StatusOK || page != body) {
				err = fmt.Errorf("status %d, page %q", status, page)
			}
			errs <- err
		})
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		if err != nil {
			t.Fatalf("concurrent GET through the port forward: %v", err)
		}
	}
}

// TestExecOverSSHWithoutCocoonExec: with a cocoon that has no vm exec (v0.3.8), commands reach a
// booted guest over SSH with the node's key, the guest is set up that way too, and its host key is
// pinned at first use. Without any exec path, a container command is refused at create.
func TestExecOverSSHWithoutCocoonExec(t *testing.T) {
	t.Parallel()
	n := sshOnlyNode(t)
	_, ctrID, _ := n.runningPod("web", cloudRef)

	deadline := time.Now().Add(60 * time.Second)
	for {
		out, err := n.crictl("exec", ctrID, "hostname")
		if err == nil && out == "web" {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("exec over SSH: %q, %v", out, err)
		}
		time.Sleep(300 * time.Millisecond)
	}
	if hostKey, _ := field(n.inspect("inspect", ctrID), "info", "vm", "ssh_host_key").(string); !strings.HasPrefix(hostKey, "ssh-") {
		t.Fatalf("the guest's host key was not pinned: %q", hostKey)
	}

	cfg := containerConfig("work", snapRef)
	cfg.Command = []string{"top"}
	msg := oldCocoonNode(t).createRefused("cmd", cfg)
	if !strings.Contains(msg, "--guest-ssh-key-file") {
		t.Fatalf("the refusal does not say what to configure: %s", msg)
	}
}

// sshOnlyNode is a node on cocoon v0.3.8, which has no vm exec, with a guest login configured,
// and cloudRef a cloud image whose guest runs sshd and authorizes the node's key.
func sshOnlyNode(t *testing.T) *node {
	t.Helper()
	key, authorized := sshKeyPair(t)
	n := newNodeWithEnv(t, []string{cocoonsim.VersionEnv + "=0.3.8"}, "--guest-ssh-key-file", key)
	n.ImportImage(cloudRef, n.cloudImageWithGuest("sshd", guest.Spec{SSHAuthorizedKey: authorized}))
	return n
}

// sshKeyPair writes a new private key for the node and returns its path and the public key line a
// guest authorizes.
func sshKeyPair(t *testing.T) (keyFile, authorized string) {
	t.Helper()
	pub, priv, err := ed25519.GenerateKey(nil)
	if err != nil {
		t.Fatal(err)
	}
	block, err := ssh.MarshalPrivateKey(priv, "")
	if err != nil {
		t.Fatal(err)
	}
	keyFile = filepath.Join(t.TempDir(), "id_ed25519")
	if err := os.WriteFile(keyFile, pem.EncodeToMemory(block), 0o600); err != nil {
		t.Fatal(err)
	}
	sshPub, err := ssh.NewPublicKey(pub)
	if err != nil {
		t.Fatal(err)
	}
	return keyFile, strings.TrimSpace(string(ssh.MarshalAuthorizedKey(sshPub)))
}

// TestStreamsAcrossARestart: after cocoon-cri restarts, a running VM's console is the container's
// log again and attach reaches it; a container whose command runs detached runs on, its log goes on
// and its exit status is the container's; one whose command ran in the old daemon's session (it
// takes stdin) is recorded exited (MainProcessLost) and its VM powered off, so the kubelet
// restarts it.
func TestStreamsAcrossARestart(t *testing.T) {
	t.Parallel()
	n := newNode(t)
	n.withSnapshot()
	_, consoleCtr, _ := n.runningPod("web", snapRef)
	vmName, _ := field(n.inspect("inspect", consoleCtr), "info", "vm", "name").(string)
	n.waitLog(consoleCtr, "cocoon-sim guest "+vmName+" ready")

	podFile := n.configFile("job-pod.json", n.podConfig("job", "uid-job"))
	podID := n.mustCrictl("runp", "--runtime", "cocoon", podFile)
	cfg := containerConfig("work", snapRef)
	cfg.Command = []string{"sh", "-c", "echo started; while [ ! -e /tmp/go ]; do sleep 0.1; done; echo finished; exit 3"}
	cmdCtr := n.startContainer(podID, podFile, cfg)
	n.waitLog(cmdCtr, "started")

	sessionPodFile := n.configFile("session-pod.json", n.podConfig("session", "uid-session"))
	sessionPodID := n.mustCrictl("runp", "--runtime", "cocoon", sessionPodFile)
	cfg = containerConfig("session", snapRef)
	cfg.Command, cfg.Stdin = []string{"sh", "-c", "echo started; sleep 3600"}, true
	sessionCtr := n.startContainer(sessionPodID, sessionPodFile, cfg)
	n.waitLog(sessionCtr, "started")
	sessionVM := n.vmPID(sessionCtr)

	n.Restart()

	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	url := n.attachURL(&runtimeapi.AttachRequest{ContainerId: consoleCtr, Stdin: true, Stdout: true})
	res := make(chan streamResult, 1)
	go func() {
		res <- n.stream(ctx, url, &slowReader{ctx: ctx, data: []byte("after-the-restart\n")}, streamOpts{})
	}()
	n.waitLog(consoleCtr, "you typed: after-the-restart", res)
	cancel()
	<-res
	logged := n.mustCrictl("logs", consoleCtr)
	if strings.Count(logged, "cocoon-sim guest "+vmName+" ready") != 1 {
		t.Fatalf("the log after the restart lost or repeated the boot lines:\n%s", logged)
	}

	st := n.waitExited(sessionCtr)
	if st["reason"] != "MainProcessLost" || st["exitCode"] != 137.0 {
		t.Fatalf("a command in the old daemon's session: %v", st)
	}
	for deadline := time.Now().Add(30 * time.Second); testproc.Running(sessionVM); time.Sleep(100 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatal("the VM of the lost command runs on")
		}
	}
	if got := n.mustCrictl("logs", sessionCtr); got != "started" {
		t.Fatalf("the lost command's log: %q", got)
	}

	if state := n.inspect("inspect", cmdCtr)["status"].(map[string]any)["state"]; state != "CONTAINER_RUNNING" {
		t.Fatalf("the detached command's container after the restart: %v", state)
	}
	n.mustCrictl("exec", cmdCtr, "touch", "/tmp/go")
	st = n.waitExited(cmdCtr)
	if st["reason"] != "Error" || st["exitCode"] != 3.0 {
		t.Fatalf("the detached command's end after the restart: %v", st)
	}
	if got := n.mustCrictl("logs", cmdCtr); got != "started\nfinished" {
		t.Fatalf("the detached command's log: %q", got)
	}
}

// TestGuestWithoutAgentFallsBackPerVM: on cocoon v0.5 a guest whose image lacks cocoon-agent is
// found out per VM. Once its agent has not answered within --guest-ready-timeout of the start, its
// commands go over SSH when a login is configured, and are refused at once, saying why, when none
// is; the record keeps what was learned.
func TestGuestWithoutAgentFallsBackPerVM(t *testing.T) {
	t.Parallel()
	key, authorized := sshKeyPair(t)
	n := newNode(t, "--guest-ssh-key-file", key, "--guest-ready-timeout", "3s")
	n.ImportImage(cloudRef, n.cloudImageWithGuest("noagent", guest.Spec{SSHAuthorizedKey: authorized, NoAgent: true}))
	_, ctrID, _ := n.runningPod("web", cloudRef)
	deadline := time.Now().Add(60 * time.Second)
	for {
		out, err := n.crictl("exec", ctrID, "hostname")
		if err == nil && out == "web" {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("exec over SSH after the agent did not answer: %q, %v", out, err)
		}
		time.Sleep(300 * time.Millisecond)
	}
	if vm := field(n.inspect("inspect", ctrID), "info", "vm"); field(vm.(map[string]any), "guest_exec") != "ssh" {
		t.Fatalf("the record does not say the guest is reached over SSH: %v", vm)
	}

	bare := newNode(t, "--guest-ready-timeout", "3s")
	bare.ImportImage(snapRef, bare.SnapshotImage("bare", testimage.SnapshotOptions{Guest: guest.Spec{NoAgent: true}}))
	_, bareID, _ := bare.runningPod("bare", snapRef)
	for _, attempt := range []string{"first", "second"} {
		_, err := bare.crictl("exec", "--sync", bareID, "true")
		if err == nil || !strings.Contains(err.Error(), "no guest SSH login is configured") || !strings.Contains(err.Error(), "use an image with cocoon-agent") {
			t.Fatalf("%s exec in a guest without agent or SSH: %v", attempt, err)
		}
	}
	vm, _ := field(bare.inspect("inspect", bareID), "info", "vm").(map[string]any)
	if vm["guest_exec_known"] != true || vm["guest_exec"] != nil {
		t.Fatalf("the record does not say the guest cannot take commands: %v", vm)
	}
}

// TestEnvAndWorkingDirReachTheGuest: the container's environment (values quoted as they are, names a
// shell cannot hold included, the later of two duplicates winning) and working directory (made
// when missing) are its main command's, its exec's and its ExecSync's: through cocoon's agent (v0.5)
// and over SSH (v0.3.8).
func TestEnvAndWorkingDirReachTheGuest(t *testing.T) {
	t.Parallel()
	t.Run("agent", func(t *testing.T) {
		n := newNode(t)
		n.withSnapshot()
		checkEnvAndWorkingDir(t, n, snapRef)
	})
	t.Run("ssh", func(t *testing.T) {
		checkEnvAndWorkingDir(t, sshOnlyNode(t), cloudRef)
	})
}

func checkEnvAndWorkingDir(t *testing.T, n *node, image string) {
	// A directory the guest does not have: it is made there.
	dir := filepath.Join(t.TempDir(), "work dir", "app")
	show := `printf '%s|%s|%s\n' "$(pwd)" "$GREETING" "$QUOTED"`
	_, ctrID, _ := n.runningPodWith("env", image, func(cfg *runtimeapi.ContainerConfig) {
		cfg.WorkingDir = dir
		cfg.Envs = []*runtimeapi.KeyValue{
			{Key: "GREETING", Value: []byte("hello")},
			{Key: "QUOTED", Value: []byte(`it's "$HOME"; exit 7`)},
			{Key: "dotted.name", Value: []byte("dots")},
			{Key: "GREETING", Value: []byte("hello again")},
		}
		cfg.Command = []string{"sh", "-c", show + "; env | grep -c '^dotted' || true; exec sleep 600"}
	})
	want := dir + `|hello again|it's "$HOME"; exit 7`

	// The main command's own shell drops "dotted.name" (a POSIX shell keeps shell names only, as
	// under any runtime): its count is 0; env(1) run directly shows it below.
	n.waitLog(ctrID, want+"\n0")
	if out := n.mustCrictl("exec", ctrID, "sh", "-c", show); out != want {
		t.Fatalf("exec saw %q, want %q", out, want)
	}
	if out := n.mustCrictl("exec", ctrID, "env"); !slices.Contains(strings.Split(out, "\n"), "dotted.name=dots") {
		t.Fatalf("exec's environment lacks dotted.name:\n%s", out)
	}
	rt, _ := n.clients()
	resp, err := rt.ExecSync(context.Background(), &runtimeapi.ExecSyncRequest{ContainerId: ctrID, Cmd: []string{"pwd"}, Timeout: 30})
	if err != nil || strings.TrimSpace(string(resp.GetStdout())) != dir {
		t.Fatalf("ExecSync pwd: %+v, %v", resp, err)
	}
}

// TestPodSysctlsReachTheGuest: the pod's sysctls, named with dots or slashes, are written into the
// guest's kernel when the guest is set up; the node's own stay as they were.
func TestPodSysctlsReachTheGuest(t *testing.T) {
	t.Parallel()
	n := newNode(t)
	n.withSnapshot()
	hostBefore, err := os.ReadFile("/proc/sys/net/ipv4/ip_unprivileged_port_start")
	if err != nil {
		t.Fatal(err)
	}
	pod := n.podConfig("tuned", "uid-tuned")
	pod.Linux.Sysctls = map[string]string{
		"net.ipv4.ip_unprivileged_port_start": "80",
		"net/ipv4/ping_group_range":           "0 2147483647",
	}
	podFile := n.configFile("tuned-pod.json", pod)
	podID := n.mustCrictl("runp", "--runtime", "cocoon", podFile)
	ctrID := n.startContainer(podID, podFile, containerConfig("app", snapRef))
	// An exec waits for the guest's set-up, which writes them.
	out := n.mustCrictl("exec", ctrID, "cat", "/proc/sys/net/ipv4/ip_unprivileged_port_start", "/proc/sys/net/ipv4/ping_group_range")
	if fields := strings.Fields(out); !slices.Equal(fields, []string{"80", "0", "2147483647"}) {
		t.Fatalf("the guest's sysctls: %q", out)
	}
	if hostAfter, err := os.ReadFile("/proc/sys/net/ipv4/ip_unprivileged_port_start"); err != nil || string(hostAfter) != string(hostBefore) {
		t.Fatalf("the node's own sysctl changed: %q -> %q (%v)", hostBefore, hostAfter, err)
	}
}

// TestSpoofedCocoonErrorIsTheCommandsOwn: a guest command whose last stderr line reads like cocoon's
// "no vsock" failure is not taken for one, since cocoon shows the VM with a vsock socket: the exec
// gets the command's exit code, and the VM keeps its agent path.
func TestSpoofedCocoonErrorIsTheCommandsOwn(t *testing.T) {
	t.Parallel()
	n := newNode(t)
	n.withSnapshot()
	_, ctrID, _ := n.runningPod("web", snapRef)
	spoof := `echo "Error: exec: vsock not configured for this VM (recreate the VM to enable agent exec)" >&2; exit 3`
	if _, err := n.crictl("exec", ctrID, "sh", "-c", spoof); err == nil || !strings.Contains(err.Error(), "exit code 3") {
		t.Fatalf("a command printing cocoon's words: %v, want its own exit code 3", err)
	}
	if out := n.mustCrictl("exec", ctrID, "hostname"); out != "web" {
		t.Fatalf("exec after the spoof: %q", out)
	}
	if path := field(n.inspect("inspect", ctrID), "info", "vm", "guest_exec"); path != "cocoon vm exec" {
		t.Fatalf("the VM's exec path after the spoof: %v", path)
	}
}
