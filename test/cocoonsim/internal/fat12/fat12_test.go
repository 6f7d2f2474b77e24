package fat12

import (
	"bytes"
	"encoding/binary"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"
)

// stamp is the time every test image carries: FAT keeps even seconds.
var stamp = time.Date(2026, time.March, 14, 15, 9, 26, 0, time.Local)

func mustBuild(t *testing.T, label string, files map[string][]byte) []byte {
	t.Helper()
	var buf bytes.Buffer
	if err := Write(&buf, label, files, stamp); err != nil {
		t.Fatal(err)
	}
	return buf.Bytes()
}

func TestRoundTrip(t *testing.T) {
	files := map[string][]byte{
		"meta-data":                            []byte("instance-id: 0123\nlocal-hostname: web\n"),
		"network-config":                       []byte("version: 2\n"),
		"user-data":                            []byte("#cloud-config\n"),
		"README.TXT":                           []byte("an 8.3 name needs no long name\n"),
		"empty":                                nil,
		"thirteen-char":                        []byte("a long name of exactly one entry, no NUL"),
		"a-name-that-takes-three-entries.yaml": bytes.Repeat([]byte("spans clusters\n"), 100), // 1500 bytes
		"grüße":                                []byte("not ASCII"),
	}
	img := mustBuild(t, "cidata", files)
	if len(img) != ImageSize {
		t.Fatalf("image of %d bytes, want %d", len(img), ImageSize)
	}
	v, err := Parse(img)
	if err != nil {
		t.Fatal(err)
	}
	if v.Label != "CIDATA" {
		t.Fatalf("label %q", v.Label)
	}
	var names []string
	for _, f := range v.Files {
		names = append(names, f.Name)
		if !bytes.Equal(f.Data, files[f.Name]) {
			t.Errorf("%s: %q, want %q", f.Name, f.Data, files[f.Name])
		}
	}
	// The writer's order: by name, byte-wise.
	want := []string{"README.TXT", "a-name-that-takes-three-entries.yaml", "empty", "grüße", "meta-data", "network-config", "thirteen-char", "user-data"}
	if !slices.Equal(names, want) {
		t.Fatalf("files %q, want %q", names, want)
	}
	if f, ok := v.Lookup("META-D~4"); !ok || f.Name != "meta-data" {
		t.Fatalf("lookup by short name: %+v %v", f, ok)
	}
	if f, ok := v.Lookup("Meta-Data"); !ok || string(f.Data) != string(files["meta-data"]) {
		t.Fatalf("lookup without regard to case: %+v %v", f, ok)
	}
	if _, ok := v.Lookup("vendor-data"); ok {
		t.Fatal("found a file that is not there")
	}
}

