package guest

import (
	"archive/tar"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path"
	"slices"
	"syscall"
	"time"

	"golang.org/x/sys/unix"
)

// writeTmpfs writes the tree under dir as a tar: directories, regular files and symlinks with
// their modes, owners and modification times. Nothing else survives a guest's RAM being saved:
// sockets and FIFOs belong to processes, which a snapshot of the simulated guest does not keep,
// and a hard link becomes a copy. What is mounted on the tmpfs is another file system, not what
// this tmpfs holds (a disk or a virtio-fs share is no RAM at all), and the simulated guest's
// mounts do not come back with it: a mount point is kept as an empty directory, a file mounted
// over one is left out. Every path is resolved inside dir, so a symlink the guest made never
// leads the hypervisor outside it.
func writeTmpfs(w io.Writer, dir string) error {
	root, err := os.OpenRoot(dir)
	if err != nil {
		return err
	}
	defer root.Close() //nolint:errcheck
	top, err := root.Lstat(".")
	if err != nil {
		return err
	}
	tmpfsDev := deviceOf(top)
	tw := tar.NewWriter(w)
	err = fs.WalkDir(root.FS(), ".", func(name string, _ fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		info, err := root.Lstat(name)
		if err != nil {
			return err
		}
		mounted := deviceOf(info) != tmpfsDev
		switch mode := info.Mode(); {
		case mode.IsDir():
			if err := writeTmpfsHeader(tw, info, name+"/", ""); err != nil || !mounted {
				return err
			}
			return fs.SkipDir
		case mounted:
			return nil
		case mode.IsRegular():
			return writeTmpfsFile(tw, root, name, tmpfsDev)
		case mode&fs.ModeSymlink != 0:
			link, err := root.Readlink(name)
			if err != nil {
				return err
			}
			return writeTmpfsHeader(tw, info, name, link)
		}
		return nil
	})
	if err != nil {
		return err
	}
	return tw.Close()
}

func deviceOf(info fs.FileInfo) uint64 {
	if st, ok := info.Sys().(*syscall.Stat_t); ok {
		return st.Dev
	}
	return 0
}

func writeTmpfsHeader(tw *tar.Writer, info fs.FileInfo, name, link string) error {
	hdr, err := tar.FileInfoHeader(info, link)
	if err != nil {
		return err
	}
	hdr.Name = name
	// PAX keeps long names and sub-second times. Only the modification time is kept: saving a
	// file reads it (its access time), and no file's change time can be set back.
	hdr.Format = tar.FormatPAX
	hdr.AccessTime, hdr.ChangeTime = time.Time{}, time.Time{}
	return tw.WriteHeader(hdr)
}

// writeTmpfsFile streams one regular file. It is opened without following a symlink and without
// blocking (a FIFO put in its place is no file to read), and must keep the size it has when
// opened: the guest's processes go on running while the simulated VM is paused, and a file they
// change during the snapshot cannot be saved consistently.
func writeTmpfsFile(tw *tar.Writer, root *os.Root, name string, tmpfsDev uint64) error {
	f, err := root.OpenFile(name, os.O_RDONLY|unix.O_NOFOLLOW|unix.O_NONBLOCK, 0)
	if err != nil {
		return err
	}
	defer f.Close() //nolint:errcheck
	info, err := f.Stat()
	if err != nil {
		return err
	}
	if !info.Mode().IsRegular() || deviceOf(info) != tmpfsDev {
		return fmt.Errorf("%s changed while being saved", name)
	}
	if err := writeTmpfsHeader(tw, info, name, ""); err != nil {
		return err
	}
	if n, err := io.CopyN(tw, f, info.Size()); err != nil {
		if errors.Is(err, io.EOF) {
			return fmt.Errorf("%s shrank while being saved (%d of %d bytes)", name, n, info.Size())
		}
		return err
	}
	if now, err := f.Stat(); err != nil || now.Size() != info.Size() {
		return fmt.Errorf("%s changed while being saved", name)
	}
	return nil
}

// readTmpfs recreates under dir (empty but for what the tar brings) the tree writeTmpfs wrote.
// Every name must stay inside dir. A directory gets its mode and times once its entries are in
// place, since adding them would change its times, and a directory without write permission
// takes none.
func readTmpfs(r io.Reader, dir string) error {
	root, err := os.OpenRoot(dir)
	if err != nil {
		return err
	}
	defer root.Close() //nolint:errcheck
	type dirAttrs struct {
		name  string
		mode  fs.FileMode
		mtime time.Time
	}
	var dirs []dirAttrs
	tr := tar.NewReader(r)
	for {
		hdr, err := tr.Next()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			return err
		}
		name := path.Clean(hdr.Name)
		if !fs.ValidPath(name) {
			return fmt.Errorf("entry %q: not a path inside %s", hdr.Name, dir)
		}
		mode := hdr.FileInfo().Mode()
		switch hdr.Typeflag {
		case tar.TypeDir:
			if name != "." {
				if err := root.Mkdir(name, 0o700); err != nil {
					return err
				}
			}
			if err := root.Lchown(name, hdr.Uid, hdr.Gid); err != nil {
				return err
			}
			dirs = append(dirs, dirAttrs{name, mode, hdr.ModTime})
		case tar.TypeReg:
			if err := readTmpfsFile(root, name, tr); err != nil {
				return err
			}
			// Chown before chmod: changing the owner clears setuid and setgid bits.
			if err := root.Lchown(name, hdr.Uid, hdr.Gid); err != nil {
				return err
			}
			if err := root.Chmod(name, mode); err != nil {
				return err
			}
			if err := root.Chtimes(name, hdr.ModTime, hdr.ModTime); err != nil {
				return err
			}
		case tar.TypeSymlink:
			if err := root.Symlink(hdr.Linkname, name); err != nil {
				return err
			}
			if err := root.Lchown(name, hdr.Uid, hdr.Gid); err != nil {
				return err
			}
			if err := lchtimes(root, name, hdr.ModTime); err != nil {
				return err
			}
		default:
			return fmt.Errorf("entry %q: unexpected type %q", hdr.Name, hdr.Typeflag)
		}
	}
	// Innermost first: setting a directory's times is the last change to it.
	for _, d := range slices.Backward(dirs) {
		if err := root.Chmod(d.name, d.mode); err != nil {
			return err
		}
		if err := root.Chtimes(d.name, d.mtime, d.mtime); err != nil {
			return err
		}
	}
	return nil
}

func readTmpfsFile(root *os.Root, name string, r io.Reader) (err error) {
	f, err := root.OpenFile(name, os.O_WRONLY|os.O_CREATE|os.O_EXCL|unix.O_NOFOLLOW, 0o600)
	if err != nil {
		return err
	}
	defer func() {
		if cerr := f.Close(); err == nil {
			err = cerr
		}
	}()
	_, err = io.Copy(f, r)
	return err
}

// lchtimes sets a symlink's own times, which os.Root has no call for: relative to its parent
// directory, opened inside the root.
func lchtimes(root *os.Root, name string, mtime time.Time) error {
	parent, err := root.Open(path.Dir(name))
	if err != nil {
		return err
	}
	defer parent.Close() //nolint:errcheck
	ts := unix.NsecToTimespec(mtime.UnixNano())
	if err := unix.UtimesNanoAt(int(parent.Fd()), path.Base(name), []unix.Timespec{ts, ts}, unix.AT_SYMLINK_NOFOLLOW); err != nil {
		return &fs.PathError{Op: "lchtimes", Path: name, Err: err}
	}
	return nil
}
