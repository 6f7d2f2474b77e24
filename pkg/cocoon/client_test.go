package cocoon

import (
	"bytes"
	"context"
	"errors"
	"io"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/cocoonstack/cocoon-cri/pkg/waittime"
)

// The outputs below are written from docs/cocoon-contract.md (sections 1.1-1.8): what
// cocoon v0.3.8 prints on stdout, its zerolog console lines with ANSI colours on stderr, and the
// cobra "Error: " line with exit code 1.

const vmJSON = `{"id":"2RZK3AEDFZUFVHF6YX3YHQPH75","hypervisor":"cloud-hypervisor","state":"running",` +
	`"config":{"cpu":2,"memory":1073741824,"storage":10737418240,"image":"ghcr.io/x/ubuntu:24.04",` +
	`"image_type":"oci","name":"cri-demo"},"pid":%PID%,"socket_path":"/run/cocoon/cloudhypervisor/2RZK3AEDFZUFVHF6YX3YHQPH75/api.sock",` +
	`"network_configs":[{"tap":"tap2RZK3AED-0","mac":"02:00:00:aa:bb:cc","num_queues":4,"queue_size":512,` +
	`"netns_path":"/var/run/netns/cocoon-2RZK3AEDFZUFVHF6YX3YHQPH75","network":{"ip":"10.88.0.5","gateway":"10.88.0.1","prefix":16}}],` +
	`"first_booted":true,"created_at":"2026-11-22T10:00:00Z","updated_at":"2026-11-22T10:00:01Z","started_at":"2026-11-22T10:00:01Z"}`

const logLine = "\x1b[90m2026-11-22T10:00:00Z\x1b[0m \x1b[32mINF\x1b[0m doing things \x1b[36mfunc=\x1b[0mcmd.vm.rm\n"

// response is what the fake prints for calls whose argv contains match.
type response struct {
	match  string
	stdout string
	stderr string
	code   int
	sleep  string // seconds, for timeout tests
}

// fakeCocoon writes an executable that answers like cocoon and records each argv (one line per
// call) in argv.log and its stdin in stdin.log. It returns the client and the directory.
func fakeCocoon(t *testing.T, responses ...response) (*Client, string) {
	t.Helper()
	dir := t.TempDir()
	var b strings.Builder
	b.WriteString("#!/bin/sh\n")
	b.WriteString(`echo "$*" >> "` + dir + `/argv.log"` + "\n")
	b.WriteString(`cat >> "` + dir + `/stdin.log"` + "\n")
	b.WriteString("case \"$*\" in\n")
	for i, r := range responses {
		for _, part := range []struct{ name, body string }{{"out", r.stdout}, {"err", r.stderr}} {
			if err := os.WriteFile(filepath.Join(dir, part.name+itoa(i)), []byte(part.body), 0o644); err != nil {
				t.Fatal(err)
			}
		}
		b.WriteString("*\"" + r.match + "\"*)\n")
		if r.sleep != "" {
			// A grandchild that outlives the shell shows the whole process group is stopped.
			b.WriteString("  echo $$ > \"" + dir + "/shell.pid\"; sleep " + r.sleep + " & echo $! > \"" + dir + "/child.pid\"; wait\n")
		}
		b.WriteString("  cat \"" + dir + "/out" + itoa(i) + "\"; cat \"" + dir + "/err" + itoa(i) + "\" >&2; exit " + itoa(r.code) + ";;\n")
	}
	b.WriteString("esac\necho 'Error: unexpected call' >&2; exit 1\n")
	bin := filepath.Join(dir, "cocoon")
	if err := os.WriteFile(bin, []byte(b.String()), 0o755); err != nil {
		t.Fatal(err)
	}
	return New(Options{Binary: bin, RootDir: "/r", RunDir: "/run/c", LogDir: "/log/c"}), dir
}

func itoa(i int) string { return strconv.Itoa(i) }

func calls(t *testing.T, dir string) []string {
	t.Helper()
	data, err := os.ReadFile(filepath.Join(dir, "argv.log"))
	if err != nil {
		t.Fatal(err)
	}
	return strings.Split(strings.TrimSpace(string(data)), "\n")
}

