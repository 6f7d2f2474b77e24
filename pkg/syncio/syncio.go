// Package syncio holds writers that several goroutines may write to at once: serialised writers
// and a buffer that keeps the tail of what it is given.
package syncio

import (
	"io"
	"sync"
)

// Serialize wraps ws so that no two writes through any of the returned writers overlap. A
// command's stdout and stderr are copied by two goroutines; when both go to one destination (a
// terminal, a buffer of combined output) its writes must take turns. A nil writer becomes
// io.Discard.
func Serialize(ws ...io.Writer) []io.Writer {
	mu := new(sync.Mutex)
	out := make([]io.Writer, len(ws))
	for i, w := range ws {
		if w == nil {
			w = io.Discard
		}
		out[i] = lockedWriter{mu: mu, w: w}
	}
	return out
}

type lockedWriter struct {
	mu *sync.Mutex
	w  io.Writer
}

func (l lockedWriter) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.w.Write(p)
}

// Tail is a writer that keeps the last Max bytes written to it (a command's stderr for an error
// message, a console's recent output). Its methods may be called from several goroutines.
type Tail struct {
	Max int

	mu  sync.Mutex
	buf []byte
}

func (t *Tail) Write(p []byte) (int, error) {
	t.mu.Lock()
	defer t.mu.Unlock()
	n := len(p)
	if len(p) > t.Max {
		p = p[len(p)-t.Max:]
	}
	if over := len(t.buf) + len(p) - t.Max; over > 0 {
		t.buf = t.buf[:copy(t.buf, t.buf[over:])]
	}
	// Grown by hand: append's doubling would hold up to twice Max for good (a console's tail
	// lives as long as its VM).
	if need := len(t.buf) + len(p); need > cap(t.buf) {
		grown := make([]byte, len(t.buf), min(max(need, 2*cap(t.buf)), t.Max))
		copy(grown, t.buf)
		t.buf = grown
	}
	t.buf = append(t.buf, p...)
	return n, nil
}

// String is the kept tail.
func (t *Tail) String() string {
	t.mu.Lock()
	defer t.mu.Unlock()
	return string(t.buf)
}
