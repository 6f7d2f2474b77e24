package guest

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"math"
	"os"
	"strconv"
	"strings"
)

// A snapshot's memory file (cloud-hypervisor's memory-range-0, Firecracker's mem) is the guest's
// RAM. Of its RAM the simulated guest has only what its tmpfs /dev/shm holds, so the file is:
//
//	cocoon-sim guest memory of <name>\n
//	cocoon-sim tmpfs /dev/shm: tar\n    (absent when there was no simulated guest to read)
//	a tar of /dev/shm
//
// The first line alone is what snapshots written without a running guest hold (testimage's), and
// what a real kernel's snapshot holds: its RAM is QEMU's, which the simulator cannot save.
// Everything else, the CLI and cocoon-cri's archive code, treats the file as opaque bytes.
const (
	memoryHeaderPrefix = "cocoon-sim guest memory of "
	memoryShmSection   = "cocoon-sim tmpfs /dev/shm: tar\n"
)

// guestShm is where the guest mounts the tmpfs its RAM holds.
const guestShm = "/dev/shm"

// maxMemoryHeaderLine bounds the header lines read before deciding a file is not the
// simulator's; a VM name is far shorter.
const maxMemoryHeaderLine = 4096

// writeMemoryFile writes the guest's RAM to path: the header, then what ram writes (nothing when
// it is nil). The file is created anew rather than truncated, since the one at path may be a
// clone's hard link to the same memory.
func writeMemoryFile(path, vmName string, ram func(io.Writer) error) (err error) {
	if err := os.Remove(path); err != nil && !errors.Is(err, fs.ErrNotExist) {
		return err
	}
	f, err := os.OpenFile(path, os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o600) //nolint:gosec // the snapshot's own file
	if err != nil {
		return err
	}
	defer func() {
		if cerr := f.Close(); err == nil {
			err = cerr
		}
		if err != nil {
			_ = os.Remove(path)
		}
	}()
	w := bufio.NewWriterSize(f, 1<<20)
	if _, err := fmt.Fprintf(w, "%s%s\n", memoryHeaderPrefix, vmName); err != nil {
		return err
	}
	if ram != nil {
		if err := ram(w); err != nil {
			return err
		}
	}
	return w.Flush()
}

// writeShmSection is a memory file's tmpfs section for the directory dir.
func writeShmSection(dir string) func(io.Writer) error {
	return func(w io.Writer) error {
		if _, err := io.WriteString(w, memoryShmSection); err != nil {
			return err
		}
		if err := writeTmpfs(w, dir); err != nil {
			return fmt.Errorf("save the guest's %s: %w", guestShm, err)
		}
		return nil
	}
}

// restoredRAM is a restored snapshot's memory file, held open from the restore to the guest's
// first resume, as cloud-hypervisor and Firecracker keep the memory they restored (copied or
// mapped): removing the file in between takes nothing from the guest.
type restoredRAM struct {
	f *os.File
	// section is the offset of the tmpfs section's first line, -1 when the file has none.
	section int64
}

// openMemoryFile opens a memory file for a restore. A file that does not start with the
// simulator's header was not written by it (nor by testimage): the guest gets an empty tmpfs, as
// nothing of it can be read there. A header followed by anything but the tmpfs section is a
// damaged file, and the restore fails.
func openMemoryFile(path string) (*restoredRAM, error) {
	f, err := os.Open(path) //nolint:gosec // the snapshot's own file
	if err != nil {
		return nil, err
	}
	section, err := findShmSection(f)
	if err != nil {
		_ = f.Close()
		return nil, fmt.Errorf("memory file %s: %w", path, err)
	}
	return &restoredRAM{f: f, section: section}, nil
}

func findShmSection(f *os.File) (int64, error) {
	r := bufio.NewReaderSize(io.NewSectionReader(f, 0, math.MaxInt64), maxMemoryHeaderLine)
	header, err := r.ReadSlice('\n')
	if err != nil || !bytes.HasPrefix(header, []byte(memoryHeaderPrefix)) {
		return -1, nil
	}
	next, err := r.ReadSlice('\n')
	switch {
	case errors.Is(err, io.EOF) && len(next) == 0:
		return -1, nil
	case string(next) == memoryShmSection:
		return int64(len(header)), nil
	default:
		return -1, fmt.Errorf("unknown content after the header: %s", strconv.Quote(strings.TrimSpace(string(next))))
	}
}

// hasShm reports whether the memory holds a tmpfs.
func (m *restoredRAM) hasShm() bool { return m != nil && m.section >= 0 }

// shmTar is the memory file positioned at its tmpfs tar, for the guest OS process to read from
// its own descriptor (which shares the offset).
func (m *restoredRAM) shmTar() (*os.File, error) {
	if _, err := m.f.Seek(m.section+int64(len(memoryShmSection)), io.SeekStart); err != nil {
		return nil, err
	}
	return m.f, nil
}

// copyShmSection writes the tmpfs section as it is in the file: the RAM of a restored guest that
// has not run since.
func (m *restoredRAM) copyShmSection(w io.Writer) error {
	_, err := io.Copy(w, io.NewSectionReader(m.f, m.section, math.MaxInt64-m.section))
	return err
}

func (m *restoredRAM) close() {
	if m != nil {
		_ = m.f.Close()
	}
}
