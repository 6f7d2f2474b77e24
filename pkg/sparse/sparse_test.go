package sparse

import (
	"bytes"
	"io"
	"os"
	"path/filepath"
	"testing"
)

// A file with a hole between two runs of data lists the two runs, block-aligned as the file system
// keeps them, and reads back as their bytes alone; a file without holes is one segment.
func TestDataSegments(t *testing.T) {
	const block = 1 << 20 // larger than any file system's block, so the runs stay apart
	f, err := os.Create(filepath.Join(t.TempDir(), "sparse"))
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	head, tail := bytes.Repeat([]byte("h"), block), bytes.Repeat([]byte("t"), block)
	if _, err := f.WriteAt(head, 0); err != nil {
		t.Fatal(err)
	}
	if _, err := f.WriteAt(tail, 3*block); err != nil {
		t.Fatal(err)
	}
	if err := f.Truncate(6 * block); err != nil {
		t.Fatal(err)
	}
	segments, err := DataSegments(f, 6*block)
	if err != nil {
		t.Fatal(err)
	}
	want := []Segment{{0, block}, {3 * block, block}}
	if len(segments) == 1 && segments[0] == (Segment{0, 6 * block}) {
		t.Skipf("the file system of %s reports no holes", f.Name())
	}
	if len(segments) != 2 || segments[0] != want[0] || segments[1] != want[1] {
		t.Fatalf("segments %+v, want %+v", segments, want)
	}
	if Bytes(segments) != 2*block {
		t.Fatalf("Bytes %d", Bytes(segments))
	}
	data, err := io.ReadAll(Reader(f, segments))
	if err != nil || !bytes.Equal(data, append(head, tail...)) {
		t.Fatalf("read %d bytes, %v", len(data), err)
	}

	dense, err := os.Create(filepath.Join(t.TempDir(), "dense"))
	if err != nil {
		t.Fatal(err)
	}
	defer dense.Close()
	if _, err := dense.Write(head); err != nil {
		t.Fatal(err)
	}
	if segments, err := DataSegments(dense, block); err != nil || len(segments) != 1 || segments[0] != (Segment{0, block}) {
		t.Fatalf("dense file: %+v, %v", segments, err)
	}
	if segments, err := DataSegments(dense, 0); err != nil || len(segments) != 0 {
		t.Fatalf("empty range: %+v, %v", segments, err)
	}
}
