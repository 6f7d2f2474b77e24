package vmruntime

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"

	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"

	"github.com/cocoonstack/cocoon-cri/pkg/cocoon"
	"github.com/cocoonstack/cocoon-cri/pkg/store"
	"github.com/cocoonstack/cocoon-cri/pkg/vmstats"
)

// hostShellGuest runs the detached command's scripts (launch, follow, status) and what they
// launch as processes of this host, as cocoon's agent runs a guest's commands: each session in a
// process group of its own, killed whole when the session ends. Each VM's guestMainRoot is
// root/<VM ID>.
// Every other command is answered as the fake's default guest answers it: none of them runs here.
func hostShellGuest(t *testing.T, fc *fakeCocoon, root string) fakeGuest {
	t.Helper()
	scripts := map[string]bool{launchScript: true, followScript: true, statusScript: true}
	return func(ctx context.Context, vm cocoon.VM, argv []string, o cocoon.ExecOptions) (int, error) {
		if len(argv) < 3 || argv[0] != "/bin/sh" || argv[1] != "-c" || !scripts[argv[2]] {
			return fc.defaultGuest(ctx, vm, argv, o)
		}
		args := make([]string, len(argv))
		for i, a := range argv {
			args[i] = strings.Replace(a, guestMainRoot, filepath.Join(root, vm.ID), 1)
		}
		cmd := exec.Command(args[0], args[1:]...)
		cmd.Env = os.Environ()
		for k, v := range o.Env {
			cmd.Env = append(cmd.Env, k+"="+v)
		}
		cmd.Stdin, cmd.Stdout, cmd.Stderr = o.Stdin, o.Stdout, o.Stderr
		cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
		if err := cmd.Start(); err != nil {
			return -1, err
		}
		stop := context.AfterFunc(ctx, func() { _ = syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL) })
		defer stop()
		err := cmd.Wait()
		if ctx.Err() != nil {
			return -1, ctx.Err()
		}
		var exit *exec.ExitError
		if errors.As(err, &exit) {
			return exit.ExitCode(), nil
		}
		return 0, err
	}
}

// detachedNode is a hibernating node whose guests run the detached command's scripts on this
// host (hostShellGuest), and a pod on it that keeps a log; what the command launched is killed
// when the test ends.
func detachedNode(t *testing.T) (n *fakeNode, sandboxID, root string) {
	t.Helper()
	n, _ = hibernatingNode(t)
	pid, _ := hypervisorStandIn(t)
	n.cocoon.setPID(func() int { return pid })
	root = t.TempDir()
	n.cocoon.setGuest(hostShellGuest(t, n.cocoon, root))
	t.Cleanup(func() {
		pids, _ := filepath.Glob(filepath.Join(root, "*", "main", "pid"))
		for _, p := range pids {
			if pid := readPID(p); pid > 0 {
				_ = syscall.Kill(-pid, syscall.SIGKILL)
			}
		}
	})
	n.importSnapshot(snapshotRef, appSnapshot())
	logs := t.TempDir()
	sandboxID, err := n.runPodWith("detached", func(cfg *runtimeapi.PodSandboxConfig) { cfg.LogDirectory = logs })
	if err != nil {
		t.Fatal(err)
	}
	return n, sandboxID, root
}

// startCommand creates and starts a container of the app snapshot that runs script with env.
func (n *fakeNode) startCommand(sandboxID, script string, env map[string]string) string {
	n.t.Helper()
	cfg := containerConfig("app", snapshotRef)
	cfg.Command = []string{"/bin/sh", "-c", script}
	cfg.LogPath = "app.log"
	for k, v := range env {
		cfg.Envs = append(cfg.Envs, &runtimeapi.KeyValue{Key: k, Value: []byte(v)})
	}
	resp, err := n.s.CreateContainer(context.Background(), &runtimeapi.CreateContainerRequest{
		PodSandboxId: sandboxID, Config: cfg, SandboxConfig: n.sandbox(sandboxID).Config.Msg,
	})
	if err != nil {
		n.t.Fatal(err)
	}
	n.startContainer(resp.GetContainerId())
	return resp.GetContainerId()
}

// hibernate hibernates the container once its guest's set-up is over, as an idle one would be:
// a VM hibernated in the middle of it leaves the set-up waiting for the guest.
func (n *fakeNode) hibernate(id string) {
	n.t.Helper()
	settle(n.s)
	if err := n.s.Hibernate(context.Background(), id); err != nil {
		n.t.Fatalf("a container with a detached command did not hibernate: %v", err)
	}
}

