// Package cocoon runs the cocoon CLI. It is the only place that knows cocoon's command lines, output
// formats and quirks (docs/cocoon-contract.md): every call is an argv with a timeout, stdout
// and stderr are kept apart, "No ... found." means an empty list, and failures come back as
// *CommandError values that callers test with errors.Is against ErrNotFound, ErrAlreadyExists,
// ErrInUse, ErrInvalid and ErrUnsupported.
package cocoon

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/exec"
	"slices"
	"strings"
	"syscall"
	"time"

	"golang.org/x/sys/unix"

	"github.com/cocoonstack/cocoon-cri/pkg/faultpoint"
	"github.com/cocoonstack/cocoon-cri/pkg/syncio"
	"github.com/cocoonstack/cocoon-cri/pkg/waittime"
)

// DefaultTimeout bounds a cocoon call whose caller gives no shorter deadline. cocoon commands are
// short processes; the long ones (imports, pulls) take an explicit timeout from the caller.
const DefaultTimeout = 2 * time.Minute

// Options configures a Client. The directory flags are passed to every call: cocoon keeps all its
// databases under the root dir and new VMs take the run and log dirs of the call that made them.
type Options struct {
	Binary     string
	RootDir    string
	RunDir     string
	LogDir     string
	CNIConfDir string
	CNIBinDir  string
	// DNS is the guest resolver list (cocoon's --dns); empty keeps cocoon's default.
	DNS []string
	// Timeout overrides DefaultTimeout.
	Timeout time.Duration
	// MaxCalls bounds the cocoon commands running at once (0: no bound), beyond the long ones
	// (transfers, a stop's grace period). Every cocoon command takes an exclusive flock on the
	// databases it reads, and a waiter retries it every few milliseconds: fifty commands at once
	// on two cores spend the CPUs polling the lock (docs/profiles.md). A call waits for a slot
	// before its timeout starts.
	MaxCalls int
	// CapabilitiesFile, when set, keeps the capability probe's answer across restarts: the
	// probe's eight cocoon calls become one (the version) while cocoon, its version and
	// cocoon-cri's own executable stay the same.
	CapabilitiesFile string
	Logger           *slog.Logger
	// Observe, when set, is told the duration and outcome of every call, by subcommand ("vm clone").
	Observe func(subcommand string, took time.Duration, err error)
}

// Client runs cocoon commands. It is safe for concurrent use and cheap to copy with With*.
type Client struct {
	opts Options
	// slots holds a token per running bounded call; nil when MaxCalls is 0. Copies share it.
	slots chan struct{}
}

// New returns a client for the cocoon binary in opts.
func New(opts Options) *Client {
	if opts.Binary == "" {
		opts.Binary = "cocoon"
	}
	if opts.Timeout <= 0 {
		opts.Timeout = DefaultTimeout
	}
	if opts.Logger == nil {
		opts.Logger = slog.New(slog.DiscardHandler)
	}
	c := &Client{opts: opts}
	if opts.MaxCalls > 0 {
		c.slots = make(chan struct{}, opts.MaxCalls)
	}
	return c
}

// Binary is the cocoon executable the client runs.
func (c *Client) Binary() string { return c.opts.Binary }

// WithNetwork returns a client whose calls use other CNI directories and guest DNS servers. Empty
// values keep the receiver's. cocoon reads the CNI directories on create, clone, start and rm (for
// CNI DEL), so every call on one VM must use the same ones.
func (c *Client) WithNetwork(cniConfDir, cniBinDir string, dns []string) *Client {
	o := c.opts
	if cniConfDir != "" {
		o.CNIConfDir = cniConfDir
	}
	if cniBinDir != "" {
		o.CNIBinDir = cniBinDir
	}
	if len(dns) > 0 {
		o.DNS = dns
	}
	return &Client{opts: o, slots: c.slots}
}

