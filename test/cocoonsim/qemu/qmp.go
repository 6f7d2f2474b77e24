package qemu

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"time"
)

// QMP, QEMU's control protocol: JSON objects over the socket. The server greets, the client
// leaves negotiation mode with qmp_capabilities, then each command gets a "return" or an "error";
// asynchronous "event" objects may arrive in between and are skipped here.

type qmpReply struct {
	QMP    json.RawMessage `json:"QMP"`
	Return json.RawMessage `json:"return"`
	Error  *struct {
		Class string `json:"class"`
		Desc  string `json:"desc"`
	} `json:"error"`
}

// qmpExecute connects to sock, runs the commands in order and disconnects. QEMU accepts one
// client at a time and a new one once the last has gone.
func qmpExecute(ctx context.Context, sock string, commands ...string) error {
	var d net.Dialer
	conn, err := d.DialContext(ctx, "unix", sock)
	if err != nil {
		return fmt.Errorf("connect to QMP: %w", err)
	}
	defer conn.Close()
	if deadline, ok := ctx.Deadline(); ok {
		_ = conn.SetDeadline(deadline)
	}
	// Unblock reads and writes when ctx ends without a deadline.
	stop := context.AfterFunc(ctx, func() { _ = conn.SetDeadline(time.Now()) })
	defer stop()

	dec := json.NewDecoder(conn)
	var greeting qmpReply
	if err := dec.Decode(&greeting); err != nil {
		return fmt.Errorf("read QMP greeting: %w", err)
	}
	if greeting.QMP == nil {
		return errors.New("unexpected QMP greeting")
	}
	enc := json.NewEncoder(conn)
	for _, command := range append([]string{"qmp_capabilities"}, commands...) {
		if err := enc.Encode(map[string]string{"execute": command}); err != nil {
			return fmt.Errorf("send QMP %s: %w", command, err)
		}
		if err := qmpAwaitReply(dec, command); err != nil {
			return err
		}
	}
	return nil
}

// qmpAwaitReply reads up to the reply to command, skipping events.
func qmpAwaitReply(dec *json.Decoder, command string) error {
	for {
		var r qmpReply
		if err := dec.Decode(&r); err != nil {
			return fmt.Errorf("read QMP reply to %s: %w", command, err)
		}
		switch {
		case r.Error != nil:
			return fmt.Errorf("QMP %s: %s: %s", command, r.Error.Class, r.Error.Desc)
		case r.Return != nil:
			return nil
		}
	}
}
