package guest

import (
	"bytes"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"time"

	"golang.org/x/sys/unix"
)

// Fs is one vhost-user-fs (virtio-fs) device as Cloud Hypervisor's configuration lists it.
type Fs struct {
	ID        string `json:"id,omitempty"`
	Tag       string `json:"tag"`
	Socket    string `json:"socket"`
	NumQueues int    `json:"num_queues,omitempty"`
	QueueSize int    `json:"queue_size,omitempty"`
}

// Cloud Hypervisor's defaults for a virtio-fs device.
const (
	fsDefaultNumQueues = 1
	fsDefaultQueueSize = 1024
)

// VhostUserConnectTimeoutEnv (simulator only) shortens how long the hypervisor keeps trying to
// connect to a vhost-user socket: a Go duration, default a minute, as Cloud Hypervisor retries
// (every 100 ms) before giving up. Tests of a missing backend set it low.
const VhostUserConnectTimeoutEnv = "COCOON_SIM_VHOST_USER_CONNECT_TIMEOUT"

const (
	vhostUserConnectTimeout = time.Minute
	vhostUserConnectRetry   = 100 * time.Millisecond
)

// fsDevice is an attached virtio-fs device: the vhost-user connection Cloud Hypervisor holds to
// the backend while the device exists (virtiofsd serves one connection and exits when it
// closes), the directory the backend exports, and where the guest mounted it.
type fsDevice struct {
	conn   *net.UnixConn
	dir    *os.File // O_PATH of the exported directory, resolved in the backend's view
	mounts []fsMount
}

// fsMount is one guest mount of a device's tag: the mount namespace and root it was made in,
// and where.
type fsMount struct {
	ns, root *os.File
	target   string
}

func (d *fsDevice) close() {
	_ = d.conn.Close()
	_ = d.dir.Close()
	for _, m := range d.mounts {
		_ = m.ns.Close()
		_ = m.root.Close()
	}
}

// handleAddFs hot-plugs a virtio-fs device as Cloud Hypervisor does: the configuration must have
// shared guest memory (the backend maps it), then the hypervisor connects to the backend's
// vhost-user socket (retrying for a minute) and negotiates features and queues. The device exists
// as long as that connection: the guest sees the tag, and may mount it, until it is removed.
func (v *vmm) handleAddFs(w http.ResponseWriter, r *http.Request) {
	var f Fs
	if !decodeDevice(w, r, "vm.add-fs", &f) {
		return
	}
	v.mu.Lock()
	defer v.mu.Unlock()
	if !v.admitDevice(w, "vm.add-fs", &f.ID, "_fs", func() int { return len(v.cfg.Fs) }) {
		return
	}
	if !v.cfg.Memory.Shared && !v.cfg.Memory.HugePages {
		apiError(w, "vm.add-fs: Using vhost-user requires using shared memory or huge pages")
		return
	}
	if f.Socket == "" {
		apiError(w, "vm.add-fs: No socket provided when using vhost-user")
		return
	}
	f.NumQueues = max(f.NumQueues, fsDefaultNumQueues)
	if f.QueueSize == 0 {
		f.QueueSize = fsDefaultQueueSize
	}
	dev, err := v.connectFs(f)
	if err != nil {
		apiError(w, "vm.add-fs: Cannot create virtio-fs device: %v", err)
		return
	}
	if err := v.listenFsMounts(); err != nil {
		dev.close()
		apiError(w, "vm.add-fs: %v", err)
		return
	}
	if v.fsDevs == nil {
		v.fsDevs = map[string]*fsDevice{}
	}
	v.fsDevs[f.ID] = dev
	v.cfg.Fs = append(v.cfg.Fs, f)
	v.logger.Printf("vm.add-fs: %s (tag %s) on %s", f.ID, f.Tag, f.Socket)
	writeJSON(w, map[string]string{"id": f.ID, "bdf": fmt.Sprintf("0000:00:%02x.0", 0x10+len(v.cfg.Disks)+len(v.cfg.Nets)+len(v.cfg.Devices)+len(v.cfg.Fs))})
}

