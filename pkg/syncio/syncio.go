// Package syncio serialises writers that several goroutines write to at once.
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
