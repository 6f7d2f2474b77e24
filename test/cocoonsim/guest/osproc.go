package guest

import (
	"bufio"
	"fmt"
	"io"
	"net"
	"os"
	"strconv"

	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"
)

// ProbePort is where every simulated guest with a network listens for TCP: a connection gets one
// line, "<hostname> <address the client reached>\n", and is closed. Tests use it to prove that a
// guest is reachable at an address (ICMP echo works too: the guest's kernel stack answers it).
const ProbePort = 8080

// File descriptors the hypervisor hands the guest OS process.
const (
	// lifelineFD is the read end of a pipe only the hypervisor writes to: its EOF means the
	// hypervisor is gone, and the guest goes with it.
	lifelineFD = 3
	// readyFD receives "ok" once the guest has its hostname and listens, or "error: ...".
	readyFD = 4
	// vsockFD is the guest's end of its virtio-vsock device (see newVsockDevice).
	vsockFD = 5
	// shmImageFD, for a guest restored with plan.RestoreShm, is the snapshot's memory file at
	// the tar of its /dev/shm.
	shmImageFD = 6
)

// runGuestOS is the simulated guest operating system. The hypervisor starts it in network, UTS,
// mount and PID namespaces of its own: the namespace's kernel stack is the guest's (its
// interfaces, ARP, ICMP), a hostname or a file set in the guest stays in the guest, and the
// process is the guest's init, so everything running in the guest ends with it.
func runGuestOS() int {
	lifeline := os.NewFile(lifelineFD, "lifeline")
	ready := os.NewFile(readyFD, "ready")
	vsockDev := os.NewFile(vsockFD, "vsock-device")
	report := func(format string, args ...any) {
		_, _ = fmt.Fprintf(ready, format+"\n", args...)
		_ = ready.Close()
	}
	if err := bootGuestServices(vsockDev); err != nil {
		report("error: %v", err)
		return 1
	}
	report("ok")
	_, _ = io.Copy(io.Discard, lifeline)
	return 0
}

// bootGuestServices does what the guest's init does before it is up: its mounts, hostname and
// loopback, then its services: the probe port, the web server and sshd when the image asks for
// them, and the agent on its vsock port.
func bootGuestServices(vsockDev *os.File) error {
	plan, err := readPlan()
	if err != nil {
		return err
	}
	if err := setupMounts(plan); err != nil {
		return err
	}
	if plan.RestoreShm {
		if err := restoreShm(); err != nil {
			return err
		}
	}
	if err := writeFsMountHelper(plan.RunDir); err != nil {
		return err
	}
	if err := writeClockShims(plan.RunDir); err != nil {
		return err
	}
	// exec.Command looks commands up in this PATH, as cocoon-agent does in its own.
	if err := os.Setenv("PATH", guestPATH); err != nil {
		return err
	}
	if err := unix.Sethostname([]byte(plan.Hostname)); err != nil {
		return fmt.Errorf("sethostname %q: %w", plan.Hostname, err)
	}
	if err := setLoopbackUp(); err != nil {
		return err
	}
	probes, err := net.Listen("tcp", ":"+strconv.Itoa(ProbePort))
	if err != nil {
		return fmt.Errorf("listen on probe port: %w", err)
	}
	go serveProbes(probes)
	if plan.HTTPPort != 0 {
		web, err := listenWeb(plan.HTTPPort)
		if err != nil {
			return err
		}
		go serveWeb(web)
	}
	r := newReaper()
	if plan.SSHDConfig != "" {
		if err := startSSHD(r, plan.SSHDConfig); err != nil {
			return err
		}
	}
	ports := vsockPorts{}
	if !plan.NoAgent {
		ports[AgentPort] = (&agent{reaper: r}).serve
	}
	go func() { _ = ports.serve(vsockDev) }()
	return nil
}

// restoreShm fills the guest's fresh /dev/shm from the snapshot's memory, before any process of
// the guest can look at it.
func restoreShm() error {
	mem := os.NewFile(shmImageFD, "memory")
	defer mem.Close() //nolint:errcheck
	if err := readTmpfs(bufio.NewReaderSize(mem, 1<<20), guestShm); err != nil {
		return fmt.Errorf("restore %s from the snapshot's memory: %w", guestShm, err)
	}
	return nil
}

func setLoopbackUp() error {
	lo, err := netlink.LinkByName("lo")
	if err != nil {
		return fmt.Errorf("find lo: %w", err)
	}
	if err := netlink.LinkSetUp(lo); err != nil {
		return fmt.Errorf("set lo up: %w", err)
	}
	return nil
}

func serveProbes(ln net.Listener) {
	for {
		conn, err := ln.Accept()
		if err != nil {
			return
		}
		go func() {
			defer conn.Close() //nolint:errcheck
			host, _ := os.Hostname()
			local, _, _ := net.SplitHostPort(conn.LocalAddr().String())
			_, _ = fmt.Fprintf(conn, "%s %s\n", host, local)
		}()
	}
}
