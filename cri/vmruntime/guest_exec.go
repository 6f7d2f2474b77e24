package vmruntime

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"net"
	"os"
	"regexp"
	"slices"
	"strconv"
	"time"

	"github.com/containerd/errdefs"

	"golang.org/x/crypto/ssh"
	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"

	"github.com/cocoonstack/cocoon-cri/pkg/cocoon"
	"github.com/cocoonstack/cocoon-cri/pkg/store"
	"github.com/cocoonstack/cocoon-cri/streaming"
)

// GuestSSH is how cocoon-cri logs in to guests when cocoon has no vm exec: with the node's key.
// Images may name their own user, and a password besides the key, with the labels
// cocoon.ssh.username and cocoon.ssh.password, as cocoon's OCI images declare them: such a password
// is as public as the image. There is no node-wide password: every guest's sshd would be handed it,
// and a hostile one could use it on the other VMs.
type GuestSSH struct {
	User    string
	KeyFile string
	Port    int
}

func (g GuestSSH) configured() bool { return g.KeyFile != "" }

// Image labels that override the guest login.
const (
	labelSSHUser     = "cocoon.ssh.username"
	labelSSHPassword = "cocoon.ssh.password"
)

// errNoExecPath says what to configure when there is no way into a guest.
var errNoExecPath = errdefs.ErrFailedPrecondition.WithMessage(
	"cannot run commands in the guest: this cocoon has no vm exec (it came after v0.3.8) and no guest SSH login is configured; " +
		"upgrade cocoon, or start cocoon-cri with --guest-ssh-key-file")

// agentRetry paces retries while a booting guest's agent comes up.
const agentRetry = 250 * time.Millisecond

// How commands reach guests (ExecPath).
const (
	ExecPathAgent = "cocoon vm exec"
	ExecPathSSH   = "ssh"
	ExecPathNone  = ""
)

// guestExecutor runs commands in guests: through cocoon's guest agent (vm exec), or over SSH to
// the pod IP with the node's key, trusting each guest's host key on first use. It records on the
// container what it learns of each VM (the path its commands take, the host key it pinned), so
// later commands neither wait for an agent that is not there nor trust another key.
type guestExecutor struct {
	ssh          GuestSSH
	readyTimeout time.Duration // how long a started guest's agent is waited for
	log          *slog.Logger
	store        *store.Store
	cocoon       Cocoon
	cocoonFor    func(*store.Sandbox) Cocoon
	now          func() time.Time
}

// path is how commands reach guests on this node: through cocoon's guest agent (vm exec) when
// this cocoon has it, over SSH to the pod IP when a login is configured, or not at all. A VM may
// learn otherwise (vmPath). When cocoon cannot be asked what it has, that is an error
// (Unavailable), never "no path": the next call asks again.
func (g *guestExecutor) path(ctx context.Context) (string, error) {
	caps, err := g.cocoon.Capabilities(ctx)
	switch {
	case err != nil:
		return ExecPathNone, unavailable("cannot learn whether this cocoon has vm exec (retry): %v", err)
	case caps.Exec:
		return ExecPathAgent, nil
	case g.ssh.configured():
		return ExecPathSSH, nil
	}
	return ExecPathNone, nil
}

// ExecPath is the node's exec path (guestExecutor.path) for the daemon's log: "" when there is none or it cannot be told yet.
func (s *Runtime) ExecPath(ctx context.Context) string {
	path, _ := s.guest.path(ctx)
	return path
}

// guestCommand is a command to run in a guest: argv, with env added to the guest's environment and
// in dir, where they are set; otherwise the guest's own defaults (its agent's, or the login's).
type guestCommand struct {
	argv []string
	env  map[string]string
	dir  string
	// last: the VM's last command (its power-off). How it reached the guest is not recorded: no
	// command will follow, and the record would be one more synced commit in StopContainer.
	last bool
}

// systemCommand is a command of cocoon-cri's own (guest set-up, poweroff): the container's
// environment and working directory are not its.
func systemCommand(argv ...string) guestCommand { return guestCommand{argv: argv} }

