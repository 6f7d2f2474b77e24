package fat12

import (
	"encoding/binary"
	"errors"
	"fmt"
	"strings"
	"unicode/utf16"
)

// maxFAT12Clusters is the cluster count from which a FAT volume is FAT16 (Microsoft's FAT
// specification: FAT12 has fewer than 4085 clusters).
const maxFAT12Clusters = 4085

// File is a regular file of a volume's root directory.
type File struct {
	// Name is the long (VFAT) name when the file has a valid one, otherwise the 8.3 name.
	Name string
	// ShortName is the 8.3 name, "BASE.EXT".
	ShortName string
	Data      []byte
}

// Volume is what Parse found on a FAT12 volume.
type Volume struct {
	// Label is the volume label without its padding: the root directory's label entry, or the
	// boot sector's when there is none (as blkid reads it).
	Label string
	// Files are the root directory's regular files, in directory order. Subdirectories are not
	// read.
	Files []File
}

// Lookup finds a root directory file by name, long or short, without regard to case, as Linux's
// vfat looks names up.
func (v *Volume) Lookup(name string) (File, bool) {
	for _, f := range v.Files {
		if strings.EqualFold(f.Name, name) || strings.EqualFold(f.ShortName, name) {
			return f, true
		}
	}
	return File{}, false
}

// bpb is the part of the BIOS parameter block the reader needs.
type bpb struct {
	bytesPerSector, sectorsPerCluster, reserved, fats, rootEntries, fatSectors, totalSectors int
}

// Parse reads a FAT12 volume image: its boot sector, its first FAT, its root directory and the
// files there. Anything that is not a consistent FAT12 volume is an error.
func Parse(img []byte) (*Volume, error) {
	if len(img) < SectorSize {
		return nil, errors.New("fat12: image shorter than a boot sector")
	}
	if img[510] != 0x55 || img[511] != 0xAA {
		return nil, errors.New("fat12: no boot sector signature")
	}
	le := binary.LittleEndian
	p := bpb{
		bytesPerSector:    int(le.Uint16(img[11:])),
		sectorsPerCluster: int(img[13]),
		reserved:          int(le.Uint16(img[14:])),
		fats:              int(img[16]),
		rootEntries:       int(le.Uint16(img[17:])),
		totalSectors:      int(le.Uint16(img[19:])),
		fatSectors:        int(le.Uint16(img[22:])),
	}
	if p.totalSectors == 0 {
		p.totalSectors = int(le.Uint32(img[32:]))
	}
	switch {
	case p.bytesPerSector < 512 || p.bytesPerSector > 4096 || p.bytesPerSector&(p.bytesPerSector-1) != 0:
		return nil, fmt.Errorf("fat12: bad sector size %d", p.bytesPerSector)
	case p.sectorsPerCluster == 0 || p.sectorsPerCluster&(p.sectorsPerCluster-1) != 0:
		return nil, fmt.Errorf("fat12: bad sectors per cluster %d", p.sectorsPerCluster)
	case p.reserved == 0 || p.fats == 0 || p.rootEntries == 0 || p.fatSectors == 0:
		return nil, fmt.Errorf("fat12: not a FAT12/16 boot sector (reserved %d, FATs %d, root entries %d, FAT sectors %d)",
			p.reserved, p.fats, p.rootEntries, p.fatSectors)
	}
	rootSectors := (p.rootEntries*dirEntrySize + p.bytesPerSector - 1) / p.bytesPerSector
	dataStart := p.reserved + p.fats*p.fatSectors + rootSectors
	if p.totalSectors <= dataStart {
		return nil, fmt.Errorf("fat12: %d sectors leave no data area after sector %d", p.totalSectors, dataStart)
	}
	clusters := (p.totalSectors - dataStart) / p.sectorsPerCluster
	if clusters >= maxFAT12Clusters {
		return nil, fmt.Errorf("fat12: %d clusters make a FAT16 or FAT32 volume", clusters)
	}
	if p.fatSectors*p.bytesPerSector < (clusters+2)*3/2+1 {
		return nil, fmt.Errorf("fat12: a FAT of %d sectors cannot map %d clusters", p.fatSectors, clusters)
	}
	if len(img) < p.totalSectors*p.bytesPerSector {
		return nil, fmt.Errorf("fat12: image of %d bytes shorter than its %d sectors", len(img), p.totalSectors)
	}

	fat := img[p.reserved*p.bytesPerSector : (p.reserved+p.fatSectors)*p.bytesPerSector]
	clusterBytes := p.sectorsPerCluster * p.bytesPerSector
	readChain := func(first, size int) ([]byte, error) {
		need := (size + clusterBytes - 1) / clusterBytes
		if need > clusters {
			return nil, fmt.Errorf("%d bytes are more than the volume holds", size)
		}
		data := make([]byte, 0, need*clusterBytes)
		seen := make(map[int]bool, need)
		for c, i := first, 0; i < need; i++ {
			if c < 2 || c >= clusters+2 {
				return nil, fmt.Errorf("cluster %d out of range (chain from %d, cluster %d of %d)", c, first, i+1, need)
			}
			if seen[c] {
				return nil, fmt.Errorf("cluster chain from %d loops at %d", first, c)
			}
			seen[c] = true
			off := (dataStart + (c-2)*p.sectorsPerCluster) * p.bytesPerSector
			data = append(data, img[off:off+clusterBytes]...)
			c = fatEntry(fat, c)
		}
		return data[:size], nil
	}

	v := &Volume{}
	root := img[(p.reserved+p.fats*p.fatSectors)*p.bytesPerSector:]
	root = root[:p.rootEntries*dirEntrySize]
	var long longName
scan:
	for i := range p.rootEntries {
		e := root[i*dirEntrySize : (i+1)*dirEntrySize]
		attr := e[11]
		switch {
		case e[0] == 0x00: // no entry here or after
			break scan
		case e[0] == 0xE5: // deleted
			long = longName{}
		case attr&0x3F == attrLongName:
			long.add(e)
		case attr&attrVolumeID != 0:
			if v.Label == "" {
				v.Label = strings.TrimRight(string(e[:11]), " ")
			}
			long = longName{}
		case attr&attrDir != 0:
			long = longName{}
		default:
			var sfn [11]byte
			copy(sfn[:], e[:11])
			f := File{ShortName: decodeShortName(sfn, e[12])}
			f.Name = long.name(checksum(sfn))
			if f.Name == "" {
				f.Name = f.ShortName
			}
			long = longName{}
			size := int(le.Uint32(e[28:]))
			if size > 0 {
				data, err := readChain(int(le.Uint16(e[26:])), size)
				if err != nil {
					return nil, fmt.Errorf("fat12: %s: %w", f.Name, err)
				}
				f.Data = data
			}
			v.Files = append(v.Files, f)
		}
	}
	if v.Label == "" && img[38] == 0x29 {
		if l := strings.TrimRight(string(img[43:54]), " "); l != "NO NAME" {
			v.Label = l
		}
	}
	return v, nil
}

