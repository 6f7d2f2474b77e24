package cocoonsim

import (
	"context"
	"fmt"
	"io"
	"net"
	"os"
	"strings"

	"github.com/cocoonstack/cocoon-cri/test/cocoonsim/guest"
)

// connectReplyMax bounds the hybrid vsock handshake reply, as cocoon does.
const connectReplyMax = 256

// dialHybridVsock connects to a guest port through the VM's hybrid vsock socket, the way
// cloud-hypervisor exposes virtio-vsock: connect to the unix socket, send "CONNECT <port>\n",
// and expect "OK <host port>\n" once something in the guest accepted. Cancelling ctx aborts
// the wait for the reply.
func dialHybridVsock(ctx context.Context, socket string, port uint32) (net.Conn, error) {
	var d net.Dialer
	conn, err := d.DialContext(ctx, "unix", socket)
	if err != nil {
		return nil, err
	}
	stop := context.AfterFunc(ctx, func() { _ = conn.Close() })
	defer stop()
	fail := func(err error) (net.Conn, error) {
		_ = conn.Close()
		if ctxErr := ctx.Err(); ctxErr != nil {
			return nil, ctxErr
		}
		return nil, err
	}
	if _, err := fmt.Fprintf(conn, "CONNECT %d\n", port); err != nil {
		return fail(fmt.Errorf("write CONNECT: %w", err))
	}
	reply, err := readReplyLine(conn)
	if err != nil {
		return fail(fmt.Errorf("read CONNECT reply: %w", err))
	}
	if !strings.HasPrefix(reply, "OK ") {
		return fail(fmt.Errorf("hybrid vsock CONNECT %d: %s", port, strings.TrimSpace(reply)))
	}
	return conn, nil
}

// readReplyLine reads one line a byte at a time: what follows it is the agent's.
func readReplyLine(r io.Reader) (string, error) {
	var line []byte
	b := make([]byte, 1)
	for {
		if _, err := r.Read(b); err != nil {
			return "", err
		}
		line = append(line, b[0])
		if b[0] == '\n' {
			return string(line), nil
		}
		if len(line) >= connectReplyMax {
			return "", fmt.Errorf("reply line exceeds %d bytes", connectReplyMax)
		}
	}
}

// stopOnHangup returns a context that is also cancelled when out is a pipe or socket whose
// reader has gone: a caller that stops listening ends the guest command even while it prints
// nothing. (Output to a vanished reader ends this process with SIGPIPE anyway.)
func stopOnHangup(ctx context.Context, out io.Writer) (context.Context, context.CancelFunc) {
	ctx, cancel := context.WithCancel(ctx)
	if f, ok := out.(*os.File); ok && isPipeOrSocket(f) {
		go func() {
			if guest.AwaitHangup(f, ctx.Done()) {
				cancel()
			}
		}()
	}
	return ctx, cancel
}

func isPipeOrSocket(f *os.File) bool {
	info, err := f.Stat()
	if err != nil {
		return false
	}
	mode := info.Mode()
	return mode&os.ModeNamedPipe != 0 || mode&os.ModeSocket != 0
}
