package cocoonsim_test

import (
	"bytes"
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/cocoonstack/cocoon-cri/pkg/cocoon"
	"github.com/cocoonstack/cocoon-cri/test/cocoonsim/guest"
	"github.com/cocoonstack/cocoon-cri/test/testimage"
)

// virtiofsdBinary is QEMU's C virtiofsd as Debian 12 ships it (qemu-system-common).
const virtiofsdBinary = "/usr/lib/qemu/virtiofsd"

// virtiofsd is a real virtiofsd the test started, serving dir on sock.
type virtiofsd struct {
	cmd    *exec.Cmd
	sock   string
	done   chan struct{}
	stderr bytes.Buffer
}

// startVirtiofsd runs virtiofsd for dir on a socket in a temp dir; cleanup kills it by PID.
func startVirtiofsd(t *testing.T, dir string) *virtiofsd {
	t.Helper()
	if _, err := os.Stat(virtiofsdBinary); err != nil {
		t.Skipf("no virtiofsd: %v (Debian: qemu-system-common)", err)
	}
	v := &virtiofsd{sock: filepath.Join(t.TempDir(), "vfs.sock"), done: make(chan struct{})}
	v.cmd = exec.Command(virtiofsdBinary, "--socket-path="+v.sock, "-o", "source="+dir, "-o", "cache=none")
	v.cmd.Stderr = &v.stderr
	if err := v.cmd.Start(); err != nil {
		t.Fatal(err)
	}
	go func() {
		_ = v.cmd.Wait()
		close(v.done)
	}()
	t.Cleanup(func() {
		select {
		case <-v.done:
		default:
			_ = v.cmd.Process.Kill()
			<-v.done
		}
	})
	eventually(t, "virtiofsd's socket", func() bool {
		_, err := os.Stat(v.sock)
		return err == nil
	})
	return v
}

// waitExit waits for virtiofsd to exit, as it does once its hypervisor lets go of it.
func (v *virtiofsd) waitExit(t *testing.T, why string) {
	t.Helper()
	select {
	case <-v.done:
	case <-time.After(patience):
		t.Fatalf("virtiofsd still runs after %s; its log:\n%s", why, v.stderr.String())
	}
}

// fsAttached is inspect's attached_devices.fs.
func fsAttached(t *testing.T, s *sim, vm string) []map[string]string {
	t.Helper()
	var shown struct {
		AttachedDevices struct {
			Fs []map[string]string `json:"fs"`
		} `json:"attached_devices"`
	}
	if err := json.Unmarshal([]byte(s.ok("vm", "inspect", vm)), &shown); err != nil {
		t.Fatal(err)
	}
	return shown.AttachedDevices.Fs
}

// memoryShared is the running VM's cloud-hypervisor memory "shared".
func memoryShared(t *testing.T, s *sim, vm string) bool {
	t.Helper()
	mem, _ := vmInfo(t, s.inspect(vm).SocketPath)["config"].(map[string]any)["memory"].(map[string]any)
	return mem["shared"] == true
}

