package e2e

import (
	"net"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"
	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"

	"github.com/cocoonstack/cocoon-cri/test/harness"
	"github.com/cocoonstack/cocoon-cri/test/testimage"
)

// TestVolumesReachTheGuest: the kubelet's volumes, which a guest cannot see on the node, are
// copied into it: a ConfigMap-style directory read-only and kept in step (an atomic ..data swap
// reaches the guest), a Secret on a tmpfs, a writable emptyDir, a single file over /etc/hosts.
// Through cocoon's agent (v0.5) and over SSH (v0.3.8); and kept in step across a restart of
// cocoon-cri.
func TestVolumesReachTheGuest(t *testing.T) {
	t.Parallel()
	t.Run("agent", func(t *testing.T) {
		n := newNode(t)
		n.withSnapshot()
		checkVolumes(t, n, snapRef)
		checkVolumesAfterRestart(t, n)
	})
	t.Run("ssh", func(t *testing.T) {
		checkVolumes(t, sshOnlyNode(t), cloudRef)
	})
}

func checkVolumes(t *testing.T, n *node, image string) {
	configMap := t.TempDir()
	kubeletAtomicWrite(t, configMap, "..2026_11_25_10_00_00.1", map[string]string{"greeting": "hello", "old": "gone soon"})
	secret := t.TempDir()
	if err := unix.Mount("tmpfs", secret, "tmpfs", 0, "size=1m"); err != nil {
		t.Fatalf("a tmpfs for the secret: %v", err)
	}
	t.Cleanup(func() { _ = unix.Unmount(secret, unix.MNT_DETACH) })
	kubeletAtomicWrite(t, secret, "..2026_11_25_10_00_00.1", map[string]string{"token": "s3cr3t"})
	emptyDir := t.TempDir()
	hosts := filepath.Join(t.TempDir(), "etc-hosts")
	if err := os.WriteFile(hosts, []byte("10.1.2.3\tvolumes-pod\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	_, ctrID, _ := n.runningPodWith("volumes", image, func(cfg *runtimeapi.ContainerConfig) {
		cfg.Command = []string{"sh", "-c", "cat /etc/app/greeting; echo; exec sleep 600"}
		cfg.Mounts = []*runtimeapi.Mount{
			{ContainerPath: "/etc/app", HostPath: configMap, Readonly: true},
			{ContainerPath: "/var/run/secrets/kubernetes.io/serviceaccount", HostPath: secret, Readonly: true},
			{ContainerPath: "/data", HostPath: emptyDir},
			{ContainerPath: "/etc/hosts", HostPath: hosts},
		}
	})
	// The main command runs once the volumes are in place.
	n.waitLog(ctrID, "hello")
	inGuest := func(script string) string {
		t.Helper()
		return n.mustCrictl("exec", ctrID, "sh", "-c", script)
	}
	if got := inGuest("cat /var/run/secrets/kubernetes.io/serviceaccount/token; echo; grep volumes-pod /etc/hosts"); got != "s3cr3t\n10.1.2.3\tvolumes-pod" {
		t.Fatalf("the secret and /etc/hosts in the guest: %q", got)
	}
	// The copies live in the guest's memory (its /run), never on a disk.
	if got := inGuest("stat -f -c %T /run/cocoon-cri/volumes"); got != "tmpfs" {
		t.Fatalf("the guest keeps its copies on %q, want tmpfs", got)
	}
	if out, err := n.crictl("exec", ctrID, "sh", "-c", "echo x > /etc/app/new"); err == nil {
		t.Fatalf("a read-only volume took a write from the guest: %q", out)
	}
	if got := inGuest("echo written > /data/f && cat /data/f"); got != "written" {
		t.Fatalf("the writable volume: %q", got)
	}
	if _, err := os.Stat("/etc/app"); err == nil {
		t.Fatal("the container path /etc/app appeared on the node")
	}

	swapReaches(t, n, ctrID, configMap, "..2026_11_25_10_01_00.2", "bonjour")
}