func TestListsTreatNoFoundTextAsEmpty(t *testing.T) {
	c, _ := fakeCocoon(t,
		response{match: "vm list", stdout: "No VMs found.\n"},
		response{match: "image list", stdout: "No images found.\n"},
		response{match: "snapshot list", stdout: "No snapshots found.\n"},
	)
	ctx := context.Background()
	vms, err := c.VMList(ctx)
	if err != nil || len(vms) != 0 {
		t.Fatalf("VMList = %v, %v; want empty", vms, err)
	}
	images, err := c.ImageList(ctx)
	if err != nil || len(images) != 0 {
		t.Fatalf("ImageList = %v, %v; want empty", images, err)
	}
	snaps, err := c.SnapshotList(ctx)
	if err != nil || len(snaps) != 0 {
		t.Fatalf("SnapshotList = %v, %v; want empty", snaps, err)
	}
}

// TestEmptyJSONListIsEmpty: v0.5 prints [] for an empty vm list -o json.
func TestEmptyJSONListIsEmpty(t *testing.T) {
	c, _ := fakeCocoon(t, response{match: "vm list", stdout: "[]\n"})
	if vms, err := c.VMList(context.Background()); err != nil || len(vms) != 0 {
		t.Fatalf("VMList = %v, %v; want empty", vms, err)
	}
}

func TestReseedPassesMachineID(t *testing.T) {
	c, dir := fakeCocoon(t, response{match: "vm reseed --machine-id BAD", stderr: "Error: reseed: dial agent: read CONNECT reply: EOF\n", code: 1}, response{match: "vm reseed"})
	if err := c.VMReseed(context.Background(), "ID1", true); err != nil {
		t.Fatal(err)
	}
	if err := c.VMReseed(context.Background(), "ID2", false); err != nil {
		t.Fatal(err)
	}
	err := c.VMReseed(context.Background(), "BAD", true)
	if err == nil || !strings.Contains(err.Error(), "dial agent: read CONNECT reply: EOF") {
		t.Fatalf("a guest without agent: %v", err)
	}
	got := calls(t, dir)
	if !strings.HasSuffix(got[0], "vm reseed --machine-id ID1") || !strings.HasSuffix(got[1], "vm reseed ID2") {
		t.Fatalf("argv %q", got)
	}
}

