package qemu_test

import (
	"bufio"
	"context"
	"net"
	"net/netip"
	"os"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/cocoonstack/cocoon-cri/test/cocoonsim/qemu"
	"github.com/cocoonstack/cocoon-cri/test/realguest"
)

// Deadlines are generous: under TCG on a busy two-core machine a boot takes seconds and varies.
// They bound a broken run; nothing here measures time.
const (
	bootDeadline  = 3 * time.Minute
	netDeadline   = time.Minute
	powerDeadline = 2 * time.Minute
)

// A real guest on a pod network: it boots from cocoon's direct-boot command line, configures
// itself from ip=, answers ping and TCP from the node, shows its configured MAC to the node's
// neighbour table, and powers off on the ACPI power button, leaving nothing behind.
func TestGuestOnPodNetwork(t *testing.T) {
	requireRoot(t)
	g := realguest.ForTest(t)
	sockets := socketDir(t)
	pod := newNamespaces(t)
	pod.wire(t, "vnet_hdr", "one_queue")

	const hostname = "realguest-pod"
	dns := netip.MustParseAddr("10.77.0.53")
	console := &consoleLog{changed: make(chan struct{}, 1)}
	started := time.Now()
	p := start(t, pod, qemu.Config{
		Kernel:    g.Kernel,
		Initrd:    g.Initrd,
		Cmdline:   realguest.Cmdline + " " + realguest.IPArgs(hostname, guestAddr, nodeAddr.Addr(), dns),
		MemoryMiB: 256,
		NICs:      []qemu.NIC{{TAP: pod.tap, MAC: pod.mac}},
		Console:   console,
	}, console)

	ready := console.await(t, p, realguest.ReadyMarker, bootDeadline)
	t.Logf("guest ready %s after Run", time.Since(started).Round(time.Millisecond))
	want := hostname + " " + guestAddr.Addr().String()
	if ready != realguest.ReadyMarker+" "+want {
		t.Fatalf("ready line %q, want %q", ready, realguest.ReadyMarker+" "+want)
	}
	if !strings.Contains(console.String(), realguest.NameserversMarker+" "+dns.String()+"\r\n") {
		t.Errorf("the guest did not take its nameserver %s from ip=", dns)
	}

	// busybox ping exits 0 once a reply came back within its deadline.
	inNS(t, pod.nodeNS, realguest.Busybox, "ping", "-c", "3", "-w", strconv.Itoa(int(netDeadline.Seconds())), guestAddr.Addr().String())

	if got := readServiceLine(t, pod); got != want {
		t.Errorf("guest service said %q, want %q", got, want)
	}
	if got := pod.neighbourMAC(t, guestAddr.Addr()); got != pod.mac {
		t.Errorf("node sees the guest at MAC %s, want the configured %s", got, pod.mac)
	}

	ctx, cancel := context.WithTimeout(context.Background(), powerDeadline)
	defer cancel()
	if err := p.PowerOff(ctx); err != nil {
		t.Fatalf("graceful power-off: %v", err)
	}
	if !strings.Contains(console.String(), realguest.PowerOffMarker) {
		t.Error("QEMU exited, but not through the guest's power-button handler")
	}
	assertNothingLeft(t, pod, sockets)
}

// QEMU that cannot start reports why, and a killed one is gone at once; neither leaves a
// process or its control socket behind.
func TestStartFailureAndKillLeaveNothing(t *testing.T) {
	requireRoot(t)
	g := realguest.ForTest(t)
	sockets := socketDir(t)
	pod := newNamespaces(t)
	pod.wire(t, "vnet_hdr", "one_queue")
	cfg := qemu.Config{
		Kernel:  g.Kernel,
		Initrd:  g.Initrd,
		Cmdline: realguest.Cmdline,
		NICs:    []qemu.NIC{{TAP: pod.tap, MAC: pod.mac}},
	}
	p := start(t, pod, cfg, nil)

	// A single-queue TAP takes one opener: a second VM on it cannot start.
	var err error
	inNetNS(t, pod.vmNS, func() {
		ctx, cancel := context.WithTimeout(context.Background(), bootDeadline)
		defer cancel()
		var second *qemu.Process
		if second, err = qemu.Run(ctx, cfg); err == nil {
			_ = second.Kill()
		}
	})
	if err == nil || !strings.Contains(err.Error(), pod.tap) {
		t.Errorf("second VM on %s: error %v, want one naming the TAP", pod.tap, err)
	}
	t.Logf("second VM: %v", err)

	if err := p.Kill(); err != nil {
		t.Fatal(err)
	}
	select {
	case <-p.Done():
	default:
		t.Fatal("Kill returned before QEMU was gone")
	}
	if err := p.Wait(); err == nil {
		t.Error("a killed QEMU reported a clean exit")
	}
	assertNothingLeft(t, pod, sockets)
}