// powerOffCommand asks the guest to power off: the VM's last command.
func powerOffCommand() guestCommand { return guestCommand{argv: []string{"poweroff"}, last: true} }

// containerCommand is argv as the container's processes run: with its environment (the kubelet's
// service variables included; a later duplicate wins, as in a process environment built in order)
// in its working directory.
func containerCommand(cfg *runtimeapi.ContainerConfig, argv []string) guestCommand {
	cmd := guestCommand{argv: argv, dir: cfg.GetWorkingDir()}
	for _, kv := range cfg.GetEnvs() {
		if cmd.env == nil {
			cmd.env = map[string]string{}
		}
		cmd.env[kv.GetKey()] = string(kv.GetValue())
	}
	return cmd
}

// workDirExitCode is the exit code of a command whose working directory cannot be entered; as for
// a container runtime that cannot start a process (containerd's StartError), it is 128.
const workDirExitCode = 128

// inDir is the argv that runs argv in the command's directory, creating it when it is missing, as
// container runtimes do: neither cocoon's agent nor an SSH session takes a directory.
func (cmd guestCommand) inDir(argv []string) []string {
	if cmd.dir == "" {
		return argv
	}
	script := `mkdir -p -- "$0" 2>/dev/null; cd -- "$0" || exit ` + strconv.Itoa(workDirExitCode) + `; exec "$@"`
	return append([]string{"/bin/sh", "-c", script, cmd.dir}, argv...)
}

// withEnv is the argv that runs argv with env added to its environment, through env(1). It stands
// last before the command, after any shell: a POSIX shell passes on only the variables whose names
// are shell names, and Kubernetes allows others ("a.b", "a-b").
func withEnv(env map[string]string, argv []string) []string {
	if len(env) == 0 {
		return argv
	}
	out := []string{"env", "--"}
	for _, k := range slices.Sorted(maps.Keys(env)) {
		out = append(out, k+"="+env[k])
	}
	return append(out, argv...)
}

// sshArgv is what an SSH session runs. The session takes no environment (sshd refuses what
// AcceptEnv does not list), so env(1) sets all of it.
func (cmd guestCommand) sshArgv() []string { return cmd.inDir(withEnv(cmd.env, cmd.argv)) }

// agentArgv is what cocoon's vm exec runs, its --env giving the environment. Where a shell stands
// between the agent and the command (the working directory's, script(1)'s for a terminal), env(1)
// restores the variables that shell drops.
func (cmd guestCommand) agentArgv(tty bool) []string {
	argv := cmd.argv
	if cmd.dir != "" || tty {
		argv = withEnv(notShellNames(cmd.env), argv)
	}
	argv = cmd.inDir(argv)
	if tty {
		argv = []string{"script", "-qefc", streaming.ShellQuote(argv), "/dev/null"}
	}
	return argv
}

// shellName matches the variable names a POSIX shell keeps in the environment it passes on.
var shellName = regexp.MustCompile(`^[A-Za-z_][A-Za-z0-9_]*$`)

// notShellNames is the part of env that a shell would drop.
func notShellNames(env map[string]string) map[string]string {
	var out map[string]string
	for k, v := range env {
		if !shellName.MatchString(k) {
			if out == nil {
				out = map[string]string{}
			}
			out[k] = v
		}
	}
	return out
}

// run runs a command in the container's guest and returns its exit code, by the VM's exec
// path. A guest found to have no agent falls back to SSH where a login is configured.
func (g *guestExecutor) run(ctx context.Context, sb *store.Sandbox, c *store.Container, cmd guestCommand, stdio streaming.ExecIO) (int, error) {
	path, learned, err := g.vmPath(ctx, c)
	if err != nil {
		return -1, err
	}
	if path == ExecPathAgent {
		code, err := g.agent(ctx, sb, c, cmd, stdio)
		var none *noAgentError
		if !errors.As(err, &none) {
			return code, err
		}
		if path = g.learnNoAgent(c, none, !cmd.last); path == ExecPathNone {
			return -1, noAgentNoSSH(c, none.why)
		}
	}
	switch {
	case path == ExecPathSSH:
		return g.overSSH(ctx, sb, c, cmd.sshArgv(), stdio)
	case learned:
		return -1, noAgentNoSSH(c, "it has no cocoon-agent")
	}
	return -1, errNoExecPath
}

