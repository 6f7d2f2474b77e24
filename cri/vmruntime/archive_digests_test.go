package vmruntime

import (
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/cocoonstack/cocoon-cri/imagestore"
)

func TestArchiveDigestsReadAFileOnce(t *testing.T) {
	reads := 0
	d := archiveDigests{read: func(path string) (string, error) { reads++; return imagestore.FileDigest(path) }}
	path := filepath.Join(t.TempDir(), "ckpt.tar")
	if err := os.WriteFile(path, []byte("guest memory"), 0o600); err != nil {
		t.Fatal(err)
	}
	settled := time.Now().Add(time.Hour)
	first, err := d.digest(path, settled)
	if err != nil {
		t.Fatal(err)
	}
	if again, _ := d.digest(path, settled); again != first || reads != 1 {
		t.Fatalf("second digest %s after %d reads: an unchanged file is read once", again, reads)
	}
	// Any change to the file is a new read, and a new digest.
	if err := os.WriteFile(path, []byte("other memory"), 0o600); err != nil {
		t.Fatal(err)
	}
	if changed, _ := d.digest(path, settled); changed == first || reads != 2 {
		t.Fatalf("digest %s after %d reads: a rewritten file is read again", changed, reads)
	}
	// A file changed just now is not remembered: a second write in the same timestamp grain
	// could keep its size and times.
	fresh := filepath.Join(t.TempDir(), "fresh.tar")
	if err := os.WriteFile(fresh, []byte("x"), 0o600); err != nil {
		t.Fatal(err)
	}
	info, _ := os.Stat(fresh)
	for range 2 {
		if _, err := d.digest(fresh, info.ModTime()); err != nil {
			t.Fatal(err)
		}
	}
	if reads != 4 {
		t.Fatalf("%d reads: a file modified within the settle time must be read each time", reads)
	}
}
