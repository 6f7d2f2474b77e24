package guestvolume

import (
	"archive/tar"
	"bytes"
	"fmt"
	"io"
	"maps"
	"os"
	"path"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"time"
)

// Update is what brings a guest's copy from one tree to the next.
type Update struct {
	// Full: the guest's copy is unknown (first delivery, a restart of cocoon-cri, a guest that
	// lost it): everything is sent, and the guest drops what the tree lacks.
	Full bool
	// Put are the directories and regular files to write, parents first.
	Put []string
	// Links are the symbolic links to rename into place.
	Links []string
	// Replace are paths whose kind changed: removed before anything is written.
	Replace []string
	// Remove are paths the host no longer has: removed last.
	Remove []string
}

// Diff is the update from old to next; with no old tree (nil), a full one.
func Diff(old *Tree, next Tree) Update {
	u := Update{Full: old == nil}
	for _, p := range slices.Sorted(maps.Keys(next.Entries)) {
		e := next.Entries[p]
		var prev Entry
		var had bool
		if old != nil {
			prev, had = old.Entries[p]
		}
		if had && prev == e {
			continue
		}
		if had && prev.Kind != e.Kind {
			u.Replace = append(u.Replace, p)
		}
		if e.Kind == KindLink {
			u.Links = append(u.Links, p)
		} else {
			u.Put = append(u.Put, p)
		}
	}
	if old != nil {
		for _, p := range slices.Sorted(maps.Keys(old.Entries)) {
			if _, ok := next.Entries[p]; !ok && !under(p, u.Remove) {
				u.Remove = append(u.Remove, p)
			}
		}
	}
	return u
}

// Empty reports whether the guest's copy is already the tree.
func (u Update) Empty() bool {
	return !u.Full && len(u.Put)+len(u.Links)+len(u.Replace)+len(u.Remove) == 0
}

// under reports whether p lies inside one of dirs (sorted, so a parent comes before its children).
func under(p string, dirs []string) bool {
	for _, d := range dirs {
		if strings.HasPrefix(p, d+"/") {
			return true
		}
	}
	return false
}

// Staging layout of the tar stream the guest's command reads.
const (
	stageFiles   = "f"
	stageLinks   = "l"
	stageReplace = "replace"
	stageRemove  = "remove"
	// stageComplete ends every stream: a stream cut short (the host's read of a file failed, the
	// volume changing under it) lacks it, and the guest applies nothing of it. tar takes a stream
	// cut between two entries for a whole one.
	stageComplete = "complete"
)

// WriteTar writes the update for the tree read from root as the tar stream the guest's command
// extracts. Files are read as they are now: one that changed since the scan is sent as it is, and
// the next scan sees the change again; one that is gone fails the stream, whose end (stageComplete)
// then never comes, and the guest applies none of it (ExitIncomplete).
func (u Update) WriteTar(w io.Writer, root string, t Tree) error {
	tw := tar.NewWriter(w)
	now := time.Now()
	for _, dir := range []string{stageFiles, stageLinks} {
		if err := tw.WriteHeader(&tar.Header{Typeflag: tar.TypeDir, Name: dir + "/", Mode: 0o755, ModTime: now}); err != nil {
			return err
		}
	}
	for _, list := range []struct {
		name  string
		paths []string
	}{{stageReplace, u.Replace}, {stageRemove, u.Remove}} {
		if err := writeList(tw, list.name, list.paths, now); err != nil {
			return err
		}
	}
	for _, p := range u.Put {
		src := filepath.Join(root, filepath.FromSlash(p))
		if t.File {
			src = root
		}
		if err := writeEntry(tw, path.Join(stageFiles, p), src, t.Entries[p]); err != nil {
			return err
		}
	}
	for _, p := range u.Links {
		e := t.Entries[p]
		hdr := &tar.Header{Typeflag: tar.TypeSymlink, Name: path.Join(stageLinks, p), Linkname: e.Target,
			Mode: 0o777, ModTime: time.Unix(0, e.MTime)}
		if err := tw.WriteHeader(hdr); err != nil {
			return err
		}
	}
	if err := tw.WriteHeader(&tar.Header{Typeflag: tar.TypeReg, Name: stageComplete, Mode: 0o600, ModTime: now}); err != nil {
		return err
	}
	return tw.Close()
}

// writeList writes paths NUL-separated, for xargs -0.
func writeList(tw *tar.Writer, name string, paths []string, now time.Time) error {
	var b bytes.Buffer
	for _, p := range paths {
		b.WriteString(p)
		b.WriteByte(0)
	}
	if err := tw.WriteHeader(&tar.Header{Typeflag: tar.TypeReg, Name: name, Mode: 0o600, Size: int64(b.Len()), ModTime: now}); err != nil {
		return err
	}
	_, err := tw.Write(b.Bytes())
	return err
}

func writeEntry(tw *tar.Writer, name, src string, e Entry) error {
	hdr := &tar.Header{Name: name, Mode: int64(e.Mode.Perm()), ModTime: time.Unix(0, e.MTime)}
	if e.Kind == KindDir {
		hdr.Typeflag, hdr.Name = tar.TypeDir, name+"/"
		setOwner(hdr, src)
		return tw.WriteHeader(hdr)
	}
	f, err := os.Open(src) //nolint:gosec // a volume the kubelet gave
	if err != nil {
		return fmt.Errorf("read %s: %w", src, err)
	}
	defer f.Close() //nolint:errcheck
	info, err := f.Stat()
	if err != nil {
		return err
	}
	if !info.Mode().IsRegular() {
		return fmt.Errorf("%s is no longer a regular file", src)
	}
	hdr.Typeflag, hdr.Size, hdr.Mode, hdr.ModTime = tar.TypeReg, info.Size(), int64(info.Mode().Perm()), info.ModTime()
	setOwner(hdr, src)
	if err := tw.WriteHeader(hdr); err != nil {
		return err
	}
	if _, err := io.CopyN(tw, f, info.Size()); err != nil {
		return fmt.Errorf("read %s: %w", src, err)
	}
	return nil
}

// setOwner keeps the numeric owner: the kubelet gives volumes the pod's fsGroup.
func setOwner(hdr *tar.Header, src string) {
	if info, err := os.Lstat(src); err == nil {
		if st, ok := info.Sys().(*syscall.Stat_t); ok {
			hdr.Uid, hdr.Gid = int(st.Uid), int(st.Gid)
		}
	}
}
