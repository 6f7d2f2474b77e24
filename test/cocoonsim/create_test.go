package cocoonsim_test

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"testing"

	"github.com/cocoonstack/cocoon-cri/pkg/cocoon"
	"github.com/cocoonstack/cocoon-cri/test/cocoonsim"
	"github.com/cocoonstack/cocoon-cri/test/cocoonsim/guest"
	"github.com/cocoonstack/cocoon-cri/test/testimage"
	"github.com/cocoonstack/cocoon-cri/test/testproc"
)

// seedImage puts an OCI image into the installation the way image import would, without
// mkfs.erofs.
func (s *sim) seedImage(name string, spec guest.Spec) string {
	s.t.Helper()
	var layer bytes.Buffer
	if err := testimage.WriteOCILayer(&layer, testimage.LayerOptions{Guest: spec}); err != nil {
		s.t.Fatal(err)
	}
	id, err := cocoonsim.SeedOCIImage(context.Background(), s.root, name, &layer)
	if err != nil {
		s.t.Fatal(err)
	}
	return id
}

func TestCreateValidatesNameAndResources(t *testing.T) {
	s := newSim(t)
	s.seedImage("img", guest.Spec{})
	host := runtime.NumCPU()
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"--name", "a b"}, `vm name "a b" is invalid: must match ^[a-zA-Z0-9][a-zA-Z0-9._-]{0,62}$ (max 63 chars)`},
		{[]string{"--cpu", "0"}, "--cpu must be at least 1, got 0"},
		{[]string{"--memory", "511M"}, "--memory must be at least 512M, got 535822336"},
		{[]string{"--storage", "9G"}, "--storage must be at least 10G, got 9663676416"},
		{[]string{"--memory", "lots"}, `invalid --memory "lots": invalid size: 'lots'`},
		{[]string{"--cpu", fmt.Sprint(host + 1)}, fmt.Sprintf("create VM: requested %d vCPUs exceeds host cores (%d)", host+1, host)},
		{[]string{"--bridge", "br0", "--network", "n"}, "--bridge and --network are mutually exclusive"},
		{[]string{"--fc", "--windows"}, "--fc and --windows are mutually exclusive: Firecracker does not support Windows guests"},
		{[]string{"--nics", "1"}, "configure network: network provider not configured: no conflist found in " + s.ci},
	} {
		args := append([]string{"vm", "create", "--nics", "0"}, tc.args...)
		s.fails(tc.want, append(args, "img")...)
	}
	if got := s.listVMs(); len(got) != 0 {
		t.Fatalf("failed creates left records: %+v", got)
	}
}

func TestCreateStartRunOCI(t *testing.T) {
	if _, err := exec.LookPath("mkfs.ext4"); err != nil {
		t.Skip("mkfs.ext4 not installed: cocoon formats the COW disk with it")
	}
	s := newSim(t)
	imageID := s.seedImage("registry.local/team/app:v1", guest.Spec{})

	created := decode[cocoon.VM](t, s.ok("vm", "create", "--nics", "0", "--cpu", "1", "--memory", "512M", "-o", "json", "registry.local/team/app:v1"))
	if created.State != cocoon.VMStateCreated || created.Config.Name != "cocoon-team-app-v1" || created.Config.ImageDigest != imageID || created.Config.ImageType != cocoon.ImageTypeOCI {
		t.Fatalf("create -o json: %+v", created)
	}
	cow := filepath.Join(s.run, "cloudhypervisor", created.ID, "cow.raw")
	if fi, err := os.Stat(cow); err != nil || fi.Size() != 10<<30 {
		t.Fatalf("cow.raw: %v %v", fi, err)
	}
	s.ok("vm", "start", created.ID)
	started := s.inspect(created.ID)
	if started.State != cocoon.VMStateRunning || !testproc.Running(started.PID) || !started.FirstBooted {
		t.Fatalf("after start: %+v", started)
	}

	run := decode[cocoon.VM](t, s.ok("vm", "run", "--nics", "0", "--name", "runner", "--cpu", "1", "-o", "json", "registry.local/team/app:v1"))
	if run.State != cocoon.VMStateRunning || !testproc.Running(run.PID) || run.SocketPath == "" {
		t.Fatalf("run -o json: %+v", run)
	}
	both := decode[cocoon.BatchResult](t, s.ok("vm", "stop", "-o", "json", created.ID, "runner"))
	if len(both.Succeeded) != 2 {
		t.Fatalf("stop both: %+v", both)
	}
	// Stopping a VM that is not running succeeds and marks it stopped, even one never started.
	fresh := decode[cocoon.VM](t, s.ok("vm", "create", "--nics", "0", "--name", "fresh", "--cpu", "1", "-o", "json", "registry.local/team/app:v1"))
	s.ok("vm", "stop", "fresh")
	if got := s.inspect(fresh.ID); got.State != cocoon.VMStateStopped {
		t.Fatalf("stop of a created VM: %s", got.State)
	}
}

