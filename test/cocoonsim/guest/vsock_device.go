package guest

import (
	"encoding/binary"
	"fmt"
	"net"
	"os"
	"sync/atomic"

	"golang.org/x/sys/unix"
)

// The virtio-vsock device between the hypervisor and the guest OS process is a SOCK_SEQPACKET
// socket pair. Each message is one connection for the guest: the port it is for (big-endian
// uint32) and, as SCM_RIGHTS, the host client's own socket. The guest answers on that socket
// itself, so no byte of a session passes through the hypervisor.

const vsockPortLen = 4

// newVsockDevice makes the socket pair: the hypervisor's end, and the guest's end to hand to
// the guest OS process.
func newVsockDevice() (host *net.UnixConn, guestEnd *os.File, err error) {
	fds, err := unix.Socketpair(unix.AF_UNIX, unix.SOCK_SEQPACKET|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		return nil, nil, fmt.Errorf("vsock device: %w", err)
	}
	hostFile := os.NewFile(uintptr(fds[0]), "vsock-device")
	defer hostFile.Close() //nolint:errcheck
	c, err := net.FileConn(hostFile)
	if err != nil {
		_ = unix.Close(fds[1])
		return nil, nil, fmt.Errorf("vsock device: %w", err)
	}
	return c.(*net.UnixConn), os.NewFile(uintptr(fds[1]), "vsock-device-guest"), nil
}

// deliverVsock passes a host connection for port to the guest and lets go of it here. If the
// guest is gone, the connection simply closes.
func deliverVsock(dev *net.UnixConn, port uint32, conn *net.UnixConn) {
	defer conn.Close() //nolint:errcheck
	f, err := conn.File()
	if err != nil {
		return
	}
	defer f.Close() //nolint:errcheck
	msg := binary.BigEndian.AppendUint32(nil, port)
	_, _, _ = dev.WriteMsgUnix(msg, unix.UnixRights(int(f.Fd())), nil)
}

// vsockPorts is the guest side of the device: its listening ports.
type vsockPorts map[uint32]func(net.Conn)

// hostPortCounter numbers the host ends in the "OK <port>" reply, as the hybrid vsock device
// gives each host connection a local port of its own.
var hostPortCounter atomic.Uint32

// serve accepts connections from the device until it closes (the hypervisor is gone). A
// connection for a port nobody listens on is refused by closing it; one that is accepted gets
// cloud-hypervisor's "OK <port>\n" and goes to the port's handler.
func (ports vsockPorts) serve(dev *os.File) error {
	c, err := net.FileConn(dev)
	_ = dev.Close()
	if err != nil {
		return fmt.Errorf("vsock device: %w", err)
	}
	uc := c.(*net.UnixConn)
	defer uc.Close() //nolint:errcheck
	msg := make([]byte, vsockPortLen)
	oob := make([]byte, unix.CmsgSpace(4))
	for {
		n, oobn, _, _, err := uc.ReadMsgUnix(msg, oob)
		if err != nil || n == 0 {
			return err
		}
		conn := receivedConn(oob[:oobn])
		if conn == nil {
			continue
		}
		var handler func(net.Conn)
		if n == vsockPortLen {
			handler = ports[binary.BigEndian.Uint32(msg)]
		}
		if handler == nil {
			_ = conn.Close()
			continue
		}
		go func() {
			if _, err := fmt.Fprintf(conn, "OK %d\n", 1<<15+hostPortCounter.Add(1)); err != nil {
				_ = conn.Close()
				return
			}
			handler(conn)
		}()
	}
}

// receivedConn turns the socket passed with a device message into a connection.
func receivedConn(oob []byte) net.Conn {
	msgs, err := unix.ParseSocketControlMessage(oob)
	if err != nil || len(msgs) != 1 {
		return nil
	}
	fds, err := unix.ParseUnixRights(&msgs[0])
	if err != nil || len(fds) != 1 {
		return nil
	}
	f := os.NewFile(uintptr(fds[0]), "vsock-conn")
	defer f.Close() //nolint:errcheck
	conn, err := net.FileConn(f)
	if err != nil {
		return nil
	}
	return conn
}
