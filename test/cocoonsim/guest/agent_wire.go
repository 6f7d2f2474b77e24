package guest

import (
	"bufio"
	"encoding/binary"
	"fmt"
	"io"
	"sync"
)

// The simulated guest agent's wire protocol, spoken over a hybrid vsock connection once the
// CONNECT handshake is done. It is the simulator's own (only `cocoon vm exec` and the agent speak
// it): frames of one kind byte, a big-endian uint32 length and the payload.
const (
	// frameExec opens a session (client to agent): a JSON execRequest.
	frameExec byte = 'X'
	// frameReseed opens a reseed session instead (client to agent): a JSON reseedRequest. The
	// agent answers with frameExit 0 or frameError.
	frameReseed byte = 'S'
	// frameStdin carries input for the command; frameStdinClose ends it (the command reads EOF).
	frameStdin      byte = 'I'
	frameStdinClose byte = 'C'
	// frameStdout and frameStderr carry the command's output, kept apart.
	frameStdout byte = 'O'
	frameStderr byte = 'E'
	// frameExit ends a session: the command's exit code as a big-endian int32, -1 for a command
	// killed by a signal (as cocoon-agent reports it).
	frameExit byte = 'Q'
	// frameError ends a session whose command could not run: a message.
	frameError byte = 'R'
)

const (
	frameHeaderLen = 5
	// maxFramePayload bounds what a peer may ask the reader to buffer.
	maxFramePayload = 1 << 20
	// outputChunk is the largest piece of output one frame carries.
	outputChunk = 32 << 10
)

// execRequest is the payload of frameExec.
type execRequest struct {
	Argv []string          `json:"argv"`
	Env  map[string]string `json:"env,omitempty"`
}

// reseedRequest is the payload of frameReseed: entropy to mix into the guest's pool, and
// whether to give the guest a new /etc/machine-id.
type reseedRequest struct {
	Entropy   []byte `json:"entropy"`
	MachineID bool   `json:"machine_id,omitempty"`
}

// frameWriter serialises frames from several goroutines onto one connection.
type frameWriter struct {
	mu sync.Mutex
	w  io.Writer
}

func (fw *frameWriter) send(kind byte, payload []byte) error {
	buf := make([]byte, frameHeaderLen+len(payload))
	buf[0] = kind
	binary.BigEndian.PutUint32(buf[1:frameHeaderLen], uint32(len(payload))) //nolint:gosec // bounded by the chunk size
	copy(buf[frameHeaderLen:], payload)
	fw.mu.Lock()
	defer fw.mu.Unlock()
	_, err := fw.w.Write(buf)
	return err
}

func (fw *frameWriter) sendExit(code int) error {
	return fw.send(frameExit, binary.BigEndian.AppendUint32(nil, uint32(int32(code)))) //nolint:gosec // exit codes are small
}

// readFrame reads the next frame.
func readFrame(r *bufio.Reader) (kind byte, payload []byte, err error) {
	var hdr [frameHeaderLen]byte
	if _, err := io.ReadFull(r, hdr[:]); err != nil {
		return 0, nil, err
	}
	n := binary.BigEndian.Uint32(hdr[1:])
	if n > maxFramePayload {
		return 0, nil, fmt.Errorf("frame of %d bytes exceeds %d", n, maxFramePayload)
	}
	payload = make([]byte, n)
	if _, err := io.ReadFull(r, payload); err != nil {
		return 0, nil, fmt.Errorf("read frame payload: %w", err)
	}
	return hdr[0], payload, nil
}
