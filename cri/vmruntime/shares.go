package vmruntime

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"log/slog"
	"os"
	"os/exec"
	"path"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"

	"golang.org/x/sys/unix"

	"github.com/cocoonstack/cocoon-cri/pkg/cocoon"
	"github.com/cocoonstack/cocoon-cri/pkg/keylock"
	"github.com/cocoonstack/cocoon-cri/pkg/store"
	"github.com/cocoonstack/cocoon-cri/pkg/syncio"
	"github.com/cocoonstack/cocoon-cri/pkg/vmstats"
	"github.com/cocoonstack/cocoon-cri/streaming"
)

// A container's directory volumes reach its guest through a virtio-fs share where the VM can take
// one (cocoon v0.5's vm fs attach, a cloud-hypervisor VM whose memory is shared): the node's
// directory itself, not a copy, so a write in the guest reaches the node and a ConfigMap's update
// the guest at once. The share is a directory of cocoon-cri's holding a bind mount of each volume
// (read-only where the mount is), served by a virtiofsd of its own in its own session, so that it
// outlives a restart of cocoon-cri; the guest mounts it and binds each volume at its container
// path. It goes when the VM stops: the virtiofsd ends with its connection, and the binds are
// undone. Where no share can be made, volumes are copied in (volumes.go). docs/design.md, Volumes.

const (
	// shareTag is the virtio-fs tag of a container's share; a VM has one.
	shareTag = "cri-volumes"
	// guestShareDir is where the guest mounts the share.
	guestShareDir = "/run/cocoon-cri/share"
	// virtiofsdReady bounds the wait for a new virtiofsd's socket.
	virtiofsdReady = 10 * time.Second
	// virtiofsdStop bounds the wait for a virtiofsd asked to end, before it is killed.
	virtiofsdStop = 2 * time.Second
)

// volumeShares serves containers' directory volumes to their guests over virtio-fs: each
// container's share directory of bind mounts, its virtiofsd, the attach to the VM and the guest's
// mounts, recorded on the container so that a stop, a removal or a restart finds them.
type volumeShares struct {
	virtiofsd string // the virtiofsd binary; empty: no shares
	dir       string // where the shares' directories and sockets are
	log       *slog.Logger
	store     *store.Store
	locks     *keylock.Map // the sandboxes' locks
	cocoon    Cocoon
	cocoonFor func(*store.Sandbox) Cocoon
	guest     *guestExecutor
}

// canShare says whether the container's VM can take a virtio-fs share: a virtiofsd is
// configured, cocoon has vm fs attach, the VM is cloud-hypervisor's with shared memory, and its
// guest (not Windows) can be told to mount it.
func (sh *volumeShares) canShare(ctx context.Context, c *store.Container) bool {
	if sh.virtiofsd == "" || !c.VM.SharedMemory || c.VM.Windows || c.VM.Backend == cocoon.HypervisorFirecracker {
		return false
	}
	caps, err := sh.cocoon.Capabilities(ctx)
	return err == nil && caps.FsAttach
}

// wantsSharedMemory says whether a VM cocoon-cri creates (not a clone, which has its snapshot's
// memory) should share its RAM, so that it can take the container's volumes as a share.
func (sh *volumeShares) wantsSharedMemory(ctx context.Context, c *store.Container) bool {
	if sh.virtiofsd == "" || c.VM.Windows || c.VM.Backend == cocoon.HypervisorFirecracker || len(c.Config.Msg.GetMounts()) == 0 {
		return false
	}
	caps, err := sh.cocoon.Capabilities(ctx)
	return err == nil && caps.FsAttach
}

// splitShared takes out of copies the directory volumes, which go through the share, and returns
// them with the copies that are left (files).
func splitShared(copies []*volumeCopy) (shared, copied []*volumeCopy) {
	for _, vc := range copies {
		source, err := volumeSource(vc.mount.GetHostPath(), false)
		if st, statErr := os.Stat(source); err == nil && statErr == nil && st.IsDir() {
			shared = append(shared, vc)
			continue
		}
		copied = append(copied, vc)
	}
	return shared, copied
}

// share makes the container's share of volumes, attaches it to the VM and mounts it in the
// guest. After a restart of cocoon-cri a share still served is only mounted again (idempotently).
// On failure nothing of the share is left, and the caller copies the volumes instead.
func (sh *volumeShares) share(ctx context.Context, sb *store.Sandbox, c *store.Container, shared []*volumeCopy) error {
	share, err := sh.attach(ctx, sb, c, shared)
	if err != nil {
		return err
	}
	out := &syncio.Tail{Max: guestOutputTail}
	code, err := sh.guest.run(ctx, sb, c, systemCommand("/bin/sh", "-c", guestShareScript(shared)), streaming.ExecIO{Stdout: out, Stderr: out})
	if err == nil && code != 0 {
		err = fmt.Errorf("the guest's mount of the share exited with %d: %s", code, strings.TrimSpace(out.String()))
	}
	if err != nil {
		sh.log.Warn("the guest did not mount the volumes' share; they are copied instead", "container", c.ID, "err", err)
		sh.drop(ctx, sb, c.ID)
		return err
	}
	sh.log.Info("the container's directory volumes are shared with the guest (virtio-fs)", "container", c.ID,
		"volumes", len(shared), "virtiofsd", share.PID)
	return nil
}