func TestVMListDecodesRawRecords(t *testing.T) {
	c, dir := fakeCocoon(t, response{match: "vm list", stdout: "[" + strings.ReplaceAll(vmJSON, "%PID%", "4242") + "]\n"})
	vms, err := c.VMList(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	if len(vms) != 1 {
		t.Fatalf("got %d VMs", len(vms))
	}
	vm := vms[0]
	if vm.ID != "2RZK3AEDFZUFVHF6YX3YHQPH75" || vm.State != VMStateRunning || vm.PID != 4242 || vm.Config.Name != "cri-demo" {
		t.Fatalf("decoded %+v", vm)
	}
	if vm.Config.CPU != 2 || vm.Config.Memory != 1<<30 || vm.Config.ImageType != ImageTypeOCI {
		t.Fatalf("config %+v", vm.Config)
	}
	if ip := vm.NetworkConfigs[0].Network.IP; ip != "10.88.0.5" {
		t.Fatalf("ip %q", ip)
	}
	want := "--root-dir /r --run-dir /run/c --log-dir /log/c vm list -o json"
	if got := calls(t, dir)[0]; got != want {
		t.Fatalf("argv %q, want %q", got, want)
	}
}

func TestErrorsAreClassifiedFromStderr(t *testing.T) {
	cases := []struct {
		name    string
		stderr  string
		run     func(*Client) error
		kind    error
		message string
	}{
		{
			name:    "inspect missing VM",
			stderr:  logLine + "Error: inspect: vm nosuch: VM not found\n",
			run:     func(c *Client) error { _, err := c.VMInspect(context.Background(), "nosuch"); return err },
			kind:    ErrNotFound,
			message: "inspect: vm nosuch: VM not found",
		},
		{
			name:    "rm missing VM",
			stderr:  logLine + "\x1b[31mError: vm nosuch: VM not found\x1b[0m\n",
			run:     func(c *Client) error { return c.VMRemove(context.Background(), "nosuch", true) },
			kind:    ErrNotFound,
			message: "vm nosuch: VM not found",
		},
		{
			name:   "rm running VM without force",
			stderr: "Error: running (force required)\n",
			run:    func(c *Client) error { return c.VMRemove(context.Background(), "2RZK3AEDFZUFVHF6YX3YHQPH75", false) },
			kind:   ErrInUse,
		},
		{
			name:   "VFIO group held by another VM",
			stderr: "Error: vm.add-device: cloud-hypervisor: 500: DeviceManager(VfioCreate(OpenGroup(Os { code: 16, kind: ResourceBusy, message: \"Device or resource busy\" })))\n",
			run: func(c *Client) error {
				return c.VMDeviceAttach(context.Background(), "vm", "0000:01:00.0", "vfio-0000-01-00.0")
			},
			kind: ErrInUse,
		},
		{
			name:   "snapshot rm missing",
			stderr: "Error: rm: resolve \"x\": snapshot not found\n",
			run:    func(c *Client) error { return c.SnapshotRemove(context.Background(), "x") },
			kind:   ErrNotFound,
		},
		{
			name:   "image rm missing",
			stderr: "Error: image \"x\": not found in any backend\n",
			run:    func(c *Client) error { return c.ImageRemove(context.Background(), "x") },
			kind:   ErrNotFound,
		},
		{
			name:   "duplicate VM name",
			stderr: "Error: clone VM: vm name \"a\" already exists (id: 2RZK3AEDFZUFVHF6YX3YHQPH75)\n",
			run: func(c *Client) error {
				_, err := c.VMClone(context.Background(), "snap", CloneOptions{Name: "a"})
				return err
			},
			kind: ErrAlreadyExists,
		},
		{
			name:   "too many vCPUs",
			stderr: "Error: requested 64 vCPUs exceeds host cores (2)\n",
			run: func(c *Client) error {
				_, err := c.VMCreate(context.Background(), "img", CreateOptions{Name: "a", CPU: 64, Memory: 1 << 30, Storage: 10 << 30})
				return err
			},
			kind: ErrInvalid,
		},
		{
			name:   "image missing at create",
			stderr: "Error: image \"img\" not resolved: oci: not found; cloudimg: not found\n",
			run: func(c *Client) error {
				_, err := c.VMCreate(context.Background(), "img", CreateOptions{Name: "a", CPU: 1, Memory: 1 << 30, Storage: 10 << 30})
				return err
			},
			kind: ErrNotFound,
		},
		{
			name:   "command missing in this cocoon",
			stderr: "Error: unknown command \"exec\" for \"cocoon vm\"\n",
			run: func(c *Client) error {
				_, err := c.run(context.Background(), call{args: []string{"vm", "exec", "x"}})
				return err
			},
			kind: ErrUnsupported,
		},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			c, _ := fakeCocoon(t, response{match: "", stderr: tc.stderr, code: 1})
			err := tc.run(c)
			if !errors.Is(err, tc.kind) {
				t.Fatalf("err = %v, want kind %v", err, tc.kind)
			}
			var ce *CommandError
			if !errors.As(err, &ce) || ce.ExitCode != 1 {
				t.Fatalf("err = %#v, want *CommandError with exit code 1", err)
			}
			if strings.Contains(ce.Message, "\x1b") {
				t.Fatalf("message keeps ANSI codes: %q", ce.Message)
			}
			if tc.message != "" && ce.Message != tc.message {
				t.Fatalf("message %q, want %q", ce.Message, tc.message)
			}
		})
	}
}

func TestUnclassifiedFailureKeepsLastLine(t *testing.T) {
	c, _ := fakeCocoon(t, response{match: "vm start", stderr: logLine + "panic: boom\n", code: 2})
	err := c.VMStart(context.Background(), "X")
	var ce *CommandError
	if !errors.As(err, &ce) || ce.ExitCode != 2 || ce.Message != "panic: boom" || ce.Kind != nil {
		t.Fatalf("err = %#v", err)
	}
	for _, kind := range []error{ErrNotFound, ErrAlreadyExists, ErrInUse, ErrInvalid, ErrUnsupported} {
		if errors.Is(err, kind) {
			t.Fatalf("unclassified failure matches %v", kind)
		}
	}
}

func TestCloneInspectsForThePID(t *testing.T) {
	c, dir := fakeCocoon(t, append(v038Probe(),
		response{match: "vm clone", stdout: strings.ReplaceAll(vmJSON, "%PID%", "0") + "\n", stderr: logLine},
		response{match: "vm inspect", stdout: strings.ReplaceAll(vmJSON, "%PID%", "777") + "\n"},
	)...)
	vm, err := c.VMClone(context.Background(), "snap-a", CloneOptions{Name: "cri-demo", CPU: 2, Memory: 2 << 30, OnDemand: true})
	if err != nil {
		t.Fatal(err)
	}
	if vm.PID != 777 {
		t.Fatalf("pid %d, want the inspected 777", vm.PID)
	}
	got := calls(t, dir)[len(v038Probe()):]
	want := []string{
		"--root-dir /r --run-dir /run/c --log-dir /log/c vm clone --name cri-demo --cpu 2 --memory 2147483648 --on-demand -o json snap-a",
		"--root-dir /r --run-dir /run/c --log-dir /log/c vm inspect 2RZK3AEDFZUFVHF6YX3YHQPH75",
	}
	if strings.Join(got, "\n") != strings.Join(want, "\n") {
		t.Fatalf("argv:\n%s\nwant:\n%s", strings.Join(got, "\n"), strings.Join(want, "\n"))
	}
}

