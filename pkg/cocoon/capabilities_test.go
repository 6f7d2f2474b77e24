package cocoon

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"
)

// The help cocoon prints (cobra's layout, abbreviated) for the subcommands the probe reads.
const (
	vmHelp = "Manage virtual machines\n\nUsage:\n  cocoon vm [command]\n\nAvailable Commands:\n  clone       Clone a new VM from a snapshot\n"

	cloneHelpV038 = "Clone a new VM from a snapshot\n\nUsage:\n  cocoon vm clone [flags] SNAPSHOT\n\nFlags:\n" +
		"      --bridge string    use TAP-on-bridge instead of CNI\n      --cpu int          boot CPUs (0 = inherit from snapshot)\n" +
		"  -h, --help             help for clone\n      --memory string    memory size (empty = inherit from snapshot)\n" +
		"      --name string      VM name\n      --nics int         override NIC count\n      --no-direct-io     disable O_DIRECT\n" +
		"      --on-demand        use UFFD on-demand memory loading\n  -o, --output string    output format\n" +
		"      --pull             auto-pull base image\n      --storage string   COW disk size (empty = inherit from snapshot)\n"

	cloneHelpV05 = "Clone a new VM from a snapshot (or a directory via --from-dir)\n\nUsage:\n  cocoon vm clone [flags] [SNAPSHOT]\n\nFlags:\n" +
		"      --bridge string          use TAP-on-bridge instead of CNI\n      --from-dir string        clone from a snapshot directory\n" +
		"  -h, --help                   help for clone\n      --name string            VM name (default: cocoon-clone-<id>)\n" +
		"      --nics int               override NIC count (omit to inherit from snapshot)\n      --no-direct-io           disable O_DIRECT\n" +
		"  -o, --output string          output format\n      --pull                   auto-pull base image\n" +
		"      --restore-mode string    memory restore: copy|ondemand|mmap\n"

	execHelp       = "Run a command inside a running VM via cocoon-agent (vsock)\n\nUsage:\n  cocoon vm exec [flags] VM -- COMMAND [ARGS...]\n\nFlags:\n  -e, --env stringArray   extra env var KEY=VALUE\n  -i, --interactive       attach the caller's stdin\n"
	diskAttachHelp = "Hot-attach a raw disk file to a running VM\n\nUsage:\n  cocoon vm disk attach VM [flags]\n\nFlags:\n" +
		"      --directio string   O_DIRECT for the disk (default \"auto\")\n      --name string       disk name\n" +
		"  -o, --output string     output format\n      --path string       absolute path to an existing raw disk file\n      --readonly          attach read-only\n"
	deviceAttachHelp = "Attach a VFIO PCI device to a running VM\n\nUsage:\n  cocoon vm device attach VM [flags]\n\nFlags:\n" +
		"      --id string       optional device id\n  -o, --output string   output format\n      --pci string      BDF (01:00.0 / 0000:01:00.0) or sysfs path\n"
	fsAttachHelp = "Attach a vhost-user-fs device to a running VM\n\nUsage:\n  cocoon vm fs attach VM [flags]\n\nFlags:\n" +
		"  -h, --help             help for attach\n      --num-queues int   request queues (0 = default 1)\n  -o, --output string    output format\n" +
		"      --queue-size int   queue depth (0 = default 1024)\n      --socket string    absolute path to a virtiofsd unix socket (required)\n" +
		"      --tag string       guest mount tag (required; also detach key)\n"
	createHelpV038 = "Create a VM from an image\n\nUsage:\n  cocoon vm create [flags] IMAGE\n\nFlags:\n" +
		"      --cpu int          boot CPUs\n      --name string      VM name\n      --storage string   COW disk size\n"
	restoreHelpV038 = "Restore a running VM to a previous snapshot\n\nUsage:\n  cocoon vm restore [flags] VM SNAPSHOT\n\nFlags:\n" +
		"      --cpu int          boot CPUs\n      --memory string    memory size\n      --on-demand        use UFFD on-demand memory loading\n"
	createHelpV05 = "Create a VM from an image\n\nUsage:\n  cocoon vm create [flags] IMAGE\n\nFlags:\n" +
		"      --fc                 use Firecracker backend\n      --name string        VM name\n" +
		"      --shared-memory      enable CH memory shared=on; required to attach vhost-user-fs later\n"
	hibernateHelp  = "Snapshot a running VM and stop it atomically\n\nUsage:\n  cocoon vm hibernate [flags] VM\n\nFlags:\n      --description string   snapshot description\n  -h, --help                 help for hibernate\n      --name string          snapshot name\n"
	restoreHelp    = "Restore a VM from a snapshot\n\nUsage:\n  cocoon vm restore [flags] VM [SNAPSHOT]\n\nFlags:\n      --force                 accept a foreign snapshot directory\n      --from-dir string       restore from a snapshot directory\n  -h, --help                  help for restore\n      --restore-mode string   memory restore mode: copy, ondemand or mmap (default \"copy\")\n"
	exportHelpV038 = "Export a snapshot to a portable archive file\n\nUsage:\n  cocoon snapshot export SNAPSHOT [flags]\n\nFlags:\n" +
		"      --gzip            compress output with gzip\n  -o, --output string   output file path (default: <name-or-id>.tar)\n"
	exportHelpV05 = exportHelpV038 + "      --to-dir string   export into a directory (must be empty/absent) instead of a tar; pairs with 'vm clone --from-dir'\n"
	reseedHelp    = "Force a CRNG reseed inside the guest\n\nUsage:\n  cocoon vm reseed VM [flags]\n\nFlags:\n  -h, --help         help for reseed\n      --machine-id   also regenerate /etc/machine-id\n"
)

