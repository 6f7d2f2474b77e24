// Package fat12 writes and reads FAT12 filesystem images: the cloud-init seed (cidata.img) that
// cocoon writes for a cloud image VM, and that the simulated guest reads back as a guest kernel
// mounting it would.
//
// The writer makes the image cocoon's metadata.CreateFAT12 makes (metadata/fat12.go@093174ca,
// the same layout as v0.3.8's): 1 MiB, 512-byte sectors and clusters, one reserved sector, two
// FATs of 6 sectors, a 128-entry root directory holding the volume label first and then every
// file in name order, each with VFAT long-name entries unless its name is already an upper-case
// 8.3 name, file data in consecutive clusters in the same order. The reader takes any FAT12
// volume's root directory.
package fat12

import (
	"encoding/binary"
	"fmt"
	"io"
	"maps"
	"slices"
	"strings"
	"time"
	"unicode/utf16"
)

// The geometry of the images Write makes.
const (
	SectorSize     = 512
	ImageSectors   = 2048 // 1 MiB
	ImageSize      = ImageSectors * SectorSize
	fatCopies      = 2
	fatSectors     = 6
	rootEntries    = 128
	dirEntrySize   = 32
	rootDirSectors = rootEntries * dirEntrySize / SectorSize
	firstDataSec   = 1 + fatCopies*fatSectors + rootDirSectors // 21: boot sector, FATs, root directory
	dataClusters   = ImageSectors - firstDataSec               // one sector per cluster
	mediaFixedDisk = 0xF8
)

// Directory entry attributes.
const (
	attrVolumeID = 0x08
	attrDir      = 0x10
	attrArchive  = 0x20
	attrLongName = 0x0F // read-only | hidden | system | volume ID
	lfnLast      = 0x40 // the ordinal of the first long-name entry on disk (the name's end)
	lfnChars     = 13   // UCS-2 characters per long-name entry
	endOfChain   = 0xFFF
)

// Write writes a FAT12 image labelled label (upper-cased, at most 11 bytes) holding files in
// its root directory. now stamps the directory entries (local time, as FAT keeps it) and makes
// the volume serial number.
func Write(w io.Writer, label string, files map[string][]byte, now time.Time) error {
	img, err := build(label, files, now)
	if err != nil {
		return err
	}
	_, err = w.Write(img)
	return err
}

func build(label string, files map[string][]byte, now time.Time) ([]byte, error) {
	img := make([]byte, ImageSize)
	writeBootSector(img[:SectorSize], label, now)

	fat := img[SectorSize : SectorSize+fatSectors*SectorSize]
	putFATEntry(fat, 0, 0xF00|mediaFixedDisk)
	putFATEntry(fat, 1, endOfChain)

	root := directory{buf: img[(1+fatCopies*fatSectors)*SectorSize : firstDataSec*SectorSize]}
	if err := root.add(entry(volumeLabel(label), attrVolumeID, now, 0, 0)); err != nil {
		return nil, err
	}

	next, tails := 2, 0 // the next free cluster; the ~N tails given so far
	for _, name := range slices.Sorted(maps.Keys(files)) {
		data := files[name]
		clusters := (len(data) + SectorSize - 1) / SectorSize
		first := 0
		if clusters > 0 {
			if next-2+clusters > dataClusters {
				return nil, fmt.Errorf("fat12: not enough space for %s", name)
			}
			first = next
			for c := first; c < first+clusters; c++ {
				link := c + 1
				if c == first+clusters-1 {
					link = endOfChain
				}
				putFATEntry(fat, c, link)
			}
			copy(img[(firstDataSec+first-2)*SectorSize:], data)
			next += clusters
		}

		var sfn [11]byte
		if fits83(name) {
			sfn = shortName(name)
		} else {
			tails++
			sfn = tailedShortName(name, tails)
			for _, e := range longNameEntries(name, sfn) {
				if err := root.add(e); err != nil {
					return nil, err
				}
			}
		}
		if err := root.add(entry(sfn, attrArchive, now, first, len(data))); err != nil {
			return nil, err
		}
	}
	copy(img[(1+fatSectors)*SectorSize:], fat) // the second FAT is a copy of the first
	return img, nil
}

func writeBootSector(b []byte, label string, now time.Time) {
	copy(b, []byte{0xEB, 0x3C, 0x90}) // jmp short, nop
	copy(b[3:11], "COCOON  ")         // OEM name
	le := binary.LittleEndian
	le.PutUint16(b[11:], SectorSize)
	b[13] = 1 // sectors per cluster
	le.PutUint16(b[14:], 1)
	b[16] = fatCopies
	le.PutUint16(b[17:], rootEntries)
	le.PutUint16(b[19:], ImageSectors)
	b[21] = mediaFixedDisk
	le.PutUint16(b[22:], fatSectors)
	le.PutUint16(b[24:], 32)                     // sectors per track
	le.PutUint16(b[26:], 64)                     // heads
	b[36] = 0x80                                 // drive number
	b[38] = 0x29                                 // extended boot signature: serial, label and type follow
	le.PutUint32(b[39:], uint32(now.UnixNano())) //nolint:gosec // the serial is the clock's low bits
	l := volumeLabel(label)
	copy(b[43:54], l[:])
	copy(b[54:62], "FAT12   ")
	b[510], b[511] = 0x55, 0xAA
}