// attach makes the share on the node and attaches it to the VM, under the sandbox lock: a
// stop that comes meanwhile finds the share recorded and takes it down. A share that is already
// served (cocoon-cri restarted) is kept.
func (sh *volumeShares) attach(ctx context.Context, sb *store.Sandbox, c *store.Container, shared []*volumeCopy) (store.Share, error) {
	unlock := sh.locks.Lock(sb.ID)
	defer unlock()
	cur, err := sh.store.Containers.Get(c.ID)
	if err != nil {
		return store.Share{}, err
	}
	if cur.State != store.ContainerRunning || cur.VM.ID != c.VM.ID {
		return store.Share{}, errors.New("the container is no longer running")
	}
	if sh := cur.VM.Share; sh.Attached && virtiofsdAlive(sh) {
		return sh, nil
	}
	if cur.VM.Share.Dir != "" {
		// A share a crash cut short, or whose virtiofsd died: made anew.
		if err := sh.takeDown(cur.VM.Share); err != nil {
			return store.Share{}, err
		}
	}
	share := store.Share{
		Dir:    filepath.Join(sh.dir, c.ID),
		Socket: filepath.Join(sh.dir, c.ID[:min(len(c.ID), 16)]+".sock"),
	}
	if err := sh.record(c.ID, share); err != nil {
		return store.Share{}, err
	}
	fail := func(err error) (store.Share, error) {
		if downErr := sh.takeDown(share); downErr != nil {
			sh.log.Error("a share that failed is left on the node; removing the container retries", "container", c.ID, "err", downErr)
			return store.Share{}, err
		}
		_ = sh.record(c.ID, store.Share{})
		return store.Share{}, err
	}
	if share.Volumes, err = bindVolumes(share.Dir, shared); err != nil {
		return fail(err)
	}
	if err := sh.record(c.ID, share); err != nil {
		return fail(err)
	}
	if share.PID, share.PIDStart, err = sh.startVirtiofsd(ctx, share); err != nil {
		return fail(err)
	}
	if err := sh.record(c.ID, share); err != nil {
		return fail(err)
	}
	if err := sh.cocoonFor(sb).VMFsAttach(ctx, c.VM.ID, share.Socket, shareTag); err != nil {
		return fail(fmt.Errorf("attach the volumes' share to VM %s: %w", c.VM.ID, err))
	}
	share.Attached = true
	if err := sh.record(c.ID, share); err != nil {
		return fail(err)
	}
	return share, nil
}

func (sh *volumeShares) record(id string, share store.Share) error {
	_, err := sh.store.Containers.Modify(id, func(r *store.Container) error { r.VM.Share = share; return nil })
	if err != nil {
		return fmt.Errorf("record the volumes' share: %w", err)
	}
	return nil
}

// bindVolumes makes dir and binds each shared volume's host directory at dir/<i>, read-only where
// the mount is. It returns how many binds it made, which a failure leaves for takeDown.
func bindVolumes(dir string, shared []*volumeCopy) (int, error) {
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return 0, fmt.Errorf("make the share %s: %w", dir, err)
	}
	for i, vc := range shared {
		source, err := volumeSource(vc.mount.GetHostPath(), false)
		if err != nil {
			return i, err
		}
		target := filepath.Join(dir, strconv.Itoa(i))
		if err := os.Mkdir(target, 0o700); err != nil && !errors.Is(err, fs.ErrExist) {
			return i, fmt.Errorf("make %s: %w", target, err)
		}
		if err := unix.Mount(source, target, "", unix.MS_BIND|unix.MS_REC, ""); err != nil {
			return i, fmt.Errorf("bind %s into the share: %w", source, err)
		}
		if vc.mount.GetReadonly() {
			if err := unix.Mount("", target, "", unix.MS_BIND|unix.MS_REMOUNT|unix.MS_RDONLY, ""); err != nil {
				return i + 1, fmt.Errorf("make %s read-only in the share: %w", source, err)
			}
		}
	}
	return len(shared), nil
}

// startVirtiofsd starts the share's virtiofsd in a session of its own, so that it outlives
// cocoon-cri, and waits for its socket.
func (sh *volumeShares) startVirtiofsd(ctx context.Context, share store.Share) (int, uint64, error) {
	_ = os.Remove(share.Socket) // a stale socket of a virtiofsd that ended
	cmd := exec.Command(sh.virtiofsd, "--socket-path="+share.Socket, "-o", "source="+share.Dir, "-o", "cache=none")
	cmd.SysProcAttr = &syscall.SysProcAttr{Setsid: true}
	if err := cmd.Start(); err != nil {
		return 0, 0, fmt.Errorf("start virtiofsd: %w", err)
	}
	exited := make(chan error, 1)
	go func() { exited <- cmd.Wait() }() // reaped while cocoon-cri lives
	pid := cmd.Process.Pid
	start, _ := vmstats.StartTicks(procRoot, pid)
	ctx, cancel := context.WithTimeout(ctx, virtiofsdReady)
	defer cancel()
	for {
		if _, err := os.Stat(share.Socket); err == nil {
			return pid, start, nil
		}
		select {
		case err := <-exited:
			return 0, 0, fmt.Errorf("virtiofsd ended before it listened: %v", err)
		case <-ctx.Done():
			_ = cmd.Process.Kill()
			return 0, 0, fmt.Errorf("virtiofsd did not listen on %s within %s", share.Socket, virtiofsdReady)
		case <-time.After(10 * time.Millisecond):
		}
	}
}

