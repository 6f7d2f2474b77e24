package guest

import (
	"bufio"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"

	"golang.org/x/sys/unix"
)

// A guest mounts a virtio-fs tag with `mount -t virtiofs TAG DIR`, which its kernel serves from
// the device of that tag. The simulated guest's kernel is the hypervisor process: util-linux's
// mount(8) runs the helper /sbin/mount.virtiofs, which the guest has from its first boot; the
// helper is the simulator binary (the guest's PID 1, /proc/1/exe) and asks the hypervisor, on a
// socket in the VM's run dir, to mount the tag's shared directory at DIR in the helper's own
// mount namespace. The guest's mount is a bind of the directory virtiofsd exports (a clone of its
// mount, moved into the guest), so what the guest writes reaches the host and the host's changes
// show at once, as with virtio-fs without caching.

const (
	// fsMountHelperEnv makes the simulator binary the guest's mount.virtiofs; its value is the
	// hypervisor's socket.
	fsMountHelperEnv = "_COCOON_SIM_VIRTIOFS_MOUNT"
	// fsMountSocketName is the hypervisor's socket for the guest's virtio-fs mounts, in the run
	// dir (which the guest sees).
	fsMountSocketName = "fs.sock"
	// fsMountHelperPath is where mount(8) looks for a virtiofs helper.
	fsMountHelperPath = "/sbin/mount.virtiofs"
	// mountExitFailure is mount(8)'s exit code for a failed mount.
	mountExitFailure = 32
)

type fsMountRequest struct {
	Tag      string `json:"tag"`
	Target   string `json:"target"`
	ReadOnly bool   `json:"readonly,omitempty"`
}

type fsMountReply struct {
	Errno int    `json:"errno,omitempty"`
	Error string `json:"error,omitempty"`
}

// writeFsMountHelper installs the guest's mount.virtiofs (on the guest's own root, so the host
// never has it). It runs in the guest after its mounts are set up.
func writeFsMountHelper(runDir string) error {
	realRunDir, err := filepath.EvalSymlinks(runDir)
	if err != nil {
		return fmt.Errorf("resolve run dir: %w", err)
	}
	script := fmt.Sprintf("#!/bin/sh\n"+
		"# mount(8) runs this for -t virtiofs: cocoon-sim's guest kernel mounts the tag's device.\n"+
		"%s=%s exec /proc/1/exe \"$@\"\n", fsMountHelperEnv, shellQuote(filepath.Join(realRunDir, fsMountSocketName)))
	if err := os.MkdirAll(filepath.Dir(fsMountHelperPath), 0o755); err != nil {
		return fmt.Errorf("guest %s: %w", fsMountHelperPath, err)
	}
	if err := os.WriteFile(fsMountHelperPath, []byte(script), 0o755); err != nil { //nolint:gosec // an executable
		return fmt.Errorf("guest %s: %w", fsMountHelperPath, err)
	}
	return nil
}

func shellQuote(s string) string { return "'" + strings.ReplaceAll(s, "'", `'\''`) + "'" }

// runFsMountHelper is mount.virtiofs TAG DIR [-sfnv] [-N NS] [-o OPTIONS] [-t TYPE], as mount(8)
// calls it, printing mount(8)'s messages and exiting with its codes.
func runFsMountHelper(sock string, args []string) int {
	var pos, opts []string
	fake := false
	for i := 0; i < len(args); i++ {
		switch a := args[i]; {
		case a == "-o" || a == "-N" || a == "-t":
			if i+1 < len(args) && a == "-o" {
				opts = append(opts, strings.Split(args[i+1], ",")...)
			}
			i++
		case strings.HasPrefix(a, "-") && len(a) > 1:
			fake = fake || strings.Contains(a, "f")
		default:
			pos = append(pos, a)
		}
	}
	if len(pos) != 2 {
		fmt.Fprintln(os.Stderr, "usage: mount.virtiofs TAG DIR [-o OPTIONS]") //nolint:errcheck
		return 1
	}
	tag, target := pos[0], pos[1]
	fail := func(msg string) int {
		fmt.Fprintf(os.Stderr, "mount: %s: %s.\n       dmesg(1) may have more information after failed mount system call.\n", target, msg) //nolint:errcheck
		return mountExitFailure
	}
	switch st, err := os.Stat(target); {
	case errors.Is(err, fs.ErrNotExist):
		return fail("mount point does not exist")
	case err != nil:
		return fail(err.Error())
	case !st.IsDir():
		return fail("mount point is not a directory")
	}
	if fake {
		return 0
	}
	readonly := false
	for _, o := range opts {
		switch o {
		case "ro":
			readonly = true
		case "rw":
			readonly = false
		}
	}
	abs, err := filepath.Abs(target)
	if err != nil {
		return fail(err.Error())
	}
	reply, err := requestFsMount(sock, fsMountRequest{Tag: tag, Target: abs, ReadOnly: readonly})
	switch {
	case err != nil:
		// No virtio-fs device at all: the kernel finds no instance with the tag.
		reply = fsMountReply{Errno: int(unix.EINVAL)}
	case reply.Errno == 0:
		return 0
	}
	if reply.Errno == int(unix.EINVAL) {
		return fail(fmt.Sprintf("wrong fs type, bad option, bad superblock on %s, missing codepage or helper program, or other error", tag))
	}
	return fail(reply.Error)
}