// TestCocoonsLayout pins the bytes of the seed cocoon writes for its three files.
func TestCocoonsLayout(t *testing.T) {
	img := mustBuild(t, "CIDATA", map[string][]byte{
		"meta-data":      []byte("instance-id: x\n"),
		"user-data":      bytes.Repeat([]byte{'u'}, 600), // two clusters
		"network-config": []byte("version: 2\n"),
	})
	le := binary.LittleEndian
	boot := img[:SectorSize]
	for _, c := range []struct {
		what      string
		got, want any
	}{
		{"jump", string(boot[:3]), "\xeb\x3c\x90"},
		{"OEM name", string(boot[3:11]), "COCOON  "},
		{"bytes per sector", le.Uint16(boot[11:]), uint16(512)},
		{"sectors per cluster", boot[13], byte(1)},
		{"reserved sectors", le.Uint16(boot[14:]), uint16(1)},
		{"FATs", boot[16], byte(2)},
		{"root entries", le.Uint16(boot[17:]), uint16(128)},
		{"sectors", le.Uint16(boot[19:]), uint16(2048)},
		{"media", boot[21], byte(0xF8)},
		{"sectors per FAT", le.Uint16(boot[22:]), uint16(6)},
		{"sectors per track", le.Uint16(boot[24:]), uint16(32)},
		{"heads", le.Uint16(boot[26:]), uint16(64)},
		{"drive", boot[36], byte(0x80)},
		{"extended signature", boot[38], byte(0x29)},
		{"serial", le.Uint32(boot[39:]), uint32(stamp.UnixNano())}, //nolint:gosec // as the writer
		{"label", string(boot[43:54]), "CIDATA     "},
		{"type", string(boot[54:62]), "FAT12   "},
		{"signature", le.Uint16(boot[510:]), uint16(0xAA55)},
	} {
		if c.got != c.want {
			t.Errorf("boot sector %s: %v, want %v", c.what, c.got, c.want)
		}
	}

	fat1, fat2 := img[512:512+3072], img[512+3072:512+2*3072]
	if !bytes.Equal(fat1, fat2) {
		t.Error("the two FATs differ")
	}
	// meta-data in cluster 2, network-config in 3, user-data in 4 and 5.
	for c, want := range map[int]int{0: 0xFF8, 1: 0xFFF, 2: 0xFFF, 3: 0xFFF, 4: 5, 5: 0xFFF, 6: 0} {
		if got := fatEntry(fat1, c); got != want {
			t.Errorf("FAT[%d] = %#x, want %#x", c, got, want)
		}
	}

	root := img[13*512 : 21*512]
	entry := func(i int) []byte { return root[i*32 : (i+1)*32] }
	if e := entry(0); string(e[:11]) != "CIDATA     " || e[11] != attrVolumeID {
		t.Errorf("first root entry %q attr %#x, want the volume label", e[:11], e[11])
	}
	date, clock := le.Uint16(entry(0)[24:]), le.Uint16(entry(0)[22:])
	if got := time.Date(1980+int(date>>9), time.Month(date>>5&15), int(date&31), int(clock>>11), int(clock>>5&63), int(clock&31)*2, 0, time.Local); !got.Equal(stamp) {
		t.Errorf("label entry stamped %v, want %v", got, stamp)
	}
	// Each lower-case name: its long-name entries (network-config needs two), then its short
	// entry.
	for _, want := range []struct {
		first, lfns int
		sfn         string
		cluster     uint16
		size        uint32
	}{{1, 1, "META-D~1   ", 2, 15}, {3, 2, "NETWOR~2   ", 3, 11}, {6, 1, "USER-D~3   ", 4, 600}} {
		sfn := entry(want.first + want.lfns)
		if string(sfn[:11]) != want.sfn || sfn[11] != attrArchive || le.Uint16(sfn[26:]) != want.cluster || le.Uint32(sfn[28:]) != want.size {
			t.Errorf("entry %d: %q attr %#x cluster %d size %d, want %+v", want.first+want.lfns, sfn[:11], sfn[11], le.Uint16(sfn[26:]), le.Uint32(sfn[28:]), want)
		}
		var name [11]byte
		copy(name[:], sfn[:11])
		for i := range want.lfns {
			ord := byte(want.lfns - i)
			if i == 0 {
				ord |= 0x40
			}
			if lfn := entry(want.first + i); lfn[0] != ord || lfn[11] != attrLongName || lfn[13] != checksum(name) {
				t.Errorf("entry %d: ordinal %#x attr %#x checksum %#x, want long-name entry %#x for %s", want.first+i, lfn[0], lfn[11], lfn[13], ord, want.sfn)
			}
		}
	}
	if entry(8)[0] != 0 {
		t.Error("root directory goes on after the last file")
	}
	if got := img[21*512 : 21*512+15]; string(got) != "instance-id: x\n" {
		t.Errorf("cluster 2 holds %q", got)
	}
	if rest := img[21*512+4*512:]; bytes.ContainsFunc(rest, func(r rune) bool { return r != 0 }) {
		t.Error("data after the last file's clusters is not zero")
	}
}

func TestLimits(t *testing.T) {
	var buf bytes.Buffer
	if err := Write(&buf, "CIDATA", map[string][]byte{"big": make([]byte, dataClusters*SectorSize+1)}, stamp); err == nil || !strings.Contains(err.Error(), "not enough space for big") {
		t.Fatalf("a file larger than the volume: %v", err)
	}
	if err := Write(&buf, "CIDATA", map[string][]byte{"fits": make([]byte, dataClusters*SectorSize)}, stamp); err != nil {
		t.Fatalf("a file that fills the volume: %v", err)
	}
	many := map[string][]byte{}
	for i := range 127 { // 127 upper-case 8.3 names and the label fill the root directory
		many[fmt.Sprintf("F%d", i)] = nil
	}
	if err := Write(&buf, "CIDATA", many, stamp); err != nil {
		t.Fatalf("a full root directory: %v", err)
	}
	many["ONEMORE"] = nil
	if err := Write(&buf, "CIDATA", many, stamp); err == nil || !strings.Contains(err.Error(), "root directory full") {
		t.Fatalf("one entry too many: %v", err)
	}
}

