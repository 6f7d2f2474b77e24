package realguest

import (
	"fmt"
	"io"
)

// The kernel unpacks an initramfs in the "newc" cpio format: a 110-byte ASCII header of
// hexadecimal fields, the NUL-terminated name, the data, each padded to 4 bytes. The standard
// library has no cpio writer, so this is the minimal one an initramfs needs.

const (
	modeType    = 0o170000 // the file-type bits of mode
	modeDir     = 0o040000
	modeRegular = 0o100000
	modeSymlink = 0o120000
	modeCharDev = 0o020000
	cpioTrailer = "TRAILER!!!"
)

// cpioWriter writes newc entries; inode numbers only need to be distinct per entry.
type cpioWriter struct {
	w   io.Writer
	ino uint32
	err error
}

// cpioEntry is one file of the archive; name is relative ("bin/sh", no leading slash).
type cpioEntry struct {
	name  string
	mode  uint32 // file type and permission bits
	data  []byte // file contents or symlink target
	major uint32 // device numbers of a character device
	minor uint32
}

func (c *cpioWriter) dir(name string) error {
	return c.write(cpioEntry{name: name, mode: modeDir | 0o755})
}

func (c *cpioWriter) file(name string, perm uint32, data []byte) error {
	return c.write(cpioEntry{name: name, mode: modeRegular | perm, data: data})
}

func (c *cpioWriter) symlink(name, target string) error {
	return c.write(cpioEntry{name: name, mode: modeSymlink | 0o777, data: []byte(target)})
}

func (c *cpioWriter) charDev(name string, major, minor uint32) error {
	return c.write(cpioEntry{name: name, mode: modeCharDev | 0o600, major: major, minor: minor})
}

// close writes the trailer entry that ends the archive.
func (c *cpioWriter) close() error {
	return c.write(cpioEntry{name: cpioTrailer})
}

func (c *cpioWriter) write(e cpioEntry) error {
	if c.err != nil {
		return c.err
	}
	nlink := 1
	if e.mode&modeType == modeDir {
		nlink = 2
	}
	ino := uint32(0)
	if e.name != cpioTrailer {
		c.ino++
		ino = c.ino
	}
	nameSize := len(e.name) + 1
	// ino mode uid gid nlink mtime filesize devmajor devminor rdevmajor rdevminor namesize check
	header := fmt.Sprintf("070701%08x%08x%08x%08x%08x%08x%08x%08x%08x%08x%08x%08x%08x",
		ino, e.mode, 0, 0, nlink, 0, len(e.data), 0, 0, e.major, e.minor, nameSize, 0)
	c.put([]byte(header))
	c.put([]byte(e.name))
	c.put(make([]byte, 1+pad4(len(header)+nameSize)))
	c.put(e.data)
	c.put(make([]byte, pad4(len(e.data))))
	return c.err
}

func (c *cpioWriter) put(b []byte) {
	if c.err == nil && len(b) > 0 {
		_, c.err = c.w.Write(b)
	}
}

// pad4 is how many bytes bring n up to a multiple of 4.
func pad4(n int) int { return (4 - n%4) % 4 }