// start runs the VM in the pod's VM namespace and kills it when the test ends, logging the
// console of a failed test.
func start(t *testing.T, pod *podNetwork, cfg qemu.Config, console *consoleLog) *qemu.Process {
	t.Helper()
	var p *qemu.Process
	var err error
	inNetNS(t, pod.vmNS, func() {
		ctx, cancel := context.WithTimeout(context.Background(), bootDeadline)
		defer cancel()
		p, err = qemu.Run(ctx, cfg)
	})
	if err != nil {
		t.Fatalf("start QEMU: %v", err)
	}
	t.Cleanup(func() {
		if err := p.Kill(); err != nil {
			t.Errorf("kill QEMU %d: %v", p.PID(), err)
		}
		if t.Failed() && console != nil {
			t.Logf("guest console:\n%s", console.String())
		}
	})
	return p
}

// readServiceLine connects from the node namespace to the guest's service and reads its line.
func readServiceLine(t *testing.T, pod *podNetwork) string {
	t.Helper()
	addr := net.JoinHostPort(guestAddr.Addr().String(), strconv.Itoa(realguest.ServicePort))
	var conn net.Conn
	var err error
	// The socket is created in the namespace of the thread that dials, and stays there.
	inNetNS(t, pod.nodeNS, func() { conn, err = net.DialTimeout("tcp", addr, netDeadline) })
	if err != nil {
		t.Fatalf("connect to the guest at %s: %v", addr, err)
	}
	defer conn.Close()
	_ = conn.SetReadDeadline(time.Now().Add(netDeadline))
	line, err := bufio.NewReader(conn).ReadString('\n')
	if err != nil {
		t.Fatalf("read from the guest's service: %v (got %q)", err, line)
	}
	return strings.TrimSpace(line)
}

// socketDir points QEMU's private socket directories at a directory of the test's own, so the
// test can see that none is left.
func socketDir(t *testing.T) string {
	dir := t.TempDir()
	t.Setenv("TMPDIR", dir)
	return dir
}

func assertNothingLeft(t *testing.T, pod *podNetwork, sockets string) {
	t.Helper()
	if pids := processesMentioning(t, pod.tap); len(pids) > 0 {
		t.Errorf("processes still running for %s: %v", pod.tap, pids)
	}
	entries, err := os.ReadDir(sockets)
	if err != nil {
		t.Fatal(err)
	}
	for _, e := range entries {
		t.Errorf("left behind in %s: %s", sockets, e.Name())
	}
}

// consoleLog is the console sink: it keeps everything and wakes whoever waits for a line.
type consoleLog struct {
	mu      sync.Mutex
	buf     strings.Builder
	changed chan struct{}
}

func (c *consoleLog) Write(b []byte) (int, error) {
	c.mu.Lock()
	c.buf.Write(b)
	c.mu.Unlock()
	select {
	case c.changed <- struct{}{}:
	default:
	}
	return len(b), nil
}

func (c *consoleLog) String() string {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.buf.String()
}

// await returns the first complete console line that starts with prefix, failing the test if
// the guest reports a failure, QEMU exits, or the deadline passes first.
func (c *consoleLog) await(t *testing.T, p *qemu.Process, prefix string, deadline time.Duration) string {
	t.Helper()
	timeout := time.After(deadline)
	for {
		for line := range strings.Lines(c.String()) {
			if !strings.HasSuffix(line, "\n") {
				break // still being written
			}
			line = strings.TrimRight(line, "\r\n")
			if strings.HasPrefix(line, realguest.FailedMarker) {
				t.Fatalf("guest: %s", line)
			}
			if strings.HasPrefix(line, prefix) {
				return line
			}
		}
		select {
		case <-c.changed:
		case <-p.Done():
			t.Fatalf("QEMU exited before %q: %v", prefix, p.Wait())
		case <-timeout:
			t.Fatalf("no %q on the console within %s", prefix, deadline)
		}
	}
}