// TestFsAttach: v0.5's vm fs attach hot-adds a vhost-user-fs share served by a real virtiofsd to
// a running VM created with --shared-memory. The guest sees it only once it mounts the tag; then
// it reads and writes the host's directory (read-only when mounted so). Detach and the VM's stop
// end the device, and virtiofsd with it. Flags, refusals and inspect are cocoon's.
func TestFsAttach(t *testing.T) {
	s := newSimAt(t, "0.5.1")
	// A missing backend fails at once rather than after cloud-hypervisor's minute of retries.
	s.env = append(s.env, guest.VhostUserConnectTimeoutEnv+"=0")
	s.seedImage("img", guest.Spec{})
	box := decode[cocoon.VM](t, s.ok("vm", "run", "--nics", "0", "--cpu", "1", "--name", "box", "--shared-memory", "-o", "json", "img"))
	if !box.Config.SharedMemory || !s.inspect("box").Config.SharedMemory || !memoryShared(t, s, "box") {
		t.Fatalf("--shared-memory not kept: run %+v, inspect %+v", box.Config, s.inspect("box").Config)
	}
	if !strings.Contains(s.ok("vm", "inspect", "box"), `"shared_memory": true`) {
		t.Fatal("inspect does not show shared_memory")
	}
	s.ok("vm", "run", "--nics", "0", "--cpu", "1", "--name", "plain", "img")
	if s.inspect("plain").Config.SharedMemory || memoryShared(t, s, "plain") {
		t.Fatal("a VM without --shared-memory has shared memory")
	}

	shared := t.TempDir()
	if err := os.WriteFile(filepath.Join(shared, "hello"), []byte("from the host\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	vfs := startVirtiofsd(t, shared)

	missing := filepath.Join(t.TempDir(), "none.sock")
	for _, tc := range []struct {
		want string
		args []string
	}{
		{`required flag(s) "socket", "tag" not set`, []string{"box"}},
		{`required flag(s) "tag" not set`, []string{"box", "--socket", vfs.sock}},
		{`socket must be absolute, got "vfs.sock"`, []string{"box", "--socket", "vfs.sock", "--tag", "share"}},
		{`tag "a/b" invalid: must match [A-Za-z0-9][A-Za-z0-9_-]{0,35}`, []string{"box", "--socket", vfs.sock, "--tag", "a/b"}},
		{`tag "-x" invalid: must match [A-Za-z0-9][A-Za-z0-9_-]{0,35}`, []string{"box", "--socket", vfs.sock, "--tag", "-x"}},
		{`tag "` + strings.Repeat("t", 37) + `" invalid: must match [A-Za-z0-9][A-Za-z0-9_-]{0,35}`, []string{"box", "--socket", vfs.sock, "--tag", strings.Repeat("t", 37)}},
		{"num-queues must be non-negative, got -1", []string{"box", "--socket", vfs.sock, "--tag", "share", "--num-queues", "-1"}},
		{"queue-size must be non-negative, got -2", []string{"box", "--socket", vfs.sock, "--tag", "share", "--queue-size", "-2"}},
		{"fs attach requires the VM to be created with --shared-memory (current memory shared=off; cannot be flipped on a running VM)", []string{"plain", "--socket", vfs.sock, "--tag", "share"}},
	} {
		s.fails(tc.want, append([]string{"vm", "fs", "attach"}, tc.args...)...)
	}
	// No virtiofsd on the socket: cloud-hypervisor's connection fails.
	r := s.cocoon("vm", "fs", "attach", "box", "--socket", missing, "--tag", "share")
	if r.code != 1 || !strings.HasPrefix(r.errorLine(), "Error: vm.add-fs: ") || !strings.Contains(r.errorLine(), "Cannot create virtio-fs device: Connection to socket failed") {
		t.Fatalf("attach of a missing socket: exit %d, %q", r.code, r.errorLine())
	}
	if got := fsAttached(t, s, "box"); len(got) != 0 {
		t.Fatalf("refused attaches left devices: %v", got)
	}

	out := s.ok("vm", "fs", "attach", "box", "--socket", vfs.sock, "--tag", "share", "-o", "json")
	if res := decode[map[string]string](t, out); len(res) != 3 || res["vm"] != "box" || res["tag"] != "share" || res["id"] != "cocoon-fs-share" {
		t.Fatalf("attach -o json: %q", out)
	}
	if got := fsAttached(t, s, "box"); len(got) != 1 || got[0]["id"] != "cocoon-fs-share" || got[0]["tag"] != "share" || got[0]["socket"] != vfs.sock {
		t.Fatalf("inspect's attached_devices.fs: %v", got)
	}
	s.fails(`fs tag "share" already attached`, "vm", "fs", "attach", "box", "--socket", vfs.sock, "--tag", "share")

	// Attached is not mounted: the guest sees the share once it mounts the tag.
	if r := s.vmExec("", "box", "--", "cat", "/mnt/share/hello"); r.code == 0 {
		t.Fatal("the guest reads the share before mounting it")
	}
	s.inGuest("box", "mkdir", "-p", "/mnt/share", "/mnt/ro", "/mnt/nope")
	s.inGuest("box", "mount", "-t", "virtiofs", "share", "/mnt/share")
	if got := s.inGuest("box", "cat", "/mnt/share/hello"); got != "from the host\n" {
		t.Fatalf("the guest reads %q from the share", got)
	}
	s.inGuest("box", "sh", "-c", "echo from the guest > /mnt/share/written")
	if got, err := os.ReadFile(filepath.Join(shared, "written")); err != nil || string(got) != "from the guest\n" {
		t.Fatalf("the guest's write reached the host as %q (%v)", got, err)
	}
	if err := os.WriteFile(filepath.Join(shared, "later"), []byte("new\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	if got := s.inGuest("box", "cat", "/mnt/share/later"); got != "new\n" {
		t.Fatalf("the host's later file reads %q in the guest", got)
	}
	s.inGuest("box", "mount", "-t", "virtiofs", "-o", "ro", "share", "/mnt/ro")
	if got := s.inGuest("box", "cat", "/mnt/ro/hello"); got != "from the host\n" {
		t.Fatalf("the read-only mount reads %q", got)
	}
	if r := s.vmExec("", "box", "--", "touch", "/mnt/ro/x"); r.code == 0 || !strings.Contains(r.stderr, "Read-only file system") {
		t.Fatalf("a write to the read-only mount: exit %d, %q", r.code, r.stderr)
	}
	if _, err := os.Stat(filepath.Join(shared, "x")); err == nil {
		t.Fatal("a write through the read-only mount reached the host")
	}
	// A tag no device has fails as the guest kernel's virtio-fs does (EINVAL).
	r = s.vmExec("", "box", "--", "mount", "-t", "virtiofs", "nope", "/mnt/nope")
	wantMsg := "mount: /mnt/nope: wrong fs type, bad option, bad superblock on nope, missing codepage or helper program, or other error.\n" +
		"       dmesg(1) may have more information after failed mount system call.\n"
	if r.code != 32 || r.stderr != wantMsg {
		t.Fatalf("mount of an unknown tag: exit %d, stderr %q", r.code, r.stderr)
	}
	// Nothing of it reached the host.
	if _, err := os.Stat("/mnt/share/hello"); err == nil {
		t.Fatal("the guest's mount is on the host")
	}

	s.fails(`snapshot VM box: snapshot VM `+box.ID+`: hot-attached vhost-user-fs "share": detach before snapshot or hibernate`,
		"snapshot", "save", "--name", "withfs", "box")

	out = s.ok("vm", "fs", "detach", "box", "--tag", "share", "-o", "json")
	if res := decode[map[string]string](t, out); len(res) != 2 || res["vm"] != "box" || res["tag"] != "share" {
		t.Fatalf("detach -o json: %q", out)
	}
	vfs.waitExit(t, "detach")
	if r := s.vmExec("", "box", "--", "cat", "/mnt/share/hello"); r.code == 0 {
		t.Fatalf("the guest still reads the detached share; hypervisor log:\n%s", hypervisorLog(t, s, box.ID))
	}
	if strings.Contains(s.ok("vm", "inspect", "box"), "attached_devices") {
		t.Fatal("inspect shows attached devices after detach")
	}
	s.fails(`fs tag "share" not attached`, "vm", "fs", "detach", "box", "--tag", "share")
	s.fails(`required flag(s) "tag" not set`, "vm", "fs", "detach", "box")
	// virtiofsd served its one connection: its socket is stale now.
	r = s.cocoon("vm", "fs", "attach", "box", "--socket", vfs.sock, "--tag", "share")
	if r.code != 1 || !strings.Contains(r.errorLine(), "Connection to socket failed") {
		t.Fatalf("attach to an exited virtiofsd: exit %d, %q", r.code, r.errorLine())
	}

	// A share does not outlive the VM's process, and nothing brings it back at start.
	vfs2 := startVirtiofsd(t, shared)
	s.ok("vm", "fs", "attach", "box", "--socket", vfs2.sock, "--tag", "again")
	s.ok("vm", "stop", "box")
	vfs2.waitExit(t, "the VM's stop")
	s.fails("vm is not running: vm "+box.ID+" is stopped: vm not running", "vm", "fs", "attach", "box", "--socket", vfs2.sock, "--tag", "again")
	s.fails("vm is not running: vm "+box.ID+" is stopped: vm not running", "vm", "fs", "detach", "box", "--tag", "again")
	s.ok("vm", "start", "box")
	if got := fsAttached(t, s, "box"); len(got) != 0 {
		t.Fatalf("a share came back with the start: %v", got)
	}
	if !memoryShared(t, s, "box") {
		t.Fatal("the restarted VM lost its shared memory")
	}

	// backend queues: virtiofsd serves one request queue.
	vfs3 := startVirtiofsd(t, shared)
	r = s.cocoon("vm", "fs", "attach", "box", "--socket", vfs3.sock, "--tag", "q", "--num-queues", "2")
	if r.code != 1 || !strings.Contains(r.errorLine(), "vhost-user-fs requested too many queues (3) since the backend only supports 2") {
		t.Fatalf("attach with more queues than virtiofsd serves: exit %d, %q", r.code, r.errorLine())
	}
	vfs3.waitExit(t, "a refused attach")
}

// TestFsSharedMemoryInherited: a snapshot of a --shared-memory VM records it and its clones have
// it, so they take vm fs attach too.
func TestFsSharedMemoryInherited(t *testing.T) {
	s := newSimAt(t, "0.5.1")
	s.seedImage("img", guest.Spec{})
	s.ok("vm", "run", "--nics", "0", "--cpu", "1", "--name", "src", "--shared-memory", "img")
	s.ok("snapshot", "save", "--name", "snap", "src")
	if out := s.ok("snapshot", "inspect", "snap"); !strings.Contains(out, `"shared_memory": true`) {
		t.Fatalf("the snapshot does not record shared memory:\n%s", out)
	}
	clone := s.clone("snap", "c1")
	if !clone.Config.SharedMemory || !memoryShared(t, s, "c1") {
		t.Fatalf("the clone lost shared memory: %+v", clone.Config)
	}
	shared := t.TempDir()
	if err := os.WriteFile(filepath.Join(shared, "f"), []byte("x"), 0o644); err != nil {
		t.Fatal(err)
	}
	vfs := startVirtiofsd(t, shared)
	s.ok("vm", "fs", "attach", "c1", "--socket", vfs.sock, "--tag", "data")
	s.inGuest("c1", "sh", "-c", "mkdir -p /data && mount -t virtiofs data /data && test -f /data/f")
	s.ok("vm", "rm", "--force", "c1")
	vfs.waitExit(t, "the VM's removal")
}

// TestFsRefusedWhereCocoonHasNone: Firecracker takes no vhost-user-fs device, and v0.3.8 has
// neither --shared-memory nor vm fs.
func TestFsRefusedWhereCocoonHasNone(t *testing.T) {
	s := newSimAt(t, "0.5.1")
	s.seedImage("img", guest.Spec{})
	s.fails("--fc and --shared-memory are mutually exclusive: Firecracker does not support vhost-user-fs hot-plug",
		"vm", "create", "--nics", "0", "--fc", "--shared-memory", "img")
	if got := s.listVMs(); len(got) != 0 {
		t.Fatalf("a refused create left records: %+v", got)
	}
	s.importSnapshot(testimage.SnapshotOptions{Name: "fc", Hypervisor: cocoon.HypervisorFirecracker})
	s.clone("fc", "fc1")
	s.fails("fs attach: backend firecracker: backend does not support fs attach",
		"vm", "fs", "attach", "fc1", "--socket", "/nonexistent.sock", "--tag", "x")
	s.fails("fs detach: backend firecracker: backend does not support fs attach",
		"vm", "fs", "detach", "fc1", "--tag", "x")

	old := newSimAt(t, "0.3.8")
	old.seedImage("img", guest.Spec{})
	old.fails("unknown flag: --shared-memory", "vm", "create", "--nics", "0", "--shared-memory", "img")
	if r := old.cocoon("vm", "--help"); strings.Contains(r.stdout, "\n  fs ") {
		t.Fatalf("v0.3.8 has vm fs:\n%s", r.stdout)
	}
	if r := old.cocoon("vm", "fs", "attach", "x", "--socket", "/s", "--tag", "t"); r.code != 1 || r.errorLine() != "Error: unknown flag: --socket" {
		t.Fatalf("v0.3.8 vm fs attach: exit %d, %q", r.code, r.errorLine())
	}
}

// hypervisorLog is what the VM's hypervisor logged.
func hypervisorLog(t *testing.T, s *sim, id string) string {
	t.Helper()
	var all []byte
	_ = filepath.WalkDir(filepath.Join(s.log, "cloudhypervisor", id), func(path string, d os.DirEntry, err error) error {
		if err == nil && !d.IsDir() {
			data, _ := os.ReadFile(path) //nolint:gosec // the test's own log dir
			all = append(all, data...)
		}
		return nil
	})
	return string(all)
}