func (c *Client) globalArgs() []string {
	var args []string
	add := func(flag, value string) {
		if value != "" {
			args = append(args, flag, value)
		}
	}
	add("--root-dir", c.opts.RootDir)
	add("--run-dir", c.opts.RunDir)
	add("--log-dir", c.opts.LogDir)
	add("--cni-conf-dir", c.opts.CNIConfDir)
	add("--cni-bin-dir", c.opts.CNIBinDir)
	add("--dns", strings.Join(c.opts.DNS, ","))
	return args
}

// call is one invocation.
type call struct {
	args    []string
	stdin   io.Reader
	timeout time.Duration
	// stdout, when set, receives the command's output as it comes (an export); run then returns
	// no bytes.
	stdout io.Writer
	// env is added to cocoon-cri's environment for this call only.
	env []string
	// long marks a call that lasts as long as its work (a transfer, a stop's grace period): it
	// takes no slot, since it would hold one for minutes while holding cocoon's locks briefly.
	long bool
}

// maxStderr bounds what is kept of a command's log output; the error line is at the end.
const maxStderr = 64 << 10

// command prepares cocoon with the global flags and args. It runs in its own process group, which
// cancelling ctx kills whole, so a timeout also stops whatever cocoon started in the foreground.
func (c *Client) command(ctx context.Context, args []string) *exec.Cmd {
	cmd := exec.CommandContext(ctx, c.opts.Binary, append(c.globalArgs(), args...)...)
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	cmd.Cancel = func() error { return syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL) }
	// A child that keeps our pipes open must not hang the call after cocoon itself exited.
	cmd.WaitDelay = 5 * time.Second
	return cmd
}

// run executes the call and returns stdout; a timeout also stops what cocoon started in the
// foreground (qemu-img, mkfs).
func (c *Client) run(ctx context.Context, cl call) ([]byte, error) {
	timeout := cl.timeout
	if timeout <= 0 {
		timeout = c.opts.Timeout
	}
	// Waiting for a slot is waiting on cocoon: its commands already running.
	waited := waittime.Begin(ctx)
	defer waited()
	queuedAt := time.Now()
	release, err := c.takeSlot(ctx, cl)
	if err != nil {
		return nil, err
	}
	defer release()
	queued := time.Since(queuedAt)
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()

	cmd := c.command(ctx, cl.args)
	if cl.stdin != nil {
		cmd.Stdin = largeWrites{cl.stdin}
	}
	if len(cl.env) > 0 {
		cmd.Env = append(os.Environ(), cl.env...)
	}
	var stdout bytes.Buffer
	stderr := &syncio.Tail{Max: maxStderr}
	cmd.Stdout = &stdout
	if cl.stdout != nil {
		cmd.Stdout = cl.stdout
	}
	cmd.Stderr = stderr

	sub := subcommand(cl.args)
	faultpoint.Hit("cocoon " + sub + "/before")
	start := time.Now()
	err = cmd.Run()
	waited()
	took := time.Since(start)
	faultpoint.Hit("cocoon " + sub + "/after")
	if err != nil {
		err = c.commandError(ctx, cl.args, cmd, err, stderr.String())
	}
	if c.opts.Observe != nil {
		c.opts.Observe(sub, took, err)
	}
	if err != nil {
		c.opts.Logger.Debug("cocoon call failed", "args", cl.args, "queued", queued, "took", took, "err", err)
		return nil, err
	}
	c.opts.Logger.Debug("cocoon call", "args", cl.args, "queued", queued, "took", took)
	return stdout.Bytes(), nil
}

// takeSlot waits until the call may run and returns what frees its slot.
func (c *Client) takeSlot(ctx context.Context, cl call) (release func(), err error) {
	if c.slots == nil || cl.long {
		return func() {}, nil
	}
	select {
	case c.slots <- struct{}{}:
		return func() { <-c.slots }, nil
	case <-ctx.Done():
		return nil, &CommandError{Args: cl.args, ExitCode: -1, Err: fmt.Errorf("waiting for one of the %d cocoon calls running to end: %w", cap(c.slots), ctx.Err())}
	}
}

