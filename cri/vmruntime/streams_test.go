package vmruntime

import (
	"bytes"
	"errors"
	"io"
	"testing"
)

// An attach session's input reaches the container only while the session lasts, and its end is
// reported once, whichever comes first: the client closing its input or the session ending.
func TestSessionInputEndsWithItsSession(t *testing.T) {
	var got bytes.Buffer
	ends := 0
	in := newSessionInput(&got, func() { ends++ })
	if _, err := in.Write([]byte("during ")); err != nil {
		t.Fatal(err)
	}
	in.end()
	if _, err := in.Write([]byte("after")); !errors.Is(err, io.ErrClosedPipe) {
		t.Fatalf("a write after the session: %v", err)
	}
	in.end()
	if got.String() != "during " || ends != 1 {
		t.Fatalf("the container got %q, and %d ends were reported", got.String(), ends)
	}
}