// decodeDevice reads a hot-plug request's device, or answers the error.
func decodeDevice(w http.ResponseWriter, r *http.Request, op string, dev any) bool {
	if err := json.NewDecoder(r.Body).Decode(dev); err != nil {
		apiError(w, "%s: %v", op, err)
		return false
	}
	return true
}

// admitDevice checks what every hot-plug needs, as cloud-hypervisor does, and gives the device
// its ID: the VM is created, and the ID (the one asked for, or prefix and count()) belongs to no
// other device of any kind. It answers the error itself. The caller holds v.mu.
func (v *vmm) admitDevice(w http.ResponseWriter, op string, id *string, prefix string, count func() int) bool {
	if v.cfg == nil {
		apiError(w, "VM is not created")
		return false
	}
	if *id == "" {
		*id = fmt.Sprintf("%s%d", prefix, count())
	}
	if v.deviceIDTaken(*id) {
		apiError(w, "%s: identifier %s is not unique", op, *id)
		return false
	}
	return true
}

// deviceIDTaken reports whether a device of any kind has the ID. The caller holds v.mu.
func (v *vmm) deviceIDTaken(id string) bool {
	return slices.ContainsFunc(v.cfg.Disks, func(d Disk) bool { return d.ID == id }) ||
		slices.ContainsFunc(v.cfg.Nets, func(n Net) bool { return n.ID == id }) ||
		slices.ContainsFunc(v.cfg.Devices, func(d Device) bool { return d.ID == id }) ||
		slices.ContainsFunc(v.cfg.Fs, func(d Fs) bool { return d.ID == id })
}

// connectFs opens the device's vhost-user connection and finds the directory its backend
// exports. The caller holds v.mu, as Cloud Hypervisor's API thread is busy meanwhile.
func (v *vmm) connectFs(f Fs) (*fsDevice, error) {
	conn, err := dialVhostUser(f.Socket, vhostUserConnectWindow())
	if err != nil {
		v.logger.Printf("Failed connecting the backend after trying for 1 minute: %v", err)
		return nil, errors.New("Connection to socket failed") //nolint:staticcheck // Cloud Hypervisor's words
	}
	fail := func(err error) (*fsDevice, error) {
		_ = conn.Close()
		return nil, err
	}
	backendQueues, err := negotiateVhostUser(conn)
	if err != nil {
		return fail(err)
	}
	// One high-priority queue comes with the request queues.
	if want := f.NumQueues + 1; want > backendQueues {
		v.logger.Printf("vhost-user-fs requested too many queues (%d) since the backend only supports %d", want, backendQueues)
		return fail(fmt.Errorf("vhost-user-fs requested too many queues (%d) since the backend only supports %d", want, backendQueues))
	}
	dir, err := backendSharedDir(conn)
	if err != nil {
		return fail(fmt.Errorf("cocoon-sim: %w", err))
	}
	return &fsDevice{conn: conn, dir: dir}, nil
}

func vhostUserConnectWindow() time.Duration {
	if d, err := time.ParseDuration(os.Getenv(VhostUserConnectTimeoutEnv)); err == nil && d >= 0 {
		return d
	}
	return vhostUserConnectTimeout
}

// dialVhostUser connects to a vhost-user backend's socket, retrying every 100 ms until timeout
// (a backend may be starting).
func dialVhostUser(path string, timeout time.Duration) (*net.UnixConn, error) {
	deadline := time.Now().Add(timeout)
	for {
		conn, err := net.DialUnix("unix", nil, &net.UnixAddr{Name: path, Net: "unix"})
		if err == nil {
			return conn, nil
		}
		if !time.Now().Before(deadline) {
			return nil, err
		}
		time.Sleep(vhostUserConnectRetry)
	}
}

// vhost-user messages the hypervisor sends while it creates the device.
const (
	vhostUserGetFeatures         = 1
	vhostUserSetOwner            = 3
	vhostUserGetProtocolFeatures = 15
	vhostUserSetProtocolFeatures = 16
	vhostUserGetQueueNum         = 17

	vhostUserVersion      = 0x1
	vhostUserReplyFlag    = 0x4
	vhostUserFProtocol    = 1 << 30 // VHOST_USER_F_PROTOCOL_FEATURES
	vhostUserProtocolMQ   = 1 << 0  // VHOST_USER_PROTOCOL_F_MQ
	vhostUserDefaultQueue = 1       // without MQ, what the backend is assumed to serve
)