func (n *fakeNode) containerLog(id string) string {
	n.t.Helper()
	data, _ := os.ReadFile(n.container(id).LogPath)
	return string(data)
}

// readPID reads the PID the wrapper recorded ("PID start").
func readPID(file string) int {
	data, _ := os.ReadFile(file)
	pid, _, _ := strings.Cut(strings.TrimSpace(string(data)), " ")
	n, _ := strconv.Atoi(pid)
	return n
}

// waitingCommand prints to both streams, waits until the file $GO exists, prints again and exits 7.
const waitingCommand = `echo before; echo on-stderr >&2
while [ ! -e "$GO" ]; do sleep 0.05; done
echo after; exit 7`

// A detached command runs on through a hibernation, a wake, a restart of cocoon-cri, and a restart
// while it hibernates: its output reaches the log once, from both streams, and its exit status is
// the container's.
func TestDetachedCommandOutlivesHibernationAndRestart(t *testing.T) {
	n, sandboxID, root := detachedNode(t)
	goFile := filepath.Join(t.TempDir(), "go")
	id := n.startCommand(sandboxID, waitingCommand, map[string]string{"GO": goFile})
	eventually(t, "the command's first lines in the log", func() bool {
		log := n.containerLog(id)
		return strings.Contains(log, " stdout F before") && strings.Contains(log, " stderr F on-stderr")
	})
	if !n.container(id).MainDetached {
		t.Fatal("the command was not recorded as detached")
	}
	command := readPID(filepath.Join(root, n.container(id).VM.ID, "main", "pid"))
	running := func() bool { return vmstats.Running(procRoot, command) }
	if !running() {
		t.Fatalf("the command's wrapper (PID %d) does not run", command)
	}

	ctx := context.Background()
	n.hibernate(id)
	if !n.container(id).VM.Hibernated() || !running() {
		t.Fatalf("hibernated %v, the command running %v: want both", n.container(id).VM.Hibernated(), running())
	}
	if err := n.s.Wake(ctx, id); err != nil {
		t.Fatal(err)
	}
	n.restartAndRecover()
	if c := n.container(id); c.State != store.ContainerRunning || !running() {
		t.Fatalf("after the restart: container %s (%s: %s), the command running %v", c.State, c.Reason, c.Message, running())
	}
	// Hibernated across a restart, it is followed again once it wakes. It ends while nobody follows
	// it (the fake's hibernation freezes no process): its last output waits for the next follower.
	n.hibernate(id)
	n.restartAndRecover()
	if err := os.WriteFile(goFile, nil, 0o644); err != nil {
		t.Fatal(err)
	}
	guestDir := filepath.Join(root, n.container(id).VM.ID, "main")
	eventually(t, "the command's end in the guest", func() bool {
		_, err := os.Stat(filepath.Join(guestDir, "exit"))
		return err == nil
	})
	if err := n.s.Wake(ctx, id); err != nil {
		t.Fatal(err)
	}
	eventually(t, "the container's exit", func() bool { return n.container(id).State == store.ContainerExited })
	c := n.container(id)
	if c.ExitCode != 7 || c.Reason != reasonError {
		t.Errorf("exit %d (%s: %s), want the command's 7", c.ExitCode, c.Reason, c.Message)
	}
	log := n.containerLog(id)
	for _, line := range []string{" stdout F before", " stderr F on-stderr", " stdout F after"} {
		if strings.Count(log, line) != 1 {
			t.Errorf("the log has %q %d times, want once:\n%s", line, strings.Count(log, line), log)
		}
	}
}