func TestFailedStartLeavesErrorRecordAndNoBatchJSON(t *testing.T) {
	if _, err := exec.LookPath("mkfs.ext4"); err != nil {
		t.Skip("mkfs.ext4 not installed: cocoon formats the COW disk with it")
	}
	s := newSim(t)
	s.seedImage("good", guest.Spec{})
	s.seedImage("broken", guest.Spec{FailBoot: true})
	r := s.cocoon("vm", "run", "--nics", "0", "--name", "b1", "--cpu", "1", "broken")
	if r.code != 1 || !strings.Contains(r.errorLine(), "launch VM: cloud-hypervisor exited before socket was ready") {
		t.Fatalf("run of a failing guest: exit %d, %q", r.code, r.errorLine())
	}
	if got := s.inspect("b1"); got.State != cocoon.VMStateError {
		t.Fatalf("failed start must leave state error, got %s", got.State)
	}
	s.ok("vm", "create", "--nics", "0", "--name", "g1", "--cpu", "1", "good")
	r = s.cocoon("vm", "start", "-o", "json", "g1", "b1")
	if r.code != 1 || r.stdout != "" {
		t.Fatalf("partial start: exit %d, stdout %q", r.code, r.stdout)
	}
	if got := s.inspect("g1"); got.State != cocoon.VMStateRunning {
		t.Fatalf("the good VM of a partial batch still starts, got %s", got.State)
	}
	s.ok("vm", "rm", "--force", "g1", "b1")
}

func TestCloudImageCreateNeedsFirmwareAndQemuImg(t *testing.T) {
	s := newSim(t)
	qcow := filepath.Join(filepath.Dir(s.root), "disk.qcow2")
	writeQCOW2(t, qcow, 1<<30, guest.Spec{})
	s.ok("image", "import", "cloud", qcow)
	firmware := filepath.Join(s.root, "firmware", "CLOUDHV.fd")
	s.fails(`image "cloud" not resolved: oci: image "cloud" not found for VM cocoon-cloud; cloudimg: firmware not found: `+firmware,
		"vm", "create", "--nics", "0", "cloud")
	if err := os.MkdirAll(filepath.Dir(firmware), 0o750); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(firmware, []byte("fw"), 0o600); err != nil {
		t.Fatal(err)
	}
	// Without qemu-img on PATH, create fails the way cocoon does.
	r := s.cocoonIn(withoutTools(t), nil, "vm", "create", "--nics", "0", "--cpu", "1", "cloud")
	if r.errorLine() != `Error: create VM: qemu-img create overlay: : exec: "qemu-img": executable file not found in $PATH` {
		t.Fatalf("create without qemu-img: %q", r.errorLine())
	}
	t.Run("with qemu-img", func(t *testing.T) {
		requireTool(t, "qemu-img")
		s := s.in(t)
		vm := decode[cocoon.VM](t, s.ok("vm", "run", "--nics", "0", "--cpu", "1", "-o", "json", "cloud"))
		if vm.State != cocoon.VMStateRunning || !testproc.Running(vm.PID) {
			t.Fatalf("cloud image run: %+v", vm)
		}
	})
}

// requireTool skips a success path that needs a host tool cocoon shells out to.
func requireTool(t *testing.T, tool string) {
	t.Helper()
	if _, err := exec.LookPath(tool); err != nil {
		t.Skipf("%s not installed: only the failure path was tested", tool)
	}
}

// withoutTools is an environment whose PATH has no external tools, to test how commands fail
// when qemu-img, mkfs.erofs or mkfs.ext4 are missing even on hosts that have them.
func withoutTools(t *testing.T) []string {
	t.Helper()
	return []string{"PATH=" + t.TempDir()}
}

// writeQCOW2 writes a cloud image whose guests behave as spec says.
func writeQCOW2(t *testing.T, path string, size int64, spec guest.Spec) {
	t.Helper()
	f, err := os.Create(path)
	if err != nil {
		t.Fatal(err)
	}
	if err := testimage.WriteQCOW2WithGuest(f, size, spec); err != nil {
		t.Fatal(err)
	}
	if err := f.Close(); err != nil {
		t.Fatal(err)
	}
}

// importCloudImage imports a 1 GiB cloud image whose guests behave as spec says, and puts the
// placeholder UEFI firmware that cloud image VMs need in place.
func (s *sim) importCloudImage(name string, spec guest.Spec) {
	s.t.Helper()
	qcow := filepath.Join(s.t.TempDir(), "disk.qcow2")
	writeQCOW2(s.t, qcow, 1<<30, spec)
	s.ok("image", "import", name, qcow)
	firmware := filepath.Join(s.root, "firmware", "CLOUDHV.fd")
	if err := os.MkdirAll(filepath.Dir(firmware), 0o750); err != nil {
		s.t.Fatal(err)
	}
	if err := os.WriteFile(firmware, []byte("fw"), 0o600); err != nil {
		s.t.Fatal(err)
	}
}