// negotiateVhostUser is the front end's side of the handshake: owner, features, protocol
// features (multiqueue only) and the backend's queue count. What comes after (memory table,
// vrings) needs a guest driver, which the simulated guest has not.
func negotiateVhostUser(conn *net.UnixConn) (int, error) {
	if err := vhostUserSend(conn, vhostUserSetOwner, nil); err != nil {
		return 0, fmt.Errorf("Set owner failed: %w", err) //nolint:staticcheck // Cloud Hypervisor's words
	}
	features, err := vhostUserCall(conn, vhostUserGetFeatures)
	if err != nil {
		return 0, fmt.Errorf("Get features failed: %w", err) //nolint:staticcheck
	}
	if features&vhostUserFProtocol == 0 {
		return vhostUserDefaultQueue, nil
	}
	protocol, err := vhostUserCall(conn, vhostUserGetProtocolFeatures)
	if err != nil {
		return 0, fmt.Errorf("Get protocol features failed: %w", err) //nolint:staticcheck
	}
	acked := protocol & vhostUserProtocolMQ
	if err := vhostUserSend(conn, vhostUserSetProtocolFeatures, binary.LittleEndian.AppendUint64(nil, acked)); err != nil {
		return 0, fmt.Errorf("Set protocol features failed: %w", err) //nolint:staticcheck
	}
	if acked == 0 {
		return vhostUserDefaultQueue, nil
	}
	n, err := vhostUserCall(conn, vhostUserGetQueueNum)
	if err != nil {
		return 0, fmt.Errorf("Get queue max number failed: %w", err) //nolint:staticcheck
	}
	return int(n), nil
}

func vhostUserSend(conn *net.UnixConn, request uint32, payload []byte) error {
	msg := binary.LittleEndian.AppendUint32(nil, request)
	msg = binary.LittleEndian.AppendUint32(msg, vhostUserVersion)
	msg = binary.LittleEndian.AppendUint32(msg, uint32(len(payload))) //nolint:gosec // 8 bytes at most
	_, err := conn.Write(append(msg, payload...))
	return err
}

// vhostUserCall sends a request without payload and reads its u64 answer.
func vhostUserCall(conn *net.UnixConn, request uint32) (uint64, error) {
	if err := vhostUserSend(conn, request, nil); err != nil {
		return 0, err
	}
	_ = conn.SetReadDeadline(time.Now().Add(10 * time.Second))
	defer conn.SetReadDeadline(time.Time{}) //nolint:errcheck
	var hdr [12]byte
	if _, err := io.ReadFull(conn, hdr[:]); err != nil {
		return 0, err
	}
	got, flags, size := binary.LittleEndian.Uint32(hdr[0:]), binary.LittleEndian.Uint32(hdr[4:]), binary.LittleEndian.Uint32(hdr[8:])
	if got != request || flags&vhostUserReplyFlag == 0 || size != 8 {
		return 0, fmt.Errorf("unexpected reply (request %d, flags %#x, size %d)", got, flags, size)
	}
	var payload [8]byte
	if _, err := io.ReadFull(conn, payload[:]); err != nil {
		return 0, err
	}
	return binary.LittleEndian.Uint64(payload[:]), nil
}

