package vmruntime

import (
	"fmt"
	"os"
	"sync"
	"syscall"
	"time"

	"github.com/cocoonstack/cocoon-cri/imagestore"
)

// settleTime is how long a file must have been left unmodified before its digest is remembered: a
// second write within the file system's timestamp grain could leave size and times unchanged.
const settleTime = 50 * time.Millisecond

// archiveDigests remembers the digests of checkpoint archives by the files' identity, so that a
// second RestorePod of one checkpoint does not read its gigabytes of guest memory again to learn
// what it already imported.
type archiveDigests struct {
	mu    sync.Mutex
	known map[string]archiveDigest // by path
	// read hashes a file; nil is imagestore.FileDigest.
	read func(path string) (string, error)
}

// maxArchiveDigests bounds what is remembered: past it, everything is forgotten at once.
const maxArchiveDigests = 1024

type archiveDigest struct {
	identity fileIdentity
	digest   string
}

// fileIdentity changes whenever the file's content can have: another file at the path, a write,
// a truncation, a touch (ctime moves with any change, even one that restores mtime).
type fileIdentity struct {
	dev, ino     uint64
	size         int64
	mtime, ctime time.Time
}

func identityOf(path string) (fileIdentity, time.Time, error) {
	info, err := os.Stat(path)
	if err != nil {
		return fileIdentity{}, time.Time{}, err
	}
	st, ok := info.Sys().(*syscall.Stat_t)
	if !ok {
		return fileIdentity{}, time.Time{}, fmt.Errorf("stat %s: no inode information", path)
	}
	ctime := time.Unix(st.Ctim.Sec, st.Ctim.Nsec)
	id := fileIdentity{dev: st.Dev, ino: st.Ino, size: info.Size(), mtime: info.ModTime(), ctime: ctime}
	return id, ctime, nil
}

// digest is the file's sha256 digest, remembered while the file stays the same.
func (d *archiveDigests) digest(path string, now time.Time) (string, error) {
	before, changed, err := identityOf(path)
	if err != nil {
		return "", err
	}
	d.mu.Lock()
	known, ok := d.known[path]
	d.mu.Unlock()
	if ok && known.identity == before {
		return known.digest, nil
	}
	read := d.read
	if read == nil {
		read = imagestore.FileDigest
	}
	digest, err := read(path)
	if err != nil {
		return "", err
	}
	after, _, err := identityOf(path)
	if err != nil {
		return "", err
	}
	// Remembered only when nothing changed while it was read and the file has settled.
	if after == before && now.Sub(changed) >= settleTime {
		d.mu.Lock()
		if d.known == nil || len(d.known) >= maxArchiveDigests {
			d.known = map[string]archiveDigest{}
		}
		d.known[path] = archiveDigest{identity: before, digest: digest}
		d.mu.Unlock()
	}
	return digest, nil
}