func versionOutput(v string) string {
	return "Version:        " + v + "\nGit hash:       abc\nBuilt:          now\nGolang version: go1.26\nOS/Arch:        linux/amd64\n"
}

// v038Probe and v05Probe answer the capability probe as those releases do; they go before any
// other response, which a "vm clone" match would otherwise catch.
func v038Probe() []response {
	return []response{
		{match: "version", stdout: versionOutput("v0.3.8")},
		{match: "vm clone --help", stdout: cloneHelpV038},
		{match: "vm exec --help", stdout: vmHelp},
		{match: "vm reseed --help", stdout: vmHelp},
		{match: "vm disk attach --help", stdout: vmHelp},
		{match: "vm device attach --help", stdout: vmHelp},
		{match: "vm fs attach --help", stdout: vmHelp},
		{match: "vm create --help", stdout: createHelpV038},
		{match: "vm hibernate --help", stdout: vmHelp},
		{match: "vm restore --help", stdout: restoreHelpV038},
		{match: "snapshot export --help", stdout: exportHelpV038},
	}
}

func v05Probe() []response {
	return []response{
		{match: "version", stdout: versionOutput("v0.5.1")},
		{match: "vm clone --help", stdout: cloneHelpV05},
		{match: "vm exec --help", stdout: execHelp},
		{match: "vm reseed --help", stdout: reseedHelp},
		{match: "vm disk attach --help", stdout: diskAttachHelp},
		{match: "vm device attach --help", stdout: deviceAttachHelp},
		{match: "vm fs attach --help", stdout: fsAttachHelp},
		{match: "vm create --help", stdout: createHelpV05},
		{match: "vm hibernate --help", stdout: hibernateHelp},
		{match: "vm restore --help", stdout: restoreHelp},
		{match: "snapshot export --help", stdout: exportHelpV05},
	}
}

// probedV05 is what v05Probe's answers say.
var probedV05 = Capabilities{Version: "v0.5.1", Exec: true, CloneRestoreMode: true, ReseedMachineID: true, DiskAttach: true,
	DeviceAttach: true, FsAttach: true, Hibernate: true, RestoreMode: true, SnapshotDirs: true}