func requestFsMount(sock string, req fsMountRequest) (fsMountReply, error) {
	conn, err := net.Dial("unix", sock)
	if err != nil {
		return fsMountReply{}, err
	}
	defer conn.Close() //nolint:errcheck
	if err := json.NewEncoder(conn).Encode(req); err != nil {
		return fsMountReply{}, err
	}
	var reply fsMountReply
	if err := json.NewDecoder(bufio.NewReader(conn)).Decode(&reply); err != nil {
		return fsMountReply{}, err
	}
	return reply, nil
}

// listenFsMounts opens the socket the guest's mount helper asks on, once the VM has a virtio-fs
// device. The caller holds v.mu.
func (v *vmm) listenFsMounts() error {
	if v.fsMounts != nil {
		return nil
	}
	path := filepath.Join(v.runDir, fsMountSocketName)
	if err := os.Remove(path); err != nil && !errors.Is(err, fs.ErrNotExist) {
		return err
	}
	ln, err := net.ListenUnix("unix", &net.UnixAddr{Name: path, Net: "unix"})
	if err != nil {
		return err
	}
	v.fsMounts = ln
	go func() {
		for {
			conn, err := ln.AcceptUnix()
			if err != nil {
				return
			}
			go v.serveFsMount(conn)
		}
	}()
	return nil
}

// serveFsMount answers one mount request of the guest, as the guest kernel's virtio-fs driver:
// a tag no device has is EINVAL (the kernel logs "virtio-fs: tag <TAG> not found").
func (v *vmm) serveFsMount(conn *net.UnixConn) {
	defer conn.Close() //nolint:errcheck
	var req fsMountRequest
	if err := json.NewDecoder(conn).Decode(&req); err != nil {
		return
	}
	reply := fsMountReply{}
	if err := v.mountFs(conn, req); err != nil {
		reply = fsMountReply{Errno: int(unix.EIO), Error: err.Error()}
		if errors.Is(err, unix.EINVAL) {
			reply.Errno = int(unix.EINVAL)
		}
	}
	_ = json.NewEncoder(conn).Encode(reply)
}

func (v *vmm) mountFs(conn *net.UnixConn, req fsMountRequest) error {
	pid, err := peerPID(conn)
	if err != nil {
		return err
	}
	v.mu.Lock()
	defer v.mu.Unlock()
	var dev *fsDevice
	if v.cfg != nil {
		if i := slices.IndexFunc(v.cfg.Fs, func(f Fs) bool { return f.Tag == req.Tag }); i >= 0 {
			dev = v.fsDevs[v.cfg.Fs[i].ID]
		}
	}
	if _, simulated := v.os.(*simulatedOS); dev == nil || !simulated {
		v.console.Printf("%s virtio-fs: tag <%s> not found", v.uptime(), req.Tag)
		return unix.EINVAL
	}
	treeFD, err := unix.OpenTree(int(dev.dir.Fd()), "", unix.AT_EMPTY_PATH|unix.OPEN_TREE_CLONE|unix.OPEN_TREE_CLOEXEC|unix.AT_RECURSIVE)
	if err != nil {
		return fmt.Errorf("clone shared directory: %w", err)
	}
	tree := os.NewFile(uintptr(treeFD), "virtio-fs "+req.Tag)
	defer tree.Close() //nolint:errcheck
	proc := filepath.Join("/proc", strconv.Itoa(pid))
	ns, err := os.Open(filepath.Join(proc, "ns", "mnt"))
	if err != nil {
		return err
	}
	root, err := os.OpenFile(filepath.Join(proc, "root"), unix.O_PATH|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if err != nil {
		_ = ns.Close()
		return err
	}
	// The helper waits for the answer, so its PID stands for its namespaces meanwhile; the PID
	// namespace too, so that /proc/self is the shell's in the guest's /proc.
	script := "mount --no-canonicalize --move /proc/self/fd/3 \"$1\"\n"
	if req.ReadOnly {
		script += "mount -o remount,bind,ro \"$1\" || { umount -l \"$1\"; exit 1; }\n"
	}
	cmd := execNsenter([]string{"--target", strconv.Itoa(pid), "--mount", "--pid", "--", "/bin/sh", "-c", script, "sh", req.Target}, tree)
	if out, err := cmd.CombinedOutput(); err != nil {
		_ = ns.Close()
		_ = root.Close()
		return fmt.Errorf("%v: %s", err, strings.TrimSpace(string(out)))
	}
	dev.mounts = append(dev.mounts, fsMount{ns: ns, root: root, target: req.Target})
	v.logger.Printf("virtio-fs: guest mounted tag %s at %s", req.Tag, req.Target)
	return nil
}

// peerPID is the PID, in this process's PID namespace, of the process on the other end.
func peerPID(conn *net.UnixConn) (int, error) {
	raw, err := conn.SyscallConn()
	if err != nil {
		return 0, err
	}
	var cred *unix.Ucred
	var credErr error
	if err := raw.Control(func(fd uintptr) {
		cred, credErr = unix.GetsockoptUcred(int(fd), unix.SOL_SOCKET, unix.SO_PEERCRED)
	}); err != nil {
		return 0, err
	}
	if credErr != nil {
		return 0, credErr
	}
	return int(cred.Pid), nil
}

// execNsenter is nsenter with files passed from fd 3 on.
func execNsenter(args []string, files ...*os.File) *exec.Cmd {
	cmd := exec.Command("nsenter", args...)
	cmd.ExtraFiles = files
	return cmd
}