func noAgentNoSSH(c *store.Container, why string) error {
	return precondition("cannot run commands in the guest of %s: %s and no guest SSH login is configured; "+
		"use an image with cocoon-agent, or start cocoon-cri with --guest-ssh-key-file", c.VM.Name, why)
}

// vmPath is the exec path this VM was found to have (learned), else the node's.
func (g *guestExecutor) vmPath(ctx context.Context, c *store.Container) (path string, learned bool, err error) {
	if cur, err := g.store.Containers.Get(c.ID); err == nil && cur.VM.GuestExecKnown {
		return cur.VM.GuestExec, true, nil
	}
	path, err = g.path(ctx)
	return path, false, err
}

// noAgentError: the VM's guest has no cocoon-agent that will ever answer.
type noAgentError struct{ why string }

func (e *noAgentError) Error() string { return e.why }

// learn records the VM's exec path once, so later commands neither wait for an agent that
// is not there nor ask again.
func (g *guestExecutor) learn(c *store.Container, path string) {
	if cur, err := g.store.Containers.Get(c.ID); err != nil || cur.VM.GuestExecKnown {
		return
	}
	_, err := g.store.Containers.Modify(c.ID, func(r *store.Container) error {
		if r.VM.ID == c.VM.ID {
			r.VM.GuestExec, r.VM.GuestExecKnown = path, true
		}
		return nil
	})
	if err != nil {
		g.log.Warn("recording how commands reach the guest failed", "container", c.ID, "err", err)
	}
}

// learnNoAgent records (where record says so) that the VM has no agent and returns the path its
// commands take instead.
func (g *guestExecutor) learnNoAgent(c *store.Container, none *noAgentError, record bool) string {
	path := ExecPathNone
	if g.ssh.configured() {
		path = ExecPathSSH
	}
	if record {
		g.learn(c, path)
	}
	g.log.Warn("the guest has no cocoon-agent", "container", c.ID, "vm", c.VM.Name, "why", none.why, "guestExec", DescribeExecPath(path))
	return path
}

// DescribeExecPath names an exec path for logs.
func DescribeExecPath(path string) string {
	if path == ExecPathNone {
		return "none (commands, exec and ExecSync probes are refused)"
	}
	return path
}

// agent uses cocoon's vm exec, whose --env sets the environment. It has no terminal of its own:
// a TTY request runs the command under script(1) in the guest, which makes one (the terminal keeps
// its initial size). A booting guest's agent is waited for until ctx ends, or until the guest-ready
// timeout after the VM started has passed: then the guest has no agent (a noAgentError), as when
// cocoon says the VM has no vsock.
func (g *guestExecutor) agent(ctx context.Context, sb *store.Sandbox, c *store.Container, cmd guestCommand, stdio streaming.ExecIO) (int, error) {
	argv := cmd.agentArgv(stdio.TTY)
	if stdio.TTY {
		stdio.Stderr = stdio.Stdout
	}
	opts := cocoon.ExecOptions{Env: cmd.env, Stdin: stdio.Stdin, Stdout: stdio.Stdout, Stderr: stdio.Stderr}
	agentDeadline := time.Unix(0, c.StartedAt).Add(g.readyTimeout)
	for {
		code, err := g.cocoonFor(sb).VMExec(ctx, c.VM.ID, argv, opts)
		switch {
		case err == nil:
			if !cmd.last {
				g.learn(c, ExecPathAgent)
			}
			return code, nil
		case errors.Is(err, cocoon.ErrNoVsock) && g.vmHasVsock(ctx, c.VM.ID):
			// cocoon would not say so of a VM it gave a vsock socket: the line is the command's own
			// stderr, which a guest can word as it likes, and the exit code is the command's.
			var ce *cocoon.CommandError
			if errors.As(err, &ce) {
				return ce.ExitCode, nil
			}
			return code, err
		case errors.Is(err, cocoon.ErrNoVsock):
			return -1, &noAgentError{why: "cocoon says the VM has no vsock device for an agent"}
		case !errors.Is(err, cocoon.ErrAgentStarting):
			return code, err
		case c.StartedAt != 0 && g.now().After(agentDeadline):
			return -1, &noAgentError{why: fmt.Sprintf("its cocoon-agent did not answer within %s of the start", g.readyTimeout)}
		}
		select {
		case <-ctx.Done():
			return -1, fmt.Errorf("the guest agent of %s did not come up: %w", c.VM.Name, ctx.Err())
		case <-time.After(agentRetry):
		}
	}
}