func TestCapabilitiesReadTheBinarysHelp(t *testing.T) {
	old, _ := fakeCocoon(t, v038Probe()...)
	caps, err := old.Capabilities(context.Background())
	want := Capabilities{Version: "v0.3.8", CloneResize: true, CloneOnDemand: true}
	if err != nil || caps != want {
		t.Fatalf("v0.3.8: %+v %v, want %+v", caps, err, want)
	}
	current, dir := fakeCocoon(t, v05Probe()...)
	for range 3 {
		if caps, err = current.Capabilities(context.Background()); err != nil || caps != probedV05 {
			t.Fatalf("v0.5: %+v %v, want %+v", caps, err, probedV05)
		}
	}
	if n := len(calls(t, dir)); n != len(v05Probe()) {
		t.Fatalf("%d calls for three probes, want one probe (a call per response) per binary", n)
	}
}

func TestCapabilitiesAreProbedAgainAfterAFailure(t *testing.T) {
	c, dir := fakeCocoon(t, response{match: "version", stderr: "Error: broken install\n", code: 1})
	for range 2 {
		if _, err := c.Capabilities(context.Background()); err == nil || !strings.Contains(err.Error(), "broken install") {
			t.Fatalf("probe of a failing cocoon: %v", err)
		}
	}
	if n := len(calls(t, dir)); n != 2 {
		t.Fatalf("%d calls: a failed probe must not be cached", n)
	}
}

// A cocoon whose clone cannot resize gets no sizes, and --restore-mode where --on-demand is gone.
func TestCloneFlagsFollowTheCapabilities(t *testing.T) {
	o := CloneOptions{Name: "vm", CPU: 2, Memory: 2 << 30, Storage: 20 << 30, NICs: 1, OnDemand: true, Pull: true}
	cases := []struct {
		caps Capabilities
		want string
	}{
		{Capabilities{CloneResize: true, CloneOnDemand: true},
			"--name vm --cpu 2 --memory 2147483648 --storage 21474836480 --nics 1 --on-demand --pull"},
		{Capabilities{CloneOnDemand: true}, "--name vm --nics 1 --on-demand --pull"},
		{Capabilities{CloneRestoreMode: true, CloneOnDemand: true}, "--name vm --nics 1 --restore-mode ondemand --pull"},
		{Capabilities{}, "--name vm --nics 1 --pull"},
	}
	copied := CloneOptions{Name: "vm", CopyMemory: true}
	if got := strings.Join(copied.args(Capabilities{CloneRestoreMode: true}), " "); got != "--name vm --restore-mode copy" {
		t.Errorf("a clone that copies its memory: %s", got)
	}
	if got := strings.Join(copied.args(Capabilities{CloneOnDemand: true}), " "); got != "--name vm" {
		t.Errorf("a clone that copies its memory, v0.3.8: %s", got)
	}
	for _, c := range cases {
		if got := strings.Join(o.args(c.caps), " "); got != c.want {
			t.Errorf("%+v: %s, want %s", c.caps, got, c.want)
		}
	}
}

