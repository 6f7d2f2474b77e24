package guest

import (
	"errors"
	"fmt"
	"net"
	"os"
	"strconv"
	"strings"
	"time"
)

// VsockSocketName is the VM's hybrid vsock socket in its run dir (cocoon's
// hypervisor.VsockSockName), where cloud-hypervisor exposes the guest's virtio-vsock device.
const VsockSocketName = "vsock.uds"

const (
	// connectLineMax bounds the handshake line, as cocoon bounds the reply.
	connectLineMax = 64
	// connectTimeout drops a client that never sends its CONNECT line.
	connectTimeout = 10 * time.Second
)

// vsockGuest is a guest OS that has a virtio-vsock device: it takes over a host connection to
// one of its ports, or refuses it (no listener there) by closing it.
type vsockGuest interface {
	connectVsock(port uint32, conn *net.UnixConn)
}

// listenVsock opens the hybrid vsock socket at path. The VM's vsock device exists from
// the start; whether anything in the guest answers is another matter.
func (v *vmm) listenVsock(path string) (net.Listener, error) {
	if err := os.Remove(path); err != nil && !errors.Is(err, os.ErrNotExist) {
		return nil, fmt.Errorf("remove stale %s: %w", path, err)
	}
	ln, err := net.Listen("unix", path)
	if err != nil {
		return nil, fmt.Errorf("listen %s: %w", path, err)
	}
	go func() {
		for {
			conn, err := ln.Accept()
			if err != nil {
				return
			}
			go v.connectVsock(conn.(*net.UnixConn))
		}
	}()
	return ln, nil
}

// connectVsock is cloud-hypervisor's hybrid vsock handshake: the host sends "CONNECT <port>\n"
// and is connected to that port of the guest; if the guest is not running, or nothing in it
// listens on the port, the connection is closed without a reply.
func (v *vmm) connectVsock(conn *net.UnixConn) {
	port, err := readConnectLine(conn)
	if err != nil {
		v.logger.Printf("vsock: %v", err)
		_ = conn.Close()
		return
	}
	v.mu.Lock()
	g, ok := v.os.(vsockGuest)
	v.mu.Unlock()
	if !ok {
		_ = conn.Close()
		return
	}
	g.connectVsock(port, conn)
}

// readConnectLine reads the handshake a byte at a time: whatever follows it belongs to the guest.
func readConnectLine(conn *net.UnixConn) (uint32, error) {
	_ = conn.SetReadDeadline(time.Now().Add(connectTimeout))
	defer conn.SetReadDeadline(time.Time{}) //nolint:errcheck
	var line []byte
	b := make([]byte, 1)
	for b[0] != '\n' {
		if len(line) == connectLineMax {
			return 0, fmt.Errorf("CONNECT line longer than %d bytes", connectLineMax)
		}
		if _, err := conn.Read(b); err != nil {
			return 0, fmt.Errorf("read CONNECT line: %w", err)
		}
		line = append(line, b[0])
	}
	portText, ok := strings.CutPrefix(strings.TrimSpace(string(line)), "CONNECT ")
	if !ok {
		return 0, fmt.Errorf("want CONNECT <port>, got %q", line)
	}
	port, err := strconv.ParseUint(portText, 10, 32)
	if err != nil {
		return 0, fmt.Errorf("CONNECT port %q: %w", portText, err)
	}
	return uint32(port), nil
}
