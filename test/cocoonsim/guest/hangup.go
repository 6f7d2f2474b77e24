package guest

import (
	"syscall"
	"time"

	"golang.org/x/sys/unix"
)

// hangupCheckInterval is how often a wait for a hangup looks whether it should stop waiting.
const hangupCheckInterval = 200 * time.Millisecond

// AwaitHangup waits until the other end of f, a pipe or a socket, is gone (the reader of a pipe,
// the peer of a socket) and reports true, or until stop closes and reports false. It reads and
// writes nothing, so it notices a vanished peer even while no data flows.
func AwaitHangup(f syscall.Conn, stop <-chan struct{}) bool {
	raw, err := f.SyscallConn()
	if err != nil {
		<-stop
		return false
	}
	for {
		select {
		case <-stop:
			return false
		default:
		}
		var hungUp bool
		// Asking for POLLRDHUP alone: POLLIN and POLLOUT never wake the wait, while POLLHUP,
		// POLLERR and POLLNVAL always can.
		err := raw.Control(func(fd uintptr) {
			fds := []unix.PollFd{{Fd: int32(fd), Events: unix.POLLRDHUP}} //nolint:gosec // a file descriptor
			n, pollErr := unix.Poll(fds, int(hangupCheckInterval.Milliseconds()))
			hungUp = pollErr == nil && n > 0
		})
		if err != nil || hungUp {
			return true
		}
	}
}