func TestCloneWithoutNameIsRefusedBeforeCallingCocoon(t *testing.T) {
	c, dir := fakeCocoon(t)
	_, err := c.VMClone(context.Background(), "snap", CloneOptions{})
	if !errors.Is(err, ErrInvalid) {
		t.Fatalf("err = %v", err)
	}
	if _, statErr := os.Stat(filepath.Join(dir, "argv.log")); !os.IsNotExist(statErr) {
		t.Fatal("cocoon was called")
	}
}

func TestCreatePassesEveryFlagExplicitly(t *testing.T) {
	c, dir := fakeCocoon(t, response{match: "vm create", stdout: strings.ReplaceAll(strings.ReplaceAll(vmJSON, "%PID%", "0"), `"running"`, `"created"`)})
	c = c.WithNetwork("/cni/conf", "/cni/bin", []string{"10.0.0.10", "10.0.0.11"})
	vm, err := c.VMCreate(context.Background(), "ubuntu", CreateOptions{
		Name: "vm1", CPU: 1, Memory: 512 << 20, Storage: 10 << 30, NICs: 0, Windows: true, NoDirectIO: true,
	})
	if err != nil {
		t.Fatal(err)
	}
	if vm.State != VMStateCreated {
		t.Fatalf("state %q", vm.State)
	}
	want := "--root-dir /r --run-dir /run/c --log-dir /log/c --cni-conf-dir /cni/conf --cni-bin-dir /cni/bin --dns 10.0.0.10,10.0.0.11 " +
		"vm create --name vm1 --cpu 1 --memory 536870912 --storage 10737418240 --nics 0 --no-direct-io --windows -o json ubuntu"
	if got := calls(t, dir)[0]; got != want {
		t.Fatalf("argv %q\nwant %q", got, want)
	}
}

// A VM for vhost-user-fs shares is created with --shared-memory; shares are attached and
// detached by tag, the VM last, as cocoon v0.5's vm fs takes them.
func TestSharedMemoryAndFsAttachArgs(t *testing.T) {
	c, dir := fakeCocoon(t,
		response{match: "vm create", stdout: strings.ReplaceAll(strings.ReplaceAll(vmJSON, "%PID%", "0"), `"running"`, `"created"`)},
		response{match: "vm fs attach"},
		response{match: "vm fs detach"},
	)
	if _, err := c.VMCreate(context.Background(), "img", CreateOptions{Name: "vm1", CPU: 1, Memory: 1 << 30, Storage: 10 << 30, SharedMemory: true}); err != nil {
		t.Fatal(err)
	}
	if err := c.VMFsAttach(context.Background(), "vm1", "/run/vfs/data.sock", "data"); err != nil {
		t.Fatal(err)
	}
	if err := c.VMFsDetach(context.Background(), "vm1", "data"); err != nil {
		t.Fatal(err)
	}
	got := calls(t, dir)
	want := []string{
		"vm create --name vm1 --cpu 1 --memory 1073741824 --storage 10737418240 --nics 0 --shared-memory -o json img",
		"vm fs attach --socket /run/vfs/data.sock --tag data vm1",
		"vm fs detach --tag data vm1",
	}
	for i, w := range want {
		if i >= len(got) || !strings.HasSuffix(got[i], " "+w) {
			t.Fatalf("argv %q\nwant suffixes %q", got, want)
		}
	}
}

func TestStopPassesTimeoutInWholeSeconds(t *testing.T) {
	c, dir := fakeCocoon(t, response{match: "vm stop"})
	if err := c.VMStop(context.Background(), "ID1", StopOptions{Timeout: 1500 * time.Millisecond}); err != nil {
		t.Fatal(err)
	}
	if err := c.VMStop(context.Background(), "ID2", StopOptions{Force: true}); err != nil {
		t.Fatal(err)
	}
	got := calls(t, dir)
	if !strings.HasSuffix(got[0], "vm stop --timeout 2 ID1") || !strings.HasSuffix(got[1], "vm stop --force ID2") {
		t.Fatalf("argv %q", got)
	}
}