// A probe in flight holds nobody past their own context: a caller whose context ends gets that
// error at once, while the probe carries on for the callers that wait.
func TestCapabilitiesWaitNoLongerThanTheCallersContext(t *testing.T) {
	// The probe's first call waits until the test ends its sleep.
	c, dir := fakeCocoon(t, append([]response{{match: "version", stdout: versionOutput("v0.5.1"), sleep: "600"}}, v05Probe()[1:]...)...)
	first := make(chan error, 1)
	go func() {
		_, err := c.Capabilities(context.Background())
		first <- err
	}()
	// The sleeper's PID is written once the probe's first call runs.
	var sleeper int
	for deadline := time.Now().Add(time.Minute); sleeper <= 0; time.Sleep(10 * time.Millisecond) {
		pidText, _ := os.ReadFile(filepath.Join(dir, "child.pid"))
		sleeper, _ = strconv.Atoi(strings.TrimSpace(string(pidText)))
		if sleeper <= 0 && time.Now().After(deadline) {
			t.Fatal("the probe never started")
		}
	}
	// Also when the test fails before it lets the probe go on.
	t.Cleanup(func() { _ = syscall.Kill(sleeper, syscall.SIGKILL) })
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	second := make(chan error, 1)
	go func() {
		_, err := c.Capabilities(ctx)
		second <- err
	}()
	select {
	case err := <-second:
		if !errors.Is(err, context.Canceled) {
			t.Fatalf("a caller whose context ended: %v", err)
		}
	case <-time.After(time.Minute):
		t.Fatal("a caller whose context ended is held by the probe in flight")
	}
	if err := syscall.Kill(sleeper, syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	if err := <-first; err != nil {
		t.Fatalf("the probe in flight: %v", err)
	}
}

// A restarted cocoon-cri (a new probe, the same file) asks only for the version while nothing
// changed; a replaced binary, another version or a damaged file means the whole probe again.
func TestCapabilitiesAreKeptAcrossRestarts(t *testing.T) {
	c, dir := fakeCocoon(t, v05Probe()...)
	c.opts.CapabilitiesFile = filepath.Join(t.TempDir(), "state", "cocoon-capabilities.json")
	v05, probeCalls := probedV05, len(v05Probe())
	calledBefore := 0
	restart := func(what string, want Capabilities, wantCalls int) {
		t.Helper()
		caps, err := probe(context.Background(), c)
		if err != nil || caps != want {
			t.Fatalf("%s: %+v %v, want %+v", what, caps, err, want)
		}
		all := calls(t, dir)
		if n := len(all) - calledBefore; n != wantCalls {
			t.Fatalf("%s: %d cocoon calls (%v), want %d", what, n, all[calledBefore:], wantCalls)
		}
		calledBefore = len(all)
	}
	restart("first start", v05, probeCalls)
	restart("restart", v05, 1)

	// Replaced as a package manager does: a new file renamed over the old one.
	bin := filepath.Join(dir, "cocoon")
	script, err := os.ReadFile(bin)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(bin+".new", script, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.Rename(bin+".new", bin); err != nil {
		t.Fatal(err)
	}
	restart("replaced binary", v05, probeCalls)
	restart("restart after the replacement", v05, 1)

	// The binary stays, the version it reports changes (a wrapper's target was upgraded).
	if err := os.WriteFile(filepath.Join(dir, "out0"), []byte(versionOutput("v0.5.2")), 0o644); err != nil {
		t.Fatal(err)
	}
	v052 := v05
	v052.Version = "v0.5.2"
	restart("another version", v052, probeCalls)

	if err := os.WriteFile(c.opts.CapabilitiesFile, []byte(`{"key": 7`), 0o600); err != nil {
		t.Fatal(err)
	}
	restart("damaged file", v052, probeCalls)
	restart("restart after the damaged file", v052, 1)
}

// A snapshot directory is exported with --to-dir and cloned with --from-dir in place of the
// positional snapshot.
func TestSnapshotDirectoryArgs(t *testing.T) {
	c, dir := fakeCocoon(t, append(v05Probe(),
		response{match: "snapshot export --to-dir"},
		response{match: "vm clone", stdout: strings.ReplaceAll(vmJSON, "%PID%", "42")},
	)...)
	ctx := context.Background()
	if err := c.SnapshotExportToDir(ctx, "ckpt", "/checkpoints/c1"); err != nil {
		t.Fatal(err)
	}
	if _, err := c.VMClone(ctx, "/checkpoints/c1", CloneOptions{Name: "restored", FromDir: true}); err != nil {
		t.Fatal(err)
	}
	got := slices.DeleteFunc(calls(t, dir), func(c string) bool { return strings.HasSuffix(c, "--help") || strings.HasSuffix(c, " version") })
	want := []string{"snapshot export --to-dir /checkpoints/c1 ckpt", "vm clone --name restored -o json --from-dir /checkpoints/c1"}
	for i, w := range want {
		if i >= len(got) || !strings.HasSuffix(got[i], " "+w) {
			t.Fatalf("argv %q\nwant suffixes %q", got, want)
		}
	}
}