// A guest that comes back from its hibernation without the command, or its /run (as the
// simulator's does: it keeps no processes, and /run is new), ends the container as lost: not as
// exited with a status it never had, and without running the command again.
func TestDetachedCommandGoneAfterTheWakeIsLost(t *testing.T) {
	n, sandboxID, root := detachedNode(t)
	id := n.startCommand(sandboxID, waitingCommand, map[string]string{"GO": filepath.Join(t.TempDir(), "go")})
	eventually(t, "the command's first line in the log", func() bool { return strings.Contains(n.containerLog(id), "before") })
	ctx := context.Background()
	n.hibernate(id)
	guestDir := filepath.Join(root, n.container(id).VM.ID, "main")
	command := readPID(filepath.Join(guestDir, "pid"))
	if err := syscall.Kill(-command, syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	if err := os.RemoveAll(guestDir); err != nil {
		t.Fatal(err)
	}
	if err := n.s.Wake(ctx, id); err != nil {
		t.Fatal(err)
	}
	eventually(t, "the container's exit", func() bool { return n.container(id).State == store.ContainerExited })
	if c := n.container(id); c.Reason != reasonMainProcessLost || c.ExitCode != killedExitCode {
		t.Errorf("exit %d (%s: %s), want %d (%s)", c.ExitCode, c.Reason, c.Message, killedExitCode, reasonMainProcessLost)
	}
	if log := n.containerLog(id); strings.Count(log, "before") != 1 {
		t.Errorf("the command ran again:\n%s", log)
	}
	if _, err := os.Stat(guestDir); err == nil {
		t.Error("the command was launched again")
	}
}

// A command that takes stdin runs in the session, and its container never hibernates.
func TestCommandTakingStdinNeverHibernates(t *testing.T) {
	n, sandboxID, _ := detachedNode(t)
	n.cocoon.setGuest(func(ctx context.Context, vm cocoon.VM, argv []string, o cocoon.ExecOptions) (int, error) {
		if argv[0] == "sleep" {
			<-ctx.Done()
			return -1, ctx.Err()
		}
		return n.cocoon.defaultGuest(ctx, vm, argv, o)
	})
	cfg := containerConfig("app", snapshotRef)
	cfg.Command, cfg.Stdin = []string{"sleep", "infinity"}, true
	resp, err := n.s.CreateContainer(context.Background(), &runtimeapi.CreateContainerRequest{
		PodSandboxId: sandboxID, Config: cfg, SandboxConfig: n.sandbox(sandboxID).Config.Msg,
	})
	if err != nil {
		t.Fatal(err)
	}
	id := resp.GetContainerId()
	n.startContainer(id)
	settle(n.s)
	var refusal *hibernationRefusal
	if err := n.s.Hibernate(context.Background(), id); !errors.As(err, &refusal) || !strings.Contains(refusal.why, "stdin") {
		t.Fatalf("hibernating a container whose command takes stdin: %v", err)
	}
	if n.container(id).MainDetached {
		t.Error("a command that takes stdin was recorded as detached")
	}
}

// The launch in a copy of a VM (a restored checkpoint, a fork) whose command runs already follows
// that command instead of launching another; in dash and in busybox's ash.
func TestLaunchInACopyFollowsTheCommandItHas(t *testing.T) {
	shells := map[string][]string{"dash": {"/bin/sh"}}
	if bb, err := exec.LookPath("busybox"); err == nil {
		shells["busybox"] = []string{bb, "sh"}
	}
	for name, shell := range shells {
		t.Run(name, func(t *testing.T) {
			script := func(script string, args ...string) *exec.Cmd {
				argv := append(append(slices.Clone(shell), "-c", script), args...)
				return exec.Command(argv[0], argv[1:]...)
			}
			dir := filepath.Join(t.TempDir(), "main")
			first := script(launchScript, dir, "/bin/sh", "-c", "echo first; exec sleep 60")
			first.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
			if err := first.Start(); err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() {
				if pid := readPID(filepath.Join(dir, "pid")); pid > 0 {
					_ = syscall.Kill(-pid, syscall.SIGKILL)
				}
				_ = syscall.Kill(-first.Process.Pid, syscall.SIGKILL)
				_ = first.Wait()
			})
			eventually(t, "the first command's PID", func() bool { return readPID(filepath.Join(dir, "pid")) > 0 })
			command := readPID(filepath.Join(dir, "pid"))

			second, err := script(launchScript, dir, "/bin/sh", "-c", "echo second").CombinedOutput()
			if err != nil || len(second) > 0 {
				t.Fatalf("the launch beside a running command: %v, %q", err, second)
			}
			if pid := readPID(filepath.Join(dir, "pid")); pid != command {
				t.Fatalf("the command's PID went from %d to %d", command, pid)
			}
			status, err := script(statusScript, dir).Output()
			if err != nil || strings.TrimSpace(string(status)) != "running" {
				t.Fatalf("the status after the second launch: %q %v", status, err)
			}
			// Another process under the recorded PID is not the command.
			if err := os.WriteFile(filepath.Join(dir, "pid"), fmt.Appendf(nil, "%d 1\n", os.Getpid()), 0o644); err != nil {
				t.Fatal(err)
			}
			if status, err := script(statusScript, dir).Output(); err != nil || strings.TrimSpace(string(status)) != "lost" {
				t.Fatalf("the status with another process under the PID: %q %v", status, err)
			}
		})
	}
}