func (c *Client) commandError(ctx context.Context, args []string, cmd *exec.Cmd, runErr error, stderr string) error {
	ce := &CommandError{Args: args, ExitCode: -1, Err: runErr}
	if cmd.ProcessState != nil {
		ce.ExitCode = cmd.ProcessState.ExitCode()
	}
	if ctxErr := ctx.Err(); ctxErr != nil {
		// The deadline or cancellation is the cause; the "signal: killed" exit is its effect.
		ce.Err = ctxErr
		return ce
	}
	ce.Message = errorMessage(stderr)
	ce.Kind = classify(ce.Message)
	return ce
}

// subcommand names a call for logs and metrics: the words before the first flag or argument that
// is not a command name ("vm clone", "snapshot import").
func subcommand(args []string) string {
	n := 0
	for n < len(args) && n < 2 && !strings.HasPrefix(args[n], "-") {
		n++
	}
	sub := strings.Join(args[:n], " ")
	// The capability probe's help calls are not the commands they describe.
	if slices.Contains(args, "--help") {
		sub += " --help"
	}
	return sub
}

// emptyList reports cocoon's plain-text empty-list answer ("No VMs found.", "No images found.",
// "No snapshots found.", "No snapshots found for VM."), printed even with -o json.
func emptyList(out []byte) bool {
	s := strings.TrimSpace(string(out))
	return strings.HasPrefix(s, "No ") && strings.Contains(s, " found")
}

// query runs a command that prints one JSON object (inspect, or a lifecycle command with -o json).
func query[T any](ctx context.Context, c *Client, args ...string) (*T, error) {
	out, err := c.run(ctx, call{args: args})
	if err != nil {
		return nil, err
	}
	var item T
	if err := json.Unmarshal(bytes.TrimSpace(out), &item); err != nil {
		return nil, fmt.Errorf("cocoon %s: decode output: %w", strings.Join(args, " "), err)
	}
	return &item, nil
}

// queryList runs a list command with -o json.
func queryList[T any](ctx context.Context, c *Client, args ...string) ([]T, error) {
	args = append(args, "-o", "json")
	out, err := c.run(ctx, call{args: args})
	if err != nil {
		return nil, err
	}
	if emptyList(out) {
		return nil, nil
	}
	var items []T
	if err := json.Unmarshal(out, &items); err != nil {
		return nil, fmt.Errorf("cocoon %s: decode output: %w", strings.Join(args, " "), err)
	}
	return items, nil
}

// Sizes of what feeds a command's stdin: the pipe, and each write into it.
const (
	stdinPipeSize  = 1 << 20
	stdinWriteSize = 1 << 20
)

// largeWrites feeds a command's stdin in large writes through an enlarged pipe. exec would copy
// the reader 32 KiB at a time into a 64 KiB pipe, and an image of gigabytes then goes by in
// context switches between cocoon-cri and cocoon.
type largeWrites struct{ r io.Reader }

func (l largeWrites) Read(p []byte) (int, error) { return l.r.Read(p) }

// WriteTo is what exec's copy calls, with the pipe to the command.
func (l largeWrites) WriteTo(w io.Writer) (int64, error) {
	if f, ok := w.(*os.File); ok {
		if raw, err := f.SyscallConn(); err == nil {
			// Best effort: a pipe left at its default size only costs speed.
			_ = raw.Control(func(fd uintptr) { _, _ = unix.FcntlInt(fd, unix.F_SETPIPE_SZ, stdinPipeSize) })
		}
	}
	// Bare interfaces: *os.File's ReadFrom would copy 32 KiB at a time again.
	return io.CopyBuffer(struct{ io.Writer }{w}, struct{ io.Reader }{l.r}, make([]byte, stdinWriteSize))
}