func TestParseRefusesWhatIsNoFAT12Volume(t *testing.T) {
	// meta-data takes clusters 2 and 3; its short entry is the root directory's third.
	good := mustBuild(t, "CIDATA", map[string][]byte{"meta-data": make([]byte, 600)})
	withBoot := func(edit func(b []byte)) []byte {
		img := bytes.Clone(good)
		edit(img)
		return img
	}
	for name, img := range map[string][]byte{
		"JSON":          []byte(`{"instance-id":"x","hostname":"web"}`),
		"empty":         nil,
		"no signature":  withBoot(func(b []byte) { b[510] = 0 }),
		"truncated":     good[:ImageSize/2],
		"sector size":   withBoot(func(b []byte) { binary.LittleEndian.PutUint16(b[11:], 300) }),
		"FAT16-sized":   withBoot(func(b []byte) { binary.LittleEndian.PutUint16(b[19:], 0); binary.LittleEndian.PutUint32(b[32:], 1<<16) }),
		"no FAT":        withBoot(func(b []byte) { binary.LittleEndian.PutUint16(b[22:], 0) }),
		"broken chain":  withBoot(func(b []byte) { putFATEntry(b[512:], 2, 0) }),
		"bad start":     withBoot(func(b []byte) { binary.LittleEndian.PutUint16(b[13*512+2*32+26:], 4000) }),
		"looping chain": withBoot(func(b []byte) { putFATEntry(b[512:], 2, 2) }),
	} {
		if v, err := Parse(img); err == nil {
			t.Errorf("%s: parsed as %+v", name, v)
		}
	}
}

// TestLongNameMustMatchItsShortEntry: a long name whose checksum is not its short entry's (left
// by a system that knows no long names) is not the file's name.
func TestLongNameMustMatchItsShortEntry(t *testing.T) {
	img := mustBuild(t, "CIDATA", map[string][]byte{"meta-data": []byte("x")})
	img[13*512+2*32] = 'X' // rename the short entry META-D~1 to XETA-D~1
	v, err := Parse(img)
	if err != nil {
		t.Fatal(err)
	}
	if len(v.Files) != 1 || v.Files[0].Name != "XETA-D~1" {
		t.Fatalf("files %+v", v.Files)
	}
}

// TestIndependentToolsReadTheImage checks the image with the host's own FAT tools, each when
// installed: blkid (util-linux, which hack/setup.sh installs), fsck.fat (dosfstools) and mdir
// (mtools).
func TestIndependentToolsReadTheImage(t *testing.T) {
	path := filepath.Join(t.TempDir(), "cidata.img")
	files := map[string][]byte{
		"meta-data":      []byte("instance-id: i-1\nlocal-hostname: web\n"),
		"network-config": []byte("version: 2\n"),
		"user-data":      bytes.Repeat([]byte("#cloud-config\n"), 80),
	}
	if err := os.WriteFile(path, mustBuild(t, "CIDATA", files), 0o600); err != nil {
		t.Fatal(err)
	}
	ran := 0
	tool := func(name string, args ...string) (string, bool) {
		bin, err := exec.LookPath(name)
		if err != nil {
			t.Logf("%s not installed: not checked", name)
			return "", false
		}
		ran++
		out, err := exec.Command(bin, args...).CombinedOutput() //nolint:gosec // test tools
		if err != nil {
			t.Errorf("%s %s: %v\n%s", name, strings.Join(args, " "), err, out)
		}
		return string(out), true
	}
	if out, ok := tool("blkid", "-p", "-o", "export", path); ok {
		for _, want := range []string{"TYPE=vfat", "SEC_TYPE=msdos", "LABEL=CIDATA"} {
			if !strings.Contains(out, want+"\n") {
				t.Errorf("blkid: no %s in\n%s", want, out)
			}
		}
	}
	if out, ok := tool("fsck.fat", "-n", "-v", path); ok {
		t.Logf("fsck.fat:\n%s", out)
	}
	if out, ok := tool("mdir", "-i", path, "::"); ok {
		for name := range files {
			if !strings.Contains(out, name) {
				t.Errorf("mdir does not list %s:\n%s", name, out)
			}
		}
	}
	if ran == 0 {
		t.Skip("none of blkid, fsck.fat and mdir is installed")
	}
}
