// Package dirtree describes a directory tree for tests that must leave one as they found it (a
// checkpoint that is only read): every entry's path, mode, size and modification time, and the
// digest of the files small enough to read. A COW disk is gigabytes of holes: its size and time
// tell.
package dirtree

import (
	"crypto/sha256"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// maxRead is the largest file whose content is read.
const maxRead = 64 << 20

// Describe lists every entry under dir, one line each, in lexical order.
func Describe(t testing.TB, dir string) string {
	t.Helper()
	var b strings.Builder
	err := filepath.WalkDir(dir, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		info, err := d.Info()
		if err != nil {
			return err
		}
		fmt.Fprintf(&b, "%s %v %d %d", strings.TrimPrefix(path, dir), info.Mode(), info.Size(), info.ModTime().UnixNano())
		if d.Type().IsRegular() && info.Size() <= maxRead {
			data, err := os.ReadFile(path)
			if err != nil {
				return err
			}
			fmt.Fprintf(&b, " %x", sha256.Sum256(data))
		}
		b.WriteByte('\n')
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return b.String()
}