// fatEntry reads cluster's 12-bit entry.
func fatEntry(fat []byte, cluster int) int {
	v := int(binary.LittleEndian.Uint16(fat[cluster*3/2:]))
	if cluster%2 == 0 {
		return v & 0xFFF
	}
	return v >> 4
}

// decodeShortName is an 8.3 name as Linux shows it: "BASE.EXT", where the Windows NT flags in
// byte 12 lower-case the base (0x08) or the extension (0x10).
func decodeShortName(sfn [11]byte, ntFlags byte) string {
	if sfn[0] == 0x05 { // a name starting with the byte 0xE5
		sfn[0] = 0xE5
	}
	base := strings.TrimRight(string(sfn[:8]), " ")
	ext := strings.TrimRight(string(sfn[8:]), " ")
	if ntFlags&0x08 != 0 {
		base = strings.ToLower(base)
	}
	if ntFlags&0x10 != 0 {
		ext = strings.ToLower(ext)
	}
	if ext == "" {
		return base
	}
	return base + "." + ext
}

// longName gathers the VFAT entries before a short entry. They come last part first, the first
// one's ordinal marked with 0x40, and count down to 1; all carry the short name's checksum.
type longName struct {
	units []uint16
	next  int // the ordinal expected next; 0 once complete
	sum   byte
	ok    bool
}

func (l *longName) add(e []byte) {
	ord := int(e[0] & 0x3F)
	if e[0]&lfnLast != 0 {
		if ord == 0 || ord > 20 { // 20 entries hold 255 characters
			*l = longName{}
			return
		}
		*l = longName{units: make([]uint16, ord*lfnChars), next: ord, sum: e[13], ok: true}
	} else if !l.ok || ord != l.next || e[13] != l.sum {
		*l = longName{}
		return
	}
	for i, off := range lfnCharOffsets {
		l.units[(ord-1)*lfnChars+i] = binary.LittleEndian.Uint16(e[off:])
	}
	l.next--
}

// name is the gathered long name if it is complete and belongs to the short name with this
// checksum, otherwise "".
func (l *longName) name(sum byte) string {
	if !l.ok || l.next != 0 || l.sum != sum {
		return ""
	}
	units := l.units
	for i, u := range units {
		if u == 0x0000 {
			units = units[:i]
			break
		}
	}
	return string(utf16.Decode(units))
}
