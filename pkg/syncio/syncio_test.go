package syncio

import (
	"bytes"
	"strings"
	"sync"
	"testing"
)

// Two goroutines writing through the two halves into one buffer must neither race (go test -race)
// nor lose or interleave bytes within a write.
func TestSerializeKeepsWritesWhole(t *testing.T) {
	var buf bytes.Buffer
	ws := Serialize(&buf, &buf)
	var wg sync.WaitGroup
	for i, w := range ws {
		wg.Add(1)
		go func() {
			defer wg.Done()
			line := strings.Repeat(string(rune('a'+i)), 63) + "\n"
			for range 200 {
				if _, err := w.Write([]byte(line)); err != nil {
					t.Error(err)
					return
				}
			}
		}()
	}
	wg.Wait()
	lines := strings.Split(strings.TrimSuffix(buf.String(), "\n"), "\n")
	if len(lines) != 400 {
		t.Fatalf("got %d lines, want 400", len(lines))
	}
	for _, l := range lines {
		if l != strings.Repeat(l[:1], 63) {
			t.Fatalf("interleaved write: %q", l)
		}
	}
}

func TestSerializeDiscardsNil(t *testing.T) {
	ws := Serialize(nil)
	if n, err := ws[0].Write([]byte("x")); n != 1 || err != nil {
		t.Fatalf("Write = %d, %v", n, err)
	}
}

func TestTailKeepsTheLastBytes(t *testing.T) {
	tail := &Tail{Max: 8}
	for _, w := range []string{"hello ", "wide ", "world"} {
		if n, err := tail.Write([]byte(w)); n != len(w) || err != nil {
			t.Fatalf("Write(%q) = %d, %v", w, n, err)
		}
	}
	if got := tail.String(); got != "de world" {
		t.Fatalf("tail %q, want the last 8 bytes %q", got, "de world")
	}
	if n, err := tail.Write([]byte("a write longer than Max")); n != 23 || err != nil {
		t.Fatalf("a long write: %d, %v", n, err)
	}
	if got := tail.String(); got != "than Max" {
		t.Fatalf("tail %q after a long write, want %q", got, "than Max")
	}
	tail.Write([]byte("!"))
	if got := tail.String(); got != "han Max!" || cap(tail.buf) != 8 {
		t.Fatalf("tail %q in %d bytes, want %q in Max", got, cap(tail.buf), "han Max!")
	}
}
