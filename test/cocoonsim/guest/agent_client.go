package guest

import (
	"bufio"
	"context"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
)

// RunInGuest runs argv through the guest agent on conn (a hybrid vsock connection past its
// CONNECT handshake) and returns the command's exit code. The command's stdout and stderr are
// written to stdout and stderr as they come. A nil stdin closes the command's stdin at once;
// otherwise stdin is relayed until EOF. Cancelling ctx closes the connection, which ends the
// command in the guest.
func RunInGuest(ctx context.Context, conn net.Conn, argv []string, env map[string]string, stdin io.Reader, stdout, stderr io.Writer) (int, error) {
	stop := context.AfterFunc(ctx, func() { _ = conn.Close() })
	defer stop()
	out := &frameWriter{w: conn}
	req, err := json.Marshal(execRequest{Argv: argv, Env: env})
	if err != nil {
		return 0, fmt.Errorf("encode exec request: %w", err)
	}
	if err := out.send(frameExec, req); err != nil {
		return 0, canceledOr(ctx, fmt.Errorf("send exec request: %w", err))
	}
	if stdin == nil {
		// A failed send is no failure: a command that does not read may be done already, its
		// exit code waiting to be read below.
		_ = out.send(frameStdinClose, nil)
	} else {
		go relayStdin(stdin, out)
	}
	in := bufio.NewReader(conn)
	for {
		kind, payload, err := readFrame(in)
		if errors.Is(err, io.EOF) {
			return 0, canceledOr(ctx, errors.New("agent: connection closed before exit frame"))
		}
		if err != nil {
			return 0, canceledOr(ctx, fmt.Errorf("read frame: %w", err))
		}
		switch kind {
		case frameStdout:
			if _, err := stdout.Write(payload); err != nil {
				return 0, fmt.Errorf("write stdout: %w", err)
			}
		case frameStderr:
			if _, err := stderr.Write(payload); err != nil {
				return 0, fmt.Errorf("write stderr: %w", err)
			}
		case frameExit:
			if len(payload) != 4 {
				return 0, fmt.Errorf("agent: exit frame of %d bytes", len(payload))
			}
			return int(int32(binary.BigEndian.Uint32(payload))), nil //nolint:gosec // a signed exit code
		case frameError:
			return 0, fmt.Errorf("agent: %s", payload)
		}
	}
}

// relayStdin sends the caller's input until it ends, then closes the command's stdin. A failed
// send means the session is over; the reader learns that on its own.
func relayStdin(stdin io.Reader, out *frameWriter) {
	buf := make([]byte, outputChunk)
	for {
		n, err := stdin.Read(buf)
		if n > 0 {
			if sendErr := out.send(frameStdin, buf[:n]); sendErr != nil {
				return
			}
		}
		if err != nil {
			_ = out.send(frameStdinClose, nil)
			return
		}
	}
}

// Reseed asks the guest agent on conn (past its CONNECT handshake) to mix entropy into the
// guest's pool and, with machineID, to give the guest a new /etc/machine-id.
func Reseed(ctx context.Context, conn net.Conn, entropy []byte, machineID bool) error {
	stop := context.AfterFunc(ctx, func() { _ = conn.Close() })
	defer stop()
	req, err := json.Marshal(reseedRequest{Entropy: entropy, MachineID: machineID})
	if err != nil {
		return fmt.Errorf("encode reseed request: %w", err)
	}
	out := &frameWriter{w: conn}
	if err := out.send(frameReseed, req); err != nil {
		return canceledOr(ctx, fmt.Errorf("send reseed request: %w", err))
	}
	kind, payload, err := readFrame(bufio.NewReader(conn))
	if err != nil {
		return canceledOr(ctx, fmt.Errorf("read reseed reply: %w", err))
	}
	switch kind {
	case frameExit:
		return nil
	case frameError:
		return fmt.Errorf("agent: %s", payload)
	default:
		return fmt.Errorf("agent: unexpected frame %q", kind)
	}
}

// canceledOr reports a cancelled context as such: the broken connection is only its symptom.
func canceledOr(ctx context.Context, err error) error {
	if ctxErr := ctx.Err(); ctxErr != nil {
		return ctxErr
	}
	return err
}
