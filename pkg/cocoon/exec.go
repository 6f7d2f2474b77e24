package cocoon

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os/exec"
	"sort"
	"strings"
	"time"

	"github.com/cocoonstack/cocoon-cri/pkg/syncio"
	"github.com/cocoonstack/cocoon-cri/pkg/waittime"
)

// ExecOptions are the streams and environment of a command run in a guest.
type ExecOptions struct {
	Env map[string]string
	// Stdin, when set, is attached to the command (vm exec -i); otherwise its stdin closes at once.
	Stdin  io.Reader
	Stdout io.Writer
	Stderr io.Writer
}

// execUsage starts the usage line of vm exec's help.
const execUsage = "cocoon vm exec [flags] VM"

// VMExec runs argv in the guest through cocoon's guest agent and returns the command's exit code.
// The streams are copied as the command runs. A failure of cocoon itself (VM not running, agent not
// up yet) is an error; the command's own non-zero exit is not. Cancelling ctx kills cocoon, which
// ends the guest command.
func (c *Client) VMExec(ctx context.Context, id string, argv []string, o ExecOptions) (int, error) {
	if len(argv) == 0 {
		return 0, fmt.Errorf("exec in %s: no command: %w", id, ErrInvalid)
	}
	args := []string{"vm", "exec"}
	keys := make([]string, 0, len(o.Env))
	for k := range o.Env {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	for _, k := range keys {
		args = append(args, "--env", k+"="+o.Env[k])
	}
	args = appendIf(args, o.Stdin != nil, "--interactive")
	args = append(append(args, id, "--"), argv...)

	cmd := c.command(ctx, args)
	// The caller's stdin is copied by our own goroutine, not exec's: exec waits for its copier,
	// which blocks in Read on a stream the client holds open (an idle terminal) long after the
	// command has exited. Wait closes the pipe; the copier then ends at the client's next read.
	var stdin io.WriteCloser
	if o.Stdin != nil {
		var err error
		if stdin, err = cmd.StdinPipe(); err != nil {
			return -1, fmt.Errorf("exec in %s: %w", id, err)
		}
	}
	// cocoon's own error line arrives on the same stream as the command's stderr; the tail tells
	// them apart.
	tail := &syncio.Tail{Max: 4 << 10}
	stderr := io.Writer(tail)
	var userStderr *cocoonErrorFilter
	if o.Stderr != nil {
		userStderr = &cocoonErrorFilter{w: o.Stderr}
		stderr = io.MultiWriter(userStderr, tail)
	}
	streams := syncio.Serialize(o.Stdout, stderr)
	cmd.Stdout, cmd.Stderr = streams[0], streams[1]

	start := time.Now()
	waited := waittime.Begin(ctx)
	defer waited()
	err := cmd.Start()
	if err == nil {
		if stdin != nil {
			go func() {
				_, _ = io.Copy(stdin, o.Stdin)
				_ = stdin.Close()
			}()
		}
		err = cmd.Wait()
	}
	if userStderr != nil {
		// Wait has copied everything; what the filter held back is decided now.
		_ = userStderr.Close()
	}
	if c.opts.Observe != nil {
		c.opts.Observe("vm exec", time.Since(start), err)
	}
	if err == nil {
		return 0, nil
	}
	if ctxErr := ctx.Err(); ctxErr != nil {
		return -1, &CommandError{Args: args, ExitCode: -1, Err: ctxErr}
	}
	var exit *exec.ExitError
	if !errors.As(err, &exit) {
		return -1, &CommandError{Args: args, ExitCode: -1, Err: err}
	}
	if msg, ok := cocoonExecError(tail.String()); ok {
		return -1, &CommandError{Args: args, ExitCode: exit.ExitCode(), Message: msg, Kind: classifyExec(msg), Err: err}
	}
	return exit.ExitCode(), nil
}

// cocoonExecError finds cocoon's own failure in the stderr tail: cobra's "Error: " line, which
// cocoon suppresses when it only passes the command's exit code on. cocoon words every exec
// failure "exec: ...", or fails earlier resolving the VM; a command that prints "Error: ..." itself
// is not mistaken for cocoon.
func cocoonExecError(stderr string) (string, bool) {
	lines := strings.Split(strings.TrimRight(StripANSI(stderr), "\n"), "\n")
	msg, ok := strings.CutPrefix(strings.TrimSpace(lines[len(lines)-1]), "Error: ")
	if !ok {
		return "", false
	}
	return msg, strings.HasPrefix(msg, "exec:") || classifyExec(msg) != nil
}

// Exec failures of cocoon itself that say something about the guest.
var (
	// ErrAgentStarting: the guest agent does not answer yet (a booting guest, or one without the
	// agent); retry shortly.
	ErrAgentStarting = errors.New("guest agent not up yet")
	// ErrNoVsock: the VM has no vsock device (made by a cocoon without agent support), so no
	// agent can ever answer.
	ErrNoVsock = errors.New("the VM has no vsock device")
)

func classifyExec(msg string) error {
	switch {
	case strings.Contains(msg, "dial agent"):
		return ErrAgentStarting
	case strings.Contains(msg, "vsock not configured"):
		return ErrNoVsock
	case strings.Contains(msg, "unknown command"):
		return ErrUnsupported
	}
	return classify(msg)
}
