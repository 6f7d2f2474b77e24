package streaming

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"strings"
	"sync/atomic"
	"time"

	"golang.org/x/crypto/ssh"
	"k8s.io/cri-streaming/pkg/streaming/remotecommand"

	"github.com/cocoonstack/cocoon-cri/pkg/syncio"
)

// SSHTarget is a guest's sshd and how to log in to it.
type SSHTarget struct {
	Addr    string // host:port
	User    string
	Auth    []ssh.AuthMethod
	HostKey ssh.HostKeyCallback
}

// ExecIO are a command's streams. With TTY the command gets a terminal, its stderr is its stdout,
// and Resize carries the terminal's size changes.
type ExecIO struct {
	Stdin  io.Reader
	Stdout io.Writer
	Stderr io.Writer
	TTY    bool
	Resize <-chan remotecommand.TerminalSize
}

// sshDialTimeout bounds reaching a guest's sshd.
const sshDialTimeout = 10 * time.Second

// sshHandshakeTimeout bounds the SSH handshake and login, whatever the caller's context: a guest's
// sshd that accepts the connection and then says nothing must not hold the caller.
const sshHandshakeTimeout = 30 * time.Second

// sshKillWriteTimeout bounds sending the kill signal to a guest that does not read.
const sshKillWriteTimeout = time.Second

// SSHExec runs argv in the guest over SSH and returns its exit code. Cancelling ctx ends the
// session, at whatever step the guest is: the connection is closed, which unblocks the handshake,
// a session request and the command alike.
func SSHExec(ctx context.Context, t SSHTarget, argv []string, stdio ExecIO) (int, error) {
	d := net.Dialer{Timeout: sshDialTimeout}
	raw, err := d.DialContext(ctx, "tcp", t.Addr)
	if err != nil {
		return -1, fmt.Errorf("reach the guest's sshd at %s: %w", t.Addr, err)
	}
	defer raw.Close()
	var running atomic.Pointer[ssh.Session]
	stop := context.AfterFunc(ctx, func() {
		if session := running.Load(); session != nil {
			// The command is killed in the guest, unless the guest does not even read.
			_ = raw.SetWriteDeadline(time.Now().Add(sshKillWriteTimeout))
			_ = session.Signal(ssh.SIGKILL)
		}
		raw.Close()
	})
	defer stop()

	_ = raw.SetDeadline(time.Now().Add(sshHandshakeTimeout))
	conn, chans, reqs, err := ssh.NewClientConn(raw, t.Addr, &ssh.ClientConfig{
		User: t.User, Auth: t.Auth, HostKeyCallback: t.HostKey, Timeout: sshDialTimeout,
	})
	if err != nil {
		if ctx.Err() != nil {
			return -1, fmt.Errorf("log in to the guest at %s: %w", t.Addr, ctx.Err())
		}
		return -1, fmt.Errorf("log in to the guest at %s as %s: %w", t.Addr, t.User, err)
	}
	client := ssh.NewClient(conn, chans, reqs)
	defer client.Close()
	session, err := client.NewSession()
	if err != nil {
		return -1, fmt.Errorf("open an SSH session: %w", err)
	}
	defer session.Close()
	// Logged in: the command may run as long as the caller allows.
	_ = raw.SetDeadline(time.Time{})
	running.Store(session)

	if stdio.TTY {
		if err := session.RequestPty("xterm", 24, 80, ssh.TerminalModes{ssh.ECHO: 1}); err != nil {
			return -1, fmt.Errorf("request a terminal: %w", err)
		}
		go func() {
			for size := range stdio.Resize {
				_ = session.WindowChange(int(size.Height), int(size.Width))
			}
		}()
	}
	if stdio.Stdin != nil {
		// The session's stdin is closed when ours ends, so the command sees EOF.
		stdin, err := session.StdinPipe()
		if err != nil {
			return -1, err
		}
		go func() {
			_, _ = io.Copy(stdin, stdio.Stdin)
			stdin.Close()
		}()
	}
	streams := syncio.Serialize(stdio.Stdout, stdio.Stderr)
	session.Stdout, session.Stderr = streams[0], streams[1]
	err = session.Run(ShellQuote(argv))
	var exit *ssh.ExitError
	switch {
	case err == nil:
		return 0, nil
	case errors.As(err, &exit):
		return exit.ExitStatus(), nil
	case ctx.Err() != nil:
		return -1, ctx.Err()
	}
	return -1, fmt.Errorf("run over SSH: %w", err)
}

// ShellQuote joins argv into one shell command line with every word single-quoted: SSH and a
// guest's shell receive one string, and an argument must stay one argument.
func ShellQuote(argv []string) string {
	quoted := make([]string, len(argv))
	for i, a := range argv {
		quoted[i] = "'" + strings.ReplaceAll(a, "'", `'\''`) + "'"
	}
	return strings.Join(quoted, " ")
}
