package guest

import (
	"bufio"
	"bytes"
	"encoding/binary"
	"strings"
	"testing"
)

func TestFramesRoundTrip(t *testing.T) {
	var buf bytes.Buffer
	fw := &frameWriter{w: &buf}
	if err := fw.send(frameStdout, []byte("hello")); err != nil {
		t.Fatal(err)
	}
	if err := fw.send(frameStdinClose, nil); err != nil {
		t.Fatal(err)
	}
	if err := fw.sendExit(137); err != nil {
		t.Fatal(err)
	}
	r := bufio.NewReader(&buf)
	for _, want := range []struct {
		kind    byte
		payload []byte
	}{{frameStdout, []byte("hello")}, {frameStdinClose, []byte{}}, {frameExit, []byte{0, 0, 0, 137}}} {
		kind, payload, err := readFrame(r)
		if err != nil || kind != want.kind || !bytes.Equal(payload, want.payload) {
			t.Fatalf("frame %q %q, %v; want %q %q", kind, payload, err, want.kind, want.payload)
		}
	}
}

func TestOversizedFrameIsRefused(t *testing.T) {
	hdr := binary.BigEndian.AppendUint32([]byte{frameStdin}, maxFramePayload+1)
	if _, _, err := readFrame(bufio.NewReader(bytes.NewReader(hdr))); err == nil || !strings.Contains(err.Error(), "exceeds") {
		t.Fatalf("oversized frame: %v", err)
	}
}