func TestSnapshotImportStreamsStdinAndLooksUpByName(t *testing.T) {
	snapJSON := `{"id":"SNAPID00000000000000000000","name":"cri-sha256-abc","cpu":1,"memory":536870912,` +
		`"storage":10737418240,"image_type":"oci","hypervisor":"cloud-hypervisor","nics":1,"created_at":"2026-11-22T10:00:00Z"}`
	c, dir := fakeCocoon(t,
		response{match: "snapshot import", stderr: logLine + "snapshot imported: SNAPID00000000000000000000\n"},
		response{match: "snapshot inspect", stdout: snapJSON},
	)
	snap, err := c.SnapshotImport(context.Background(), strings.NewReader("archive-bytes"), "cri-sha256-abc", "")
	if err != nil {
		t.Fatal(err)
	}
	if snap.ID != "SNAPID00000000000000000000" || snap.Hypervisor != HypervisorCloudHypervisor || snap.NICs != 1 || snap.Memory != 512<<20 {
		t.Fatalf("snapshot %+v", snap)
	}
	stdin, _ := os.ReadFile(filepath.Join(dir, "stdin.log"))
	if string(stdin) != "archive-bytes" {
		t.Fatalf("stdin %q", stdin)
	}
	if got := calls(t, dir); !strings.HasSuffix(got[0], "snapshot import --name cri-sha256-abc") || !strings.HasSuffix(got[1], "snapshot inspect cri-sha256-abc") {
		t.Fatalf("argv %q", got)
	}
}

func TestSnapshotSaveAndExport(t *testing.T) {
	snapJSON := `{"id":"SNAPID00000000000000000001","name":"cri-ckpt-x","cpu":2,"memory":536870912,"hypervisor":"cloud-hypervisor"}`
	c, dir := fakeCocoon(t,
		response{match: "snapshot save", stderr: logLine + "snapshot saved: SNAPID00000000000000000001\n"},
		response{match: "snapshot inspect", stdout: snapJSON},
		response{match: "snapshot export", stdout: "tar-bytes"},
	)
	snap, err := c.SnapshotSave(context.Background(), "VMID", "cri-ckpt-x", "checkpoint of c1")
	if err != nil {
		t.Fatal(err)
	}
	if snap.ID != "SNAPID00000000000000000001" || snap.CPU != 2 {
		t.Fatalf("snapshot %+v", snap)
	}
	var out strings.Builder
	if err := c.SnapshotExport(context.Background(), "cri-ckpt-x", &out); err != nil {
		t.Fatal(err)
	}
	if strings.TrimSpace(out.String()) != "tar-bytes" {
		t.Fatalf("export wrote %q", out.String())
	}
	got := calls(t, dir)
	if !strings.HasSuffix(got[0], "snapshot save --name cri-ckpt-x --description checkpoint of c1 VMID") ||
		!strings.HasSuffix(got[2], "snapshot export -o - cri-ckpt-x") {
		t.Fatalf("argv %q", got)
	}
}

