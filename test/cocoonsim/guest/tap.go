package guest

import (
	"fmt"
	"os"

	"golang.org/x/sys/unix"
)

// virtioNetHdrLen is the size of the struct virtio_net_hdr that precedes every frame on a TAP
// opened with IFF_VNET_HDR (the kernel default header size, which the simulator keeps).
const virtioNetHdrLen = 10

// nic is a virtio-net device as the hypervisor holds it: the device config and the open queues of
// its TAP, each carrying frames prefixed with a virtio-net header.
type nic struct {
	net    Net
	queues []*os.File
}

// openNIC attaches to the NIC's TAP in the hypervisor's network namespace the way
// cloud-hypervisor does: one file per queue pair (num_queues counts TX and RX queues), with
// IFF_TAP|IFF_NO_PI|IFF_VNET_HDR, and IFF_MULTI_QUEUE when there is more than one pair. Like
// cloud-hypervisor it would create the TAP if it did not exist.
func openNIC(n Net) (*nic, error) {
	pairs := max(1, n.NumQueues/2)
	flags := uint16(unix.IFF_TAP | unix.IFF_NO_PI | unix.IFF_VNET_HDR)
	if pairs > 1 {
		flags |= unix.IFF_MULTI_QUEUE
	}
	d := &nic{net: n}
	for q := range pairs {
		f, err := openTAPQueue(n.Tap, flags)
		if err != nil {
			d.close()
			return nil, fmt.Errorf("open tap %s queue %d: %w", n.Tap, q, err)
		}
		d.queues = append(d.queues, f)
	}
	return d, nil
}

func openTAPQueue(name string, flags uint16) (*os.File, error) {
	fd, err := unix.Open("/dev/net/tun", unix.O_RDWR|unix.O_CLOEXEC, 0)
	if err != nil {
		return nil, err
	}
	req, err := unix.NewIfreq(name)
	if err != nil {
		_ = unix.Close(fd)
		return nil, err
	}
	req.SetUint16(flags)
	if err := unix.IoctlIfreq(fd, unix.TUNSETIFF, req); err != nil {
		_ = unix.Close(fd)
		return nil, fmt.Errorf("TUNSETIFF: %w", err)
	}
	// A TAP fd only works with epoll once it is attached; non-blocking now lets os.File park
	// readers in the runtime poller, and Close wake them.
	if err := unix.SetNonblock(fd, true); err != nil {
		_ = unix.Close(fd)
		return nil, err
	}
	return os.NewFile(uintptr(fd), "tap:"+name), nil
}

func (d *nic) close() {
	for _, q := range d.queues {
		_ = q.Close()
	}
	d.queues = nil
}