// vmHasVsock reports whether cocoon shows the VM with a vsock socket for its agent.
func (g *guestExecutor) vmHasVsock(ctx context.Context, vmID string) bool {
	vm, err := g.cocoon.VMInspect(ctx, vmID)
	return err == nil && vm.VsockSocket != ""
}

func (g *guestExecutor) overSSH(ctx context.Context, sb *store.Sandbox, c *store.Container, argv []string, stdio streaming.ExecIO) (int, error) {
	if sb.Network == nil || len(sb.Network.IPs) == 0 {
		return -1, precondition("the pod has no IP to reach its guest's sshd at")
	}
	target, err := g.sshTarget(sb, c)
	if err != nil {
		return -1, err
	}
	return streaming.SSHExec(ctx, target, argv, stdio)
}

func (g *guestExecutor) sshTarget(sb *store.Sandbox, c *store.Container) (streaming.SSHTarget, error) {
	login := g.ssh
	user, password := login.User, ""
	if img, err := g.store.Images.Get(c.ImageID); err == nil {
		if u := img.Labels[labelSSHUser]; u != "" {
			user = u
		}
		if p := img.Labels[labelSSHPassword]; p != "" {
			password = p
		}
	}
	var auth []ssh.AuthMethod
	if login.KeyFile != "" {
		key, err := os.ReadFile(login.KeyFile)
		if err != nil {
			return streaming.SSHTarget{}, fmt.Errorf("read --guest-ssh-key-file: %w", err)
		}
		signer, err := ssh.ParsePrivateKey(key)
		if err != nil {
			return streaming.SSHTarget{}, fmt.Errorf("parse --guest-ssh-key-file: %w", err)
		}
		auth = append(auth, ssh.PublicKeys(signer))
	}
	if password != "" {
		auth = append(auth, ssh.Password(password))
	}
	return streaming.SSHTarget{
		Addr:    net.JoinHostPort(sb.Network.IPs[0], strconv.Itoa(login.Port)),
		User:    user,
		Auth:    auth,
		HostKey: g.trustOnFirstUse(c.ID),
	}, nil
}

// trustOnFirstUse accepts the guest's host key the first time it is seen for this container's VM
// and records it; later connections must present the same key. A guest generates its key at first
// boot, so nothing can be known in advance; a changed key means another machine answers at the
// pod IP, and is refused.
func (g *guestExecutor) trustOnFirstUse(containerID string) ssh.HostKeyCallback {
	return func(_ string, _ net.Addr, key ssh.PublicKey) error {
		presented := ssh.MarshalAuthorizedKey(key)
		// A key already pinned is compared without a write: probes log in every few seconds.
		if c, err := g.store.Containers.Get(containerID); err == nil && c.VM.SSHHostKey != "" {
			return hostKeyMatches(c.VM.SSHHostKey, presented)
		}
		_, err := g.store.Containers.Modify(containerID, func(r *store.Container) error {
			if r.VM.SSHHostKey == "" {
				r.VM.SSHHostKey = string(presented)
				return nil
			}
			return hostKeyMatches(r.VM.SSHHostKey, presented)
		})
		return err
	}
}

func hostKeyMatches(pinned string, presented []byte) error {
	if !bytes.Equal([]byte(pinned), presented) {
		return fmt.Errorf("the guest's SSH host key changed (was %s, now %s): refusing to connect",
			bytes.TrimSpace([]byte(pinned)), bytes.TrimSpace(presented))
	}
	return nil
}
