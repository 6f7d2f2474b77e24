package streaming

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"sync"
	"time"

	"golang.org/x/sys/unix"
	"golang.org/x/term"

	"github.com/cocoonstack/cocoon-cri/pkg/cocoon"
	"github.com/cocoonstack/cocoon-cri/pkg/syncio"
)

// FindConsole finds a VM's console from its hypervisor's API socket, which cocoon reports as
// socket_path. Firecracker's is console.sock beside it, served by cocoon's relay one session at a
// time. cloud-hypervisor is asked: a PTY for a direct-boot guest, the serial socket for a UEFI
// one. cocoon records neither; nothing on disk keeps the console's output.
func FindConsole(ctx context.Context, hypervisor, apiSocket string) (Opener, error) {
	if hypervisor == cocoon.HypervisorFirecracker {
		return socketOpener(filepath.Join(filepath.Dir(apiSocket), FirecrackerConsoleSocket)), nil
	}
	client := &http.Client{Transport: &http.Transport{
		DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
			var d net.Dialer
			return d.DialContext(ctx, "unix", apiSocket)
		},
	}}
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, "http://localhost/api/v1/vm.info", nil)
	if err != nil {
		return nil, err
	}
	resp, err := client.Do(req)
	if err != nil {
		return nil, fmt.Errorf("ask the hypervisor for its console: %w", err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return nil, fmt.Errorf("ask the hypervisor for its console: vm.info answered %s", resp.Status)
	}
	var info struct {
		Config struct {
			Console struct{ Mode, File string }   `json:"console"`
			Serial  struct{ Mode, Socket string } `json:"serial"`
		} `json:"config"`
	}
	if err := json.NewDecoder(resp.Body).Decode(&info); err != nil {
		return nil, fmt.Errorf("read vm.info: %w", err)
	}
	switch {
	case info.Config.Console.Mode == "Pty" && info.Config.Console.File != "":
		return ptyOpener(info.Config.Console.File), nil
	case info.Config.Serial.Mode == "Socket" && info.Config.Serial.Socket != "":
		return socketOpener(info.Config.Serial.Socket), nil
	}
	return nil, errors.New("the VM has no console cocoon-cri can read (neither a PTY nor a serial socket)")
}

// FirecrackerConsoleSocket is where cocoon serves a Firecracker VM's serial console, in the VM's
// run directory (docs/cocoon-contract.md, Console).
const FirecrackerConsoleSocket = "console.sock"

// Opener connects to a console.
type Opener func(ctx context.Context) (io.ReadWriteCloser, error)

// ptyOpener opens the PTY's terminal side in raw mode: without it the line discipline would echo
// the guest's output back to the guest as input, and hold output until a newline.
func ptyOpener(path string) Opener {
	return func(context.Context) (io.ReadWriteCloser, error) {
		// Non-blocking, so the file is under the runtime poller and Close ends a pending Read.
		f, err := os.OpenFile(path, os.O_RDWR|unix.O_NOCTTY|unix.O_NONBLOCK, 0)
		if err != nil {
			return nil, fmt.Errorf("open console %s: %w", path, err)
		}
		if _, err := term.MakeRaw(int(f.Fd())); err != nil {
			f.Close()
			return nil, fmt.Errorf("make console %s raw: %w", path, err)
		}
		return f, nil
	}
}

func socketOpener(path string) Opener {
	return func(ctx context.Context) (io.ReadWriteCloser, error) {
		var d net.Dialer
		conn, err := d.DialContext(ctx, "unix", path)
		if err != nil {
			return nil, fmt.Errorf("connect to console %s: %w", path, err)
		}
		return conn, nil
	}
}

// consoleTail is how much recent console output is kept for a look in verbose status: a kernel
// panic's trace, or a boot's last screens. It is held for every running VM.
const consoleTail = 16 << 10

// consoleRead is the console's read buffer, per running VM: a serial console delivers a few
// hundred bytes at a time.
const consoleRead = 4 << 10

// reconnectDelay paces reconnection to a console that went away (a VM restarting, a serial
// socket the hypervisor reopened).
const reconnectDelay = 500 * time.Millisecond

// Console is one VM's console as cocoon-cri owns it: one reader feeds the sink (the container log,
// or nothing) and every attached client; what clients write goes to the guest.
type Console struct {
	open Opener
	sink io.Writer
	log  *slog.Logger

	out  *Broadcast
	tail *syncio.Tail
	mu   sync.Mutex
	conn io.ReadWriteCloser
	done chan struct{}
}

// NewConsole returns a console that reads through open once Run is called.
func NewConsole(open Opener, sink io.Writer, log *slog.Logger) *Console {
	return &Console{open: open, sink: sink, log: log, out: NewBroadcast(), tail: &syncio.Tail{Max: consoleTail}, done: make(chan struct{})}
}

// Run reads the console until ctx ends, reconnecting when the connection drops.
func (c *Console) Run(ctx context.Context) {
	defer close(c.done)
	defer c.out.Close()
	for ctx.Err() == nil {
		conn, err := c.open(ctx)
		if err != nil {
			c.log.Debug("console not reachable; retrying", "err", err)
			sleepCtx(ctx, reconnectDelay)
			continue
		}
		c.setConn(conn)
		stop := context.AfterFunc(ctx, func() { conn.Close() })
		c.pump(conn)
		stop()
		c.setConn(nil)
		conn.Close()
		sleepCtx(ctx, reconnectDelay)
	}
}

// Done is closed when Run has returned.
func (c *Console) Done() <-chan struct{} { return c.done }

func (c *Console) pump(conn io.Reader) {
	buf := make([]byte, consoleRead)
	for {
		n, err := conn.Read(buf)
		if n > 0 {
			c.dispatch(buf[:n])
		}
		if err != nil {
			return
		}
	}
}

func (c *Console) dispatch(p []byte) {
	if c.sink != nil {
		if _, err := c.sink.Write(p); err != nil {
			c.log.Warn("writing the console to the container log failed", "err", err)
		}
	}
	_, _ = c.tail.Write(p)
	_, _ = c.out.Write(p)
}

func (c *Console) setConn(conn io.ReadWriteCloser) {
	c.mu.Lock()
	c.conn = conn
	c.mu.Unlock()
}

// Write sends input to the guest.
func (c *Console) Write(p []byte) (int, error) {
	c.mu.Lock()
	conn := c.conn
	c.mu.Unlock()
	if conn == nil {
		return 0, errors.New("the console is not connected")
	}
	return conn.Write(p)
}

// Subscribe returns a channel of console output from now on, and the function that ends the
// subscription. The channel is closed when the console stops.
func (c *Console) Subscribe() (<-chan []byte, func()) { return c.out.Subscribe() }

// Tail is the most recent console output.
func (c *Console) Tail() string { return c.tail.String() }

func sleepCtx(ctx context.Context, d time.Duration) {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
	case <-t.C:
	}
}