func TestVersion(t *testing.T) {
	c, _ := fakeCocoon(t, response{match: "version", stdout: "Version:        v0.3.8\nGit hash:       34c6c4a\nBuilt:          2026-04-27\nGolang version: go1.25.6\nOS/Arch:        linux/amd64\n"})
	v, err := c.Version(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	if v.Version != "v0.3.8" || v.GitHash != "34c6c4a" || v.OSArch != "linux/amd64" {
		t.Fatalf("%+v", v)
	}
}

// The end of a call's context (its timeout, or the caller giving up) stops cocoon and every process
// it started. The context ends only once the grandchild is known to run, however slow the machine.
func TestTimeoutStopsTheWholeProcessGroup(t *testing.T) {
	c, dir := fakeCocoon(t, response{match: "vm list", sleep: "30"})
	ctx, cancel := context.WithCancelCause(context.Background())
	defer cancel(nil)
	ended := make(chan error, 1)
	go func() {
		_, err := c.VMList(ctx)
		ended <- err
	}()
	var pid int
	deadline := time.Now().Add(time.Minute)
	for pid == 0 {
		data, _ := os.ReadFile(filepath.Join(dir, "child.pid"))
		pid, _ = strconv.Atoi(strings.TrimSpace(string(data)))
		if pid == 0 && time.Now().After(deadline) {
			t.Fatal("the fake cocoon never started its child")
		}
		time.Sleep(20 * time.Millisecond)
	}
	cancel(context.DeadlineExceeded)
	if err := <-ended; !errors.Is(err, context.Canceled) && !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("err = %v, want the context's end", err)
	}
	deadline = time.Now().Add(10 * time.Second)
	for syscall.Kill(pid, 0) == nil {
		if time.Now().After(deadline) {
			_ = syscall.Kill(pid, syscall.SIGKILL)
			t.Fatalf("grandchild %d survived the timeout", pid)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

func TestMissingBinary(t *testing.T) {
	c := New(Options{Binary: filepath.Join(t.TempDir(), "no-cocoon")})
	_, err := c.Version(context.Background())
	if err == nil || !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("err = %v, want a not-exist error", err)
	}
}

func TestSubcommand(t *testing.T) {
	for args, want := range map[string]string{
		"vm clone --name a snap":   "vm clone",
		"version":                  "version",
		"snapshot import --name x": "snapshot import",
		"image rm foo":             "image rm",
		"vm clone --help":          "vm clone --help",
	} {
		if got := subcommand(strings.Fields(args)); got != want {
			t.Errorf("subcommand(%q) = %q, want %q", args, got, want)
		}
	}
}

// A cocoon call is time its RPC waited, for the RPC's own cost to leave it out.
func TestCallsAreWaits(t *testing.T) {
	c, _ := fakeCocoon(t, response{match: "vm list", stdout: "[]\n", sleep: "0.1"})
	ctx, account := waittime.New(context.Background())
	if _, err := c.VMList(ctx); err != nil {
		t.Fatal(err)
	}
	if waited := account.Close(); waited < 100*time.Millisecond {
		t.Fatalf("a cocoon call of at least 100 ms: waited %v", waited)
	}
}

// What feeds cocoon's stdin arrives whole, through a pipe enlarged to take a large write at once.
func TestStdinGoesInLargeWrites(t *testing.T) {
	pr, pw, err := os.Pipe()
	if err != nil {
		t.Fatal(err)
	}
	defer pr.Close()
	data := bytes.Repeat([]byte("cocoon"), 1<<19) // 3 MiB
	done := make(chan error, 1)
	go func() {
		_, err := largeWrites{bytes.NewReader(data)}.WriteTo(pw)
		pw.Close()
		done <- err
	}()
	got, err := io.ReadAll(pr)
	if err != nil {
		t.Fatal(err)
	}
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(got, data) {
		t.Fatalf("%d bytes arrived of %d, or changed", len(got), len(data))
	}
	size, err := unix.FcntlInt(pr.Fd(), unix.F_GETPIPE_SZ, 0)
	if err != nil {
		t.Fatal(err)
	}
	if size < stdinPipeSize {
		t.Fatalf("the pipe holds %d bytes, want at least %d", size, stdinPipeSize)
	}
}

// A hibernation names its snapshot before the VM; the restore takes the VM, then the snapshot. A
// hibernation cocoon refuses (a share attached) is ErrInUse.
func TestHibernateAndRestoreArgs(t *testing.T) {
	c, dir := fakeCocoon(t, append(v05Probe(),
		response{match: "vm hibernate --name busy", stderr: `Error: snapshot VM vm2: hot-attached vhost-user-fs "data": detach before snapshot or hibernate` + "\n", code: 1},
		response{match: "vm hibernate"},
		response{match: "vm restore"},
	)...)
	if err := c.VMHibernate(context.Background(), "vm1", "nap"); err != nil {
		t.Fatal(err)
	}
	if err := c.VMRestore(context.Background(), "vm1", "nap"); err != nil {
		t.Fatal(err)
	}
	if err := c.VMHibernate(context.Background(), "vm2", "busy"); !errors.Is(err, ErrInUse) {
		t.Fatalf("a refused hibernation: %v, want ErrInUse", err)
	}
	got := calls(t, dir)
	got = slices.DeleteFunc(got, func(c string) bool { return strings.HasSuffix(c, "--help") || strings.HasSuffix(c, " version") })
	want := []string{"vm hibernate --name nap vm1", "vm restore --restore-mode copy vm1 nap", "vm hibernate --name busy vm2"}
	for i, w := range want {
		if i >= len(got) || !strings.HasSuffix(got[i], " "+w) {
			t.Fatalf("argv %q\nwant suffixes %q", got, want)
		}
	}
}