// backendSharedDir finds the directory the backend on the other end of conn exports, which
// the vhost-user protocol does not tell: the socket's peer credentials name the backend's
// process, whose command line does (virtiofsd's -o source=DIR, the Rust virtiofsd's
// --shared-dir DIR). The directory is opened at once.
func backendSharedDir(conn *net.UnixConn) (*os.File, error) {
	pid, err := peerPID(conn)
	if err != nil {
		return nil, fmt.Errorf("vhost-user peer: %w", err)
	}
	proc := filepath.Join("/proc", strconv.Itoa(pid))
	cmdline, err := os.ReadFile(filepath.Join(proc, "cmdline")) //nolint:gosec // the peer's /proc entry
	if err != nil {
		return nil, fmt.Errorf("vhost-user peer pid %d: %w", pid, err)
	}
	argv := strings.Split(strings.TrimRight(string(cmdline), "\x00"), "\x00")
	dir, ok := virtiofsdSharedDir(argv)
	if !ok {
		return nil, fmt.Errorf("vhost-user peer pid %d (%s) is not a virtiofsd whose shared directory the simulator can tell", pid, argv[0])
	}
	if !filepath.IsAbs(dir) {
		return nil, fmt.Errorf("vhost-user peer pid %d: shared directory %q is relative", pid, dir)
	}
	// The path is the host's: virtiofsd reads it before it sandboxes itself (its own root then
	// becomes the directory), and the hypervisor shares the host's mount namespace.
	f, err := os.OpenFile(dir, unix.O_PATH|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if err != nil {
		return nil, fmt.Errorf("shared directory of vhost-user peer pid %d: %w", pid, err)
	}
	return f, nil
}

// virtiofsdSharedDir reads the shared directory from a virtiofsd command line: QEMU's C virtiofsd
// (-o source=DIR, among other comma-separated options; "/" when absent) or the Rust virtiofsd
// (--shared-dir DIR; it also takes -o source=DIR).
func virtiofsdSharedDir(argv []string) (string, bool) {
	if len(argv) == 0 || !strings.Contains(filepath.Base(argv[0]), "virtiofsd") {
		return "", false
	}
	dir := ""
	for i := 1; i < len(argv); i++ {
		a := argv[i]
		switch {
		case a == "--shared-dir" && i+1 < len(argv):
			dir = argv[i+1]
			i++
		case strings.HasPrefix(a, "--shared-dir="):
			dir = strings.TrimPrefix(a, "--shared-dir=")
		case a == "-o" && i+1 < len(argv):
			dir = sourceOption(argv[i+1], dir)
			i++
		case strings.HasPrefix(a, "-o"):
			dir = sourceOption(strings.TrimPrefix(a, "-o"), dir)
		}
	}
	if dir == "" {
		dir = "/" // the C virtiofsd's default; the Rust one refuses to start without a directory
	}
	return dir, true
}

func sourceOption(opts, dir string) string {
	for o := range strings.SplitSeq(opts, ",") {
		if v, ok := strings.CutPrefix(o, "source="); ok {
			dir = v
		}
	}
	return dir
}

// removeFs takes a virtio-fs device away: the vhost-user connection closes (virtiofsd then
// exits) and the guest's mounts of its tag go. A real guest keeps such a mount, dead (its
// accesses fail with ENOTCONN); the simulated guest's mount is a bind of the directory, which
// cannot be made to fail, so it is lazily unmounted instead. The caller holds v.mu.
func (v *vmm) removeFs(id string) {
	if dev := v.fsDevs[id]; dev != nil {
		guestOS, _ := v.os.(*simulatedOS)
		for _, m := range dev.mounts {
			if guestOS == nil {
				break
			}
			// In the mount namespace the mount was made in, and the guest's PID namespace, where
			// umount finds /proc/self.
			cmd := execNsenter([]string{"--target", strconv.Itoa(guestOS.proc.Process.Pid), "--pid",
				"--mount=/proc/self/fd/3", "--root=/proc/self/fd/4", "--wd=/proc/self/fd/4", "--",
				"umount", "-l", m.target}, m.ns, m.root)
			if out, err := cmd.CombinedOutput(); err != nil {
				v.logger.Printf("virtio-fs %s: unmount %s in the guest: %v: %s", id, m.target, err, bytes.TrimSpace(out))
			}
		}
		dev.close()
		delete(v.fsDevs, id)
	}
	v.cfg.Fs = slices.DeleteFunc(v.cfg.Fs, func(f Fs) bool { return f.ID == id })
}

// closeFsDevices lets go of every backend, as a hypervisor whose VM goes does. The caller holds
// v.mu.
func (v *vmm) closeFsDevices() {
	for id, dev := range v.fsDevs {
		dev.close()
		delete(v.fsDevs, id)
	}
	if v.cfg != nil {
		v.cfg.Fs = nil
	}
}
