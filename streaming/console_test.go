package streaming

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/cocoonstack/cocoon-cri/pkg/cocoon"
	"github.com/cocoonstack/cocoon-cri/pkg/syncio"
)

// openPTY makes a PTY pair the way a hypervisor does for a guest console: the hypervisor holds
// the master; the slave's path is what it reports.
func openPTY(t *testing.T) (master *os.File, slavePath string) {
	t.Helper()
	m, err := os.OpenFile("/dev/ptmx", os.O_RDWR|unix.O_NOCTTY, 0)
	if err != nil {
		t.Skipf("no /dev/ptmx: %v", err)
	}
	if err := unix.IoctlSetPointerInt(int(m.Fd()), unix.TIOCSPTLCK, 0); err != nil {
		t.Fatal(err)
	}
	n, err := unix.IoctlGetInt(int(m.Fd()), unix.TIOCGPTN)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { m.Close() })
	return m, fmt.Sprintf("/dev/pts/%d", n)
}

func eventually(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

func TestConsoleOverAPTY(t *testing.T) {
	guest, slave := openPTY(t)
	sink := &syncio.Tail{Max: 1 << 20}
	c := NewConsole(ptyOpener(slave), sink, slog.New(slog.DiscardHandler))
	ctx, cancel := context.WithCancel(context.Background())
	go c.Run(ctx)
	defer func() { cancel(); <-c.Done() }()

	out, detach := c.Subscribe()
	defer detach()
	eventually(t, "the console to connect", func() bool { _, err := c.Write(nil); return err == nil })

	// The guest prints; the sink and the attached client both see it.
	fmt.Fprint(guest, "login: ")
	eventually(t, "guest output in the sink", func() bool { return sink.String() == "login: " })
	if got := string(<-out); got != "login: " {
		t.Fatalf("attached client got %q", got)
	}
	// A client types; the guest reads it, and nothing is echoed back into the guest's output.
	if _, err := c.Write([]byte("root\n")); err != nil {
		t.Fatal(err)
	}
	buf := make([]byte, 64)
	n, err := guest.Read(buf)
	if err != nil || string(buf[:n]) != "root\n" {
		t.Fatalf("the guest read %q, %v", buf[:n], err)
	}
	time.Sleep(100 * time.Millisecond)
	if got := sink.String(); got != "login: " {
		t.Fatalf("input was echoed into the console output: %q", got)
	}
	if !strings.Contains(c.Tail(), "login: ") {
		t.Fatalf("tail %q", c.Tail())
	}
}

func TestConsoleReconnectsAndClosesSubscribersWhenStopped(t *testing.T) {
	var mu sync.Mutex
	var guests []net.Conn
	open := func(context.Context) (io.ReadWriteCloser, error) {
		ours, theirs := net.Pipe()
		mu.Lock()
		guests = append(guests, theirs)
		mu.Unlock()
		return ours, nil
	}
	latest := func() net.Conn {
		mu.Lock()
		defer mu.Unlock()
		return guests[len(guests)-1]
	}
	sink := &syncio.Tail{Max: 1 << 20}
	c := NewConsole(open, sink, slog.New(slog.DiscardHandler))
	ctx, cancel := context.WithCancel(context.Background())
	go c.Run(ctx)
	eventually(t, "a connection", func() bool { mu.Lock(); defer mu.Unlock(); return len(guests) == 1 })
	if _, err := latest().Write([]byte("one\n")); err != nil {
		t.Fatal(err)
	}
	latest().Close() // the console goes away (the hypervisor reopened its socket)
	eventually(t, "a reconnection", func() bool { mu.Lock(); defer mu.Unlock(); return len(guests) == 2 })
	if _, err := latest().Write([]byte("two\n")); err != nil {
		t.Fatal(err)
	}
	eventually(t, "output from both connections", func() bool { return sink.String() == "one\ntwo\n" })

	out, _ := c.Subscribe()
	cancel()
	<-c.Done()
	if _, open := <-out; open {
		t.Fatal("a subscriber's channel stayed open after the console stopped")
	}
	late, _ := c.Subscribe()
	if _, open := <-late; open {
		t.Fatal("a subscription after the stop got an open channel")
	}
}

func TestFindConsoleAsksTheHypervisor(t *testing.T) {
	for name, tc := range map[string]struct {
		info string
		pty  bool
	}{
		"direct boot": {`{"config":{"console":{"mode":"Pty","file":"/dev/pts/77"},"serial":{"mode":"Off"}}}`, true},
		"uefi":        {`{"config":{"console":{"mode":"Off"},"serial":{"mode":"Socket","socket":"/run/x/console.sock"}}}`, false},
	} {
		t.Run(name, func(t *testing.T) {
			sock := filepath.Join(t.TempDir(), "api.sock")
			ln, err := net.Listen("unix", sock)
			if err != nil {
				t.Fatal(err)
			}
			srv := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				if r.URL.Path != "/api/v1/vm.info" {
					http.NotFound(w, r)
					return
				}
				fmt.Fprint(w, tc.info)
			})}
			go srv.Serve(ln)
			defer srv.Close()
			open, err := FindConsole(context.Background(), cocoon.HypervisorCloudHypervisor, sock)
			if err != nil {
				t.Fatal(err)
			}
			// The opener targets what vm.info named; opening it fails here, naming the path.
			_, err = open(context.Background())
			want := "/run/x/console.sock"
			if tc.pty {
				want = "/dev/pts/77"
			}
			if err == nil || !strings.Contains(err.Error(), want) {
				t.Fatalf("opener error %v, want it to name %s", err, want)
			}
		})
	}
}

// Firecracker has no vm.info: its console is cocoon's relay on console.sock beside the API socket,
// which nobody asks.
func TestFindConsoleOfFirecrackerIsTheRelayBesideTheAPISocket(t *testing.T) {
	dir := t.TempDir()
	ln, err := net.Listen("unix", filepath.Join(dir, FirecrackerConsoleSocket))
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	go func() {
		conn, err := ln.Accept()
		if err == nil {
			fmt.Fprint(conn, "guest output")
			conn.Close()
		}
	}()
	open, err := FindConsole(context.Background(), cocoon.HypervisorFirecracker, filepath.Join(dir, "api.sock"))
	if err != nil {
		t.Fatal(err)
	}
	conn, err := open(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	got, err := io.ReadAll(conn)
	if err != nil || string(got) != "guest output" {
		t.Fatalf("read %q, %v from the relay; want its output", got, err)
	}
}
