// Package sparse finds the data of a sparse file, in the form cocoon records it: the segments
// that hold data, in order, as the JSON map of its snapshot archives' sparse entries.
package sparse

import (
	"errors"
	"fmt"
	"io"
	"os"

	"golang.org/x/sys/unix"
)

// Segment is a run of a file's bytes that holds data: cocoon's sparse map entry
// ({"o": offset, "l": length}).
type Segment struct {
	Offset int64 `json:"o"`
	Length int64 `json:"l"`
}

// DataSegments lists the data of f's first size bytes, with SEEK_DATA and SEEK_HOLE. A file
// system that reports no holes gives one segment of the whole file.
func DataSegments(f *os.File, size int64) ([]Segment, error) {
	var segments []Segment
	fd := int(f.Fd())
	for offset := int64(0); offset < size; {
		start, err := unix.Seek(fd, offset, unix.SEEK_DATA)
		if errors.Is(err, unix.ENXIO) {
			break
		}
		if err != nil {
			return nil, fmt.Errorf("seek data at %d: %w", offset, err)
		}
		end, err := unix.Seek(fd, start, unix.SEEK_HOLE)
		switch {
		case errors.Is(err, unix.ENXIO):
			end = size
		case err != nil:
			return nil, fmt.Errorf("seek hole at %d: %w", start, err)
		}
		end = min(end, size)
		segments = append(segments, Segment{Offset: start, Length: end - start})
		offset = end
	}
	return segments, nil
}

// Bytes is how many bytes the segments hold.
func Bytes(segments []Segment) int64 {
	var n int64
	for _, s := range segments {
		n += s.Length
	}
	return n
}

// Reader reads the segments' bytes of f one after another: the data of a sparse entry.
func Reader(f io.ReaderAt, segments []Segment) io.Reader {
	readers := make([]io.Reader, len(segments))
	for i, s := range segments {
		readers[i] = io.NewSectionReader(f, s.Offset, s.Length)
	}
	return io.MultiReader(readers...)
}