// virtiofsd is the identity of the share's virtiofsd process.
func virtiofsd(share store.Share) vmstats.ProcessIdentity {
	return vmstats.ProcessIdentity{PID: share.PID, Start: share.PIDStart}
}

// virtiofsdAlive says whether the share's virtiofsd still runs.
func virtiofsdAlive(share store.Share) bool {
	return share.PID > 0 && virtiofsd(share).Alive(procRoot)
}

// release takes down an ended container's share, if it has one, and forgets it.
func (sh *volumeShares) release(c *store.Container) error {
	if c.VM.Share.Dir == "" {
		return nil
	}
	if err := sh.takeDown(c.VM.Share); err != nil {
		return err
	}
	return sh.record(c.ID, store.Share{})
}

// drop takes down a share the guest could not use, under the sandbox lock.
func (sh *volumeShares) drop(ctx context.Context, sb *store.Sandbox, id string) {
	unlock := sh.locks.Lock(sb.ID)
	defer unlock()
	c, err := sh.store.Containers.Get(id)
	if err != nil || c.VM.Share.Dir == "" {
		return
	}
	if c.VM.Share.Attached && c.State == store.ContainerRunning {
		if err := sh.cocoonFor(sb).VMFsDetach(ctx, c.VM.ID, shareTag); err != nil && !errors.Is(err, cocoon.ErrNotFound) {
			sh.log.Warn("detaching the unused share failed; it goes with the VM", "container", id, "err", err)
		}
	}
	if err := sh.release(c); err != nil {
		sh.log.Error("the unused share is left on the node; removing the container retries", "container", id, "err", err)
	}
}

// takeDown ends the share's virtiofsd and undoes its binds. A bind that cannot be undone
// keeps its directory, and the share's: only empty directories are removed, so no volume's files
// are ever touched.
func (sh *volumeShares) takeDown(share store.Share) error {
	if virtiofsdAlive(share) {
		stopProcess(virtiofsd(share))
	}
	var errs []error
	for i := range share.Volumes {
		target := filepath.Join(share.Dir, strconv.Itoa(i))
		if err := unix.Unmount(target, unix.MNT_DETACH); err != nil && !errors.Is(err, unix.EINVAL) && !errors.Is(err, unix.ENOENT) {
			errs = append(errs, fmt.Errorf("undo the share's bind %s: %w", target, err))
			continue
		}
		if err := os.Remove(target); err != nil && !errors.Is(err, fs.ErrNotExist) {
			errs = append(errs, fmt.Errorf("remove %s: %w", target, err))
		}
	}
	if len(errs) > 0 {
		return errors.Join(errs...)
	}
	if err := os.Remove(share.Dir); err != nil && !errors.Is(err, fs.ErrNotExist) {
		return fmt.Errorf("remove the share %s: %w", share.Dir, err)
	}
	if err := os.Remove(share.Socket); err != nil && !errors.Is(err, fs.ErrNotExist) {
		return fmt.Errorf("remove %s: %w", share.Socket, err)
	}
	return nil
}

// stopProcess asks a process to end, and kills it if it has not within virtiofsdStop.
func stopProcess(p vmstats.ProcessIdentity) {
	_ = unix.Kill(p.PID, unix.SIGTERM)
	ctx, cancel := context.WithTimeout(context.Background(), virtiofsdStop)
	defer cancel()
	if waitVMGone(ctx, p) != nil && p.Alive(procRoot) {
		_ = unix.Kill(p.PID, unix.SIGKILL)
	}
}

// guestShareScript mounts the share in the guest and binds each volume at its container path,
// read-only where the mount is. Each step is skipped when already done, so a restart of
// cocoon-cri may run it again.
func guestShareScript(shared []*volumeCopy) string {
	var b strings.Builder
	b.WriteString("set -e\n")
	fmt.Fprintf(&b, "mkdir -p %[1]s\nmountpoint -q %[1]s || mount -t virtiofs %[2]s %[1]s\n", guestShareDir, shareTag)
	for i, vc := range shared {
		target := streaming.ShellQuote([]string{vc.guest.Target})
		source := path.Join(guestShareDir, strconv.Itoa(i))
		fmt.Fprintf(&b, "mkdir -p %[1]s\nif ! mountpoint -q %[1]s; then\n  mount --bind %[2]s %[1]s\n", target, source)
		if vc.guest.ReadOnly {
			fmt.Fprintf(&b, "  mount -o remount,bind,ro %s\n", target)
		}
		b.WriteString("fi\n")
	}
	return b.String()
}