// checkVolumesAfterRestart: a VM whose init is the workload runs on across a restart of
// cocoon-cri, which copies its volumes in again and goes on keeping them in step.
func checkVolumesAfterRestart(t *testing.T, n *node) {
	configMap := t.TempDir()
	kubeletAtomicWrite(t, configMap, "..2026_11_25_10_00_00.1", map[string]string{"greeting": "hello"})
	_, ctrID, _ := n.runningPodWith("restarted", snapRef, func(cfg *runtimeapi.ContainerConfig) {
		cfg.Mounts = []*runtimeapi.Mount{{ContainerPath: "/etc/app", HostPath: configMap, Readonly: true}}
	})
	swapReaches(t, n, ctrID, configMap, "..2026_11_25_10_01_00.2", "bonjour")
	n.Restart()
	swapReaches(t, n, ctrID, configMap, "..2026_11_25_10_02_00.3", "hola")
}

// swapReaches changes a ConfigMap volume as the kubelet does and waits until the guest reads the
// new value and no key of the old one. The sync runs every 2 s, so the change arrives within a few
// seconds; the wait allows a minute, for a loaded machine, and logs how long it took.
func swapReaches(t *testing.T, n *node, ctrID, configMap, stamp, want string) {
	t.Helper()
	kubeletAtomicWrite(t, configMap, stamp, map[string]string{"greeting": want})
	start := time.Now()
	for {
		got, err := n.crictl("exec", ctrID, "sh", "-c", "cat /etc/app/greeting; echo; ls /etc/app")
		if got == want+"\ngreeting" {
			t.Logf("the ConfigMap change reached the guest in %s", time.Since(start).Round(10*time.Millisecond))
			return
		}
		if time.Since(start) > time.Minute {
			t.Fatalf("a minute after the ConfigMap changed the guest reads %q (%v), want %q and greeting alone", got, err, want)
		}
		time.Sleep(200 * time.Millisecond)
	}
}

// kubeletAtomicWrite lays out a ConfigMap or Secret volume as the kubelet's atomic writer does: a
// timestamped directory, ..data renamed to point at it, a link per key through ..data, and the
// previous directory removed last.
func kubeletAtomicWrite(t *testing.T, dir, stamp string, data map[string]string) {
	t.Helper()
	old, _ := os.Readlink(filepath.Join(dir, "..data"))
	must := func(err error) {
		t.Helper()
		if err != nil {
			t.Fatal(err)
		}
	}
	must(os.Mkdir(filepath.Join(dir, stamp), 0o755))
	for k, v := range data {
		must(os.WriteFile(filepath.Join(dir, stamp, k), []byte(v), 0o644))
	}
	must(os.Symlink(stamp, filepath.Join(dir, "..data_tmp")))
	must(os.Rename(filepath.Join(dir, "..data_tmp"), filepath.Join(dir, "..data")))
	entries, err := os.ReadDir(dir)
	must(err)
	for _, e := range entries {
		if _, keep := data[e.Name()]; !keep && !strings.HasPrefix(e.Name(), "..") {
			must(os.Remove(filepath.Join(dir, e.Name())))
		}
	}
	for k := range data {
		if _, err := os.Lstat(filepath.Join(dir, k)); err != nil {
			must(os.Symlink(filepath.Join("..data", k), filepath.Join(dir, k)))
		}
	}
	if old != "" {
		must(os.RemoveAll(filepath.Join(dir, old)))
	}
}

