// Package guestvolume copies a host directory or file into a VM guest through a shell command run
// there, and keeps the copy in step with the host. A guest cannot see the node's files: the
// kubelet's volumes (ConfigMaps, Secrets, projected tokens, emptyDir, hostPath) reach it as a tar
// stream on the command's stdin, and the command applies it under the guest's /run and binds the
// result at the container path.
//
// Updates keep the kubelet's own ordering, so its atomic swaps stay atomic in the guest: new files
// and directories land first, then symbolic links are renamed into place (a ConfigMap's `..data`
// switches in one rename), then what the host removed goes.
package guestvolume

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
)

// Kind is what a tree entry is.
type Kind uint8

// Entry kinds. Anything else on the host (sockets, device nodes, FIFOs) has no meaning in a guest
// and is left out; Scan reports it.
const (
	KindDir Kind = iota + 1
	KindFile
	KindLink
)

// Entry is what is known of one path: enough to tell whether it changed.
type Entry struct {
	Kind   Kind
	Mode   fs.FileMode
	Size   int64
	MTime  int64
	Target string // a link's
}

// Tree is a host volume as scanned: its entries by slash-separated path relative to the root, or
// for a volume that is one file, that file under the name FileName.
type Tree struct {
	File    bool
	Entries map[string]Entry
	Bytes   int64
	// Skipped are the paths left out: not a directory, regular file or link.
	Skipped []string
}

// FileName is the name a single-file volume has in its guest data directory.
const FileName = "data"

// Limits bound what one volume may hold: everything goes through a command's stdin and is kept
// in the guest's memory.
type Limits struct {
	MaxBytes   int64
	MaxEntries int
}

// TooLargeError says a volume is past the limits.
type TooLargeError struct {
	Path   string
	Limits Limits
}

func (e *TooLargeError) Error() string {
	return fmt.Sprintf("%s holds more than %d bytes or %d files, which is what cocoon-cri copies into a guest",
		e.Path, e.Limits.MaxBytes, e.Limits.MaxEntries)
}

var errStop = errors.New("stop")

// Scan reads what root (a directory or a regular file, with symbolic links already resolved)
// holds. Links inside it are kept as links, as the kubelet's atomic writer needs.
func Scan(root string, lim Limits) (Tree, error) {
	info, err := os.Lstat(root)
	if err != nil {
		return Tree{}, err
	}
	t := Tree{Entries: map[string]Entry{}}
	switch {
	case info.Mode().IsRegular():
		t.File = true
		if _, err := t.add(FileName, root, info); err != nil {
			return Tree{}, err
		}
		if t.Bytes > lim.MaxBytes {
			return Tree{}, &TooLargeError{Path: root, Limits: lim}
		}
		return t, nil
	case !info.IsDir():
		return Tree{}, fmt.Errorf("%s is a %s: only a directory or a regular file can be copied into a guest", root, kindWord(info.Mode()))
	}
	var tooLarge bool
	err = filepath.WalkDir(root, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if path == root {
			return nil
		}
		rel, err := filepath.Rel(root, path)
		if err != nil {
			return err
		}
		info, err := d.Info()
		if err != nil {
			return err
		}
		kept, err := t.add(filepath.ToSlash(rel), path, info)
		if err != nil {
			return err
		}
		if !kept {
			t.Skipped = append(t.Skipped, rel)
		}
		if t.Bytes > lim.MaxBytes || len(t.Entries) > lim.MaxEntries {
			tooLarge = true
			return errStop
		}
		return nil
	})
	if tooLarge {
		return Tree{}, &TooLargeError{Path: root, Limits: lim}
	}
	if err != nil {
		return Tree{}, err
	}
	return t, nil
}

// add records one path; false for a kind a guest cannot be given.
func (t *Tree) add(rel, path string, info fs.FileInfo) (bool, error) {
	e := Entry{Mode: info.Mode().Perm() | info.Mode()&(fs.ModeSetuid|fs.ModeSetgid|fs.ModeSticky), MTime: info.ModTime().UnixNano()}
	switch {
	case info.IsDir():
		e.Kind = KindDir
	case info.Mode().IsRegular():
		e.Kind, e.Size = KindFile, info.Size()
		t.Bytes += e.Size
	case info.Mode()&fs.ModeSymlink != 0:
		target, err := os.Readlink(path)
		if err != nil {
			return false, err
		}
		e.Kind, e.Target = KindLink, target
	default:
		return false, nil
	}
	t.Entries[rel] = e
	return true, nil
}

func kindWord(m fs.FileMode) string {
	switch {
	case m&fs.ModeSocket != 0:
		return "socket"
	case m&fs.ModeNamedPipe != 0:
		return "FIFO"
	case m&fs.ModeDevice != 0:
		return "device node"
	}
	return "special file"
}