// putFATEntry sets cluster's 12-bit entry: entries pack two to three bytes, the even one in the
// low 12 bits.
func putFATEntry(fat []byte, cluster, value int) {
	off := cluster * 3 / 2
	v := uint16(value & 0xFFF) //nolint:gosec // 12 bits
	old := binary.LittleEndian.Uint16(fat[off:])
	if cluster%2 == 0 {
		v = old&0xF000 | v
	} else {
		v = old&0x000F | v<<4
	}
	binary.LittleEndian.PutUint16(fat[off:], v)
}

type directory struct {
	buf  []byte
	used int
}

func (d *directory) add(e []byte) error {
	if (d.used+1)*dirEntrySize > len(d.buf) {
		return fmt.Errorf("fat12: root directory full")
	}
	copy(d.buf[d.used*dirEntrySize:], e)
	d.used++
	return nil
}

// entry is a short directory entry: a file, or the volume label.
func entry(name [11]byte, attr byte, now time.Time, cluster, size int) []byte {
	e := make([]byte, dirEntrySize)
	copy(e, name[:])
	e[11] = attr
	date, clock := fatDateTime(now)
	le := binary.LittleEndian
	le.PutUint16(e[14:], clock) // created
	le.PutUint16(e[16:], date)
	le.PutUint16(e[18:], date)  // last accessed
	le.PutUint16(e[22:], clock) // modified
	le.PutUint16(e[24:], date)
	le.PutUint16(e[26:], uint16(cluster)) //nolint:gosec // < 4096
	le.PutUint32(e[28:], uint32(size))    //nolint:gosec // < 1 MiB
	return e
}

func fatDateTime(t time.Time) (date, clock uint16) {
	date = uint16((t.Year()-1980)<<9 | int(t.Month())<<5 | t.Day()) //nolint:gosec // FAT's date fields
	clock = uint16(t.Hour()<<11 | t.Minute()<<5 | t.Second()/2)     //nolint:gosec // FAT's time fields
	return date, clock
}

// splitExt cuts a name at its last dot.
func splitExt(name string) (base, ext string) {
	if i := strings.LastIndexByte(name, '.'); i >= 0 {
		return name[:i], name[i+1:]
	}
	return name, ""
}

// fits83 reports whether name is its own short name: upper case, one dot at most, a base of 8
// bytes and an extension of 3 at most. Anything else gets long-name entries.
func fits83(name string) bool {
	base, ext := splitExt(name)
	return name == strings.ToUpper(name) && strings.Count(name, ".") <= 1 && len(base) <= 8 && len(ext) <= 3
}

// blank is an 11-byte name field of spaces.
func blank() [11]byte {
	return [11]byte{' ', ' ', ' ', ' ', ' ', ' ', ' ', ' ', ' ', ' ', ' '}
}

// volumeLabel is a label as the boot sector and the label entry keep it: upper case, 11 bytes
// padded with spaces.
func volumeLabel(label string) [11]byte {
	l := blank()
	copy(l[:], strings.ToUpper(label))
	return l
}

// shortName pads an 8.3 name into the 11 bytes of a short entry: 8 of base, 3 of extension.
func shortName(name string) [11]byte {
	sfn := blank()
	base, ext := splitExt(strings.ToUpper(name))
	copy(sfn[:8], base)
	copy(sfn[8:], ext)
	return sfn
}

// tailedShortName is the short name of a file that needs a long one: its upper-cased base
// without dots, cut to make room for "~N", then up to 3 bytes of extension.
func tailedShortName(name string, n int) [11]byte {
	base, ext := splitExt(strings.ToUpper(name))
	tail := fmt.Sprintf("~%d", n)
	base = strings.ReplaceAll(base, ".", "")
	base = base[:min(len(base), 8-len(tail))] + tail
	sfn := blank()
	copy(sfn[:8], base)
	copy(sfn[8:], ext[:min(len(ext), 3)])
	return sfn
}

// longNameEntries are the VFAT entries that precede a short entry to give it a long name, in
// disk order: the last part of the name first, its ordinal marked with 0x40.
func longNameEntries(name string, sfn [11]byte) [][]byte {
	units := utf16.Encode([]rune(name))
	n := (len(units) + lfnChars - 1) / lfnChars
	sum := checksum(sfn)
	out := make([][]byte, 0, n)
	for ord := n; ord >= 1; ord-- {
		e := make([]byte, dirEntrySize)
		e[0] = byte(ord)
		if ord == n {
			e[0] |= lfnLast
		}
		e[11] = attrLongName
		e[13] = sum
		for i, off := range lfnCharOffsets {
			idx := (ord-1)*lfnChars + i
			switch {
			case idx < len(units):
				binary.LittleEndian.PutUint16(e[off:], units[idx])
			case idx > len(units): // after the NUL that ends a name short of the entry's end
				binary.LittleEndian.PutUint16(e[off:], 0xFFFF)
			}
		}
		out = append(out, e)
	}
	return out
}

// lfnCharOffsets are where a long-name entry keeps its 13 characters: 5, then 6, then 2.
var lfnCharOffsets = [lfnChars]int{1, 3, 5, 7, 9, 14, 16, 18, 20, 22, 24, 28, 30}

// checksum is the short name's checksum that long-name entries carry.
func checksum(sfn [11]byte) byte {
	var sum byte
	for _, c := range sfn {
		sum = (sum>>1 | sum<<7) + c
	}
	return sum
}
