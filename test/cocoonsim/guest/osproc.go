package guest

import (
	"fmt"
	"io"
	"net"
	"os"
	"strconv"

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
)

// runGuestOS is the simulated guest operating system. The hypervisor starts it in a network and
// a UTS namespace of its own: the namespace's kernel stack is the guest's (its interfaces, ARP,
// ICMP), and a hostname set in the guest stays in the guest.
func runGuestOS() int {
	lifeline := os.NewFile(lifelineFD, "lifeline")
	ready := os.NewFile(readyFD, "ready")
	report := func(format string, args ...any) {
		_, _ = fmt.Fprintf(ready, format+"\n", args...)
		_ = ready.Close()
	}
	if name := os.Getenv(hostnameEnv); name != "" {
		if err := unix.Sethostname([]byte(name)); err != nil {
			report("error: sethostname %q: %v", name, err)
			return 1
		}
	}
	ln, err := net.Listen("tcp", ":"+strconv.Itoa(ProbePort))
	if err != nil {
		report("error: listen on probe port: %v", err)
		return 1
	}
	report("ok")
	go serveProbes(ln)
	_, _ = io.Copy(io.Discard, lifeline)
	return 0
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