// TestVolumeRefusals: a volume no copy can honour is refused at create with InvalidArgument,
// naming the mount and what to do, and no container is left.
func TestVolumeRefusals(t *testing.T) {
	t.Parallel()
	n := newNode(t, "--volume-max-bytes", "1Ki")
	n.withSnapshot()
	podFile := n.configFile("pod.json", n.podConfig("refused", "uid-refused"))
	podID := n.mustCrictl("runp", "--runtime", "cocoon", podFile)

	big := t.TempDir()
	if err := os.WriteFile(filepath.Join(big, "blob"), make([]byte, 4096), 0o600); err != nil {
		t.Fatal(err)
	}
	sockDir := t.TempDir()
	sock, err := net.Listen("unix", filepath.Join(sockDir, "app.sock"))
	if err != nil {
		t.Fatal(err)
	}
	defer sock.Close() //nolint:errcheck
	for _, tc := range []struct {
		name  string
		mount *runtimeapi.Mount
		want  string
	}{
		{"too-large", &runtimeapi.Mount{ContainerPath: "/big", HostPath: big}, "--volume-max-bytes"},
		{"socket", &runtimeapi.Mount{ContainerPath: "/run/app.sock", HostPath: filepath.Join(sockDir, "app.sock")}, "is a socket"},
		{"bidirectional", &runtimeapi.Mount{ContainerPath: "/mnt", HostPath: t.TempDir(),
			Propagation: runtimeapi.MountPropagation_PROPAGATION_BIDIRECTIONAL}, "bidirectional"},
		{"relative", &runtimeapi.Mount{ContainerPath: "etc/app", HostPath: t.TempDir()}, "absolute path"},
	} {
		cfg := containerConfig(tc.name, snapRef)
		cfg.Mounts = []*runtimeapi.Mount{tc.mount}
		msg := n.crictlFails("InvalidArgument", "create", "--no-pull", podID, n.configFile(tc.name+".json", cfg), podFile)
		if !strings.Contains(msg, tc.mount.GetContainerPath()) || !strings.Contains(msg, tc.want) {
			t.Errorf("%s: the refusal %q does not name %s and %q", tc.name, msg, tc.mount.GetContainerPath(), tc.want)
		}
	}
	if out := n.mustCrictl("ps", "-a", "-q", "-p", podID); out != "" {
		t.Fatalf("refused containers were recorded: %q", out)
	}

	old := oldCocoonNode(t)
	cfg := containerConfig("vol", snapRef)
	cfg.Mounts = []*runtimeapi.Mount{{ContainerPath: "/etc/app", HostPath: t.TempDir(), Readonly: true}}
	msg := old.createRefused("nopath", cfg)
	if !strings.Contains(msg, "/etc/app") || !strings.Contains(msg, "--guest-ssh-key-file") {
		t.Fatalf("a volume with no way into the guest: %s", msg)
	}
	// The files the kubelet gives every container are left out there rather than refused: the
	// VM's own init is the workload, and it runs.
	podDir := t.TempDir()
	termLog := filepath.Join(podDir, "containers", "app", "8d1c2f0a")
	for _, f := range []string{filepath.Join(podDir, "etc-hosts"), termLog} {
		if err := os.MkdirAll(filepath.Dir(f), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(f, nil, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	_, ctrID, _ := old.runningPodWith("kubeletfiles", snapRef, func(cfg *runtimeapi.ContainerConfig) {
		cfg.Mounts = []*runtimeapi.Mount{
			{ContainerPath: "/etc/hosts", HostPath: filepath.Join(podDir, "etc-hosts")},
			{ContainerPath: "/dev/termination-log", HostPath: termLog},
		}
	})
	for deadline := time.Now().Add(time.Minute); !strings.Contains(old.Log(), `msg="the guest has the container's devices and volumes" container=`+ctrID); time.Sleep(100 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("the guest was never ready for the container:\n%s", old.Log())
		}
	}
	if st := field(old.inspect("inspect", ctrID), "status", "state"); st != "CONTAINER_RUNNING" {
		t.Fatalf("a container with only the kubelet's files, on a cocoon with no way into guests: %v", st)
	}
}

// TestVolumesAreSharedWithTheGuest: a VM whose memory is shared (a snapshot of a VM created with
// --shared-memory) gets its directory volumes through a virtio-fs share served by a virtiofsd of
// its own: a write in the guest reaches the node, a ConfigMap's ..data swap reaches the guest as
// it happens, a read-only volume refuses writes, and a single file is still copied. The share
// outlives a restart of cocoon-cri, and goes with the VM: no virtiofsd, bind or directory is left.
func TestVolumesAreSharedWithTheGuest(t *testing.T) {
	t.Parallel()
	n := newNode(t)
	const sharedRef = "e2e/shared:v1"
	n.ImportImage(sharedRef, n.SnapshotImage("shared", testimage.SnapshotOptions{SharedMemory: true}))
	configMap := t.TempDir()
	kubeletAtomicWrite(t, configMap, "..2026_11_26_10_00_00.1", map[string]string{"greeting": "hello"})
	emptyDir := t.TempDir()
	hosts := filepath.Join(t.TempDir(), "etc-hosts")
	if err := os.WriteFile(hosts, []byte("10.1.2.3\tshared-pod\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	// No command: the VM's init is the workload, so the VM runs on across a restart of cocoon-cri.
	_, ctrID, _ := n.runningPodWith("shared", sharedRef, func(cfg *runtimeapi.ContainerConfig) {
		cfg.Mounts = []*runtimeapi.Mount{
			{ContainerPath: "/etc/app", HostPath: configMap, Readonly: true},
			{ContainerPath: "/data", HostPath: emptyDir},
			{ContainerPath: "/etc/hosts", HostPath: hosts},
		}
	})
	for deadline := time.Now().Add(time.Minute); ; time.Sleep(200 * time.Millisecond) {
		if got, _ := n.crictl("exec", ctrID, "cat", "/etc/app/greeting"); got == "hello" {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("a minute after the start the guest has no /etc/app/greeting")
		}
	}
	inGuest := func(script string) string {
		t.Helper()
		return n.mustCrictl("exec", ctrID, "sh", "-c", script)
	}
	// virtiofsd runs as two processes: the one cocoon-cri started, and its sandboxed child.
	servers := n.Virtiofsds()
	if len(servers) == 0 {
		t.Fatal("no virtiofsd serves the node's share")
	}
	// The node's directory itself: what the guest writes is on the node at once.
	inGuest("echo from-guest > /data/written")
	if got, err := os.ReadFile(filepath.Join(emptyDir, "written")); err != nil || string(got) != "from-guest\n" {
		t.Fatalf("the guest's write on the node: %q, %v", got, err)
	}
	if err := os.WriteFile(filepath.Join(emptyDir, "from-node"), []byte("node"), 0o644); err != nil {
		t.Fatal(err)
	}
	if got := inGuest("cat /data/from-node"); got != "node" {
		t.Fatalf("the node's write in the guest: %q", got)
	}
	// No copy of the directories in the guest's memory; the single file is still a copy.
	if got := inGuest("grep -rqs from-guest /run/cocoon-cri/volumes && echo copied; grep shared-pod /etc/hosts"); got != "10.1.2.3\tshared-pod" {
		t.Fatalf("the guest's copies and /etc/hosts: %q", got)
	}
	if out, err := n.crictl("exec", ctrID, "sh", "-c", "echo x > /etc/app/new"); err == nil {
		t.Fatalf("a read-only volume took a write from the guest: %q", out)
	}
	if _, err := os.Stat(filepath.Join(configMap, "new")); err == nil {
		t.Fatal("a write to a read-only volume reached the node")
	}
	swapReaches(t, n, ctrID, configMap, "..2026_11_26_10_01_00.2", "bonjour")

	n.Restart()
	swapReaches(t, n, ctrID, configMap, "..2026_11_26_10_02_00.3", "hola")
	if after := n.Virtiofsds(); !slices.Equal(after, servers) {
		t.Fatalf("virtiofsd after a restart of cocoon-cri: %v, want the same %v", after, servers)
	}

	n.mustCrictl("stop", ctrID)
	if left := n.Virtiofsds(); len(left) != 0 {
		t.Fatalf("virtiofsd left after the container stopped: %v", left)
	}
	if mounts := harness.MountsUnder(t, filepath.Join(n.StateDir, "shares")); len(mounts) != 0 {
		t.Fatalf("the share's binds left after the container stopped: %v", mounts)
	}
	if entries, _ := os.ReadDir(filepath.Join(n.StateDir, "shares")); len(entries) != 0 {
		t.Fatalf("the shares directory holds %d entries after the container stopped", len(entries))
	}
	if got, err := os.ReadFile(filepath.Join(emptyDir, "written")); err != nil || string(got) != "from-guest\n" {
		t.Fatalf("the volume after the share went: %q, %v", got, err)
	}
}
