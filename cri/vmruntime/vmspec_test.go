package vmruntime

import (
	"regexp"
	"strings"
	"testing"

	"github.com/cocoonstack/cocoon-cri/cri/grpcerr"

	"google.golang.org/grpc/codes"
	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"

	"github.com/cocoonstack/cocoon-cri/pkg/cocoon"
	"github.com/cocoonstack/cocoon-cri/pkg/store"
)

func testServer() *Runtime {
	return New(Config{HostCPUs: 4, DefaultVCPUs: 1, DefaultMemory: 1 << 30, DefaultStorage: 10 << 30}, nil, nil, CocoonClient(cocoon.New(cocoon.Options{})), nil, nil)
}

func podSandbox(annotations map[string]string) *store.Sandbox {
	opts, err := parseVMOptions(annotations)
	if err != nil {
		panic(err)
	}
	return &store.Sandbox{
		ID: "sb", VM: opts,
		Config: store.Proto[*runtimeapi.PodSandboxConfig]{Msg: &runtimeapi.PodSandboxConfig{
			Metadata: &runtimeapi.PodSandboxMetadata{Name: "web", Namespace: "default", Uid: "u"},
		}},
	}
}

func container(res *runtimeapi.LinuxContainerResources) *runtimeapi.ContainerConfig {
	return &runtimeapi.ContainerConfig{
		Metadata: &runtimeapi.ContainerMetadata{Name: "app"},
		Image:    &runtimeapi.ImageSpec{Image: "img"},
		Linux:    &runtimeapi.LinuxContainerConfig{Resources: res},
	}
}

var (
	cloudImage = &store.Image{ID: "sha256:c", Kind: store.ImageCloud, LocalName: "cri-sha256-c"}
	chSnapshot = &store.Image{ID: "sha256:s", Kind: store.ImageSnapshot, LocalName: "cri-sha256-s",
		Snapshot: &store.SnapshotInfo{CPU: 2, Memory: 2 << 30, Storage: 20 << 30, Hypervisor: cocoon.HypervisorCloudHypervisor}}
	fcSnapshot = &store.Image{ID: "sha256:f", Kind: store.ImageSnapshot, LocalName: "cri-sha256-f",
		Snapshot: &store.SnapshotInfo{CPU: 1, Memory: 1 << 30, Storage: 10 << 30, NICs: 1, Hypervisor: cocoon.HypervisorFirecracker}}
	fcSnapshotNoNIC = &store.Image{ID: "sha256:n", Kind: store.ImageSnapshot, LocalName: "cri-sha256-n",
		Snapshot: &store.SnapshotInfo{CPU: 1, Memory: 1 << 30, Storage: 10 << 30, Hypervisor: cocoon.HypervisorFirecracker}}
	ociImage = &store.Image{ID: "sha256:o", Kind: store.ImageOCI}
)

const id64 = "0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef"

func TestBootSizeComesFromLimits(t *testing.T) {
	s := testServer()
	cases := []struct {
		name     string
		res      *runtimeapi.LinuxContainerResources
		cpu      int
		memory   int64
		annotate map[string]string
		storage  int64
	}{
		{"defaults", nil, 1, 1 << 30, nil, 10 << 30},
		{"limit 1500m, 3Gi", &runtimeapi.LinuxContainerResources{CpuQuota: 150000, CpuPeriod: 100000, MemoryLimitInBytes: 3 << 30}, 2, 3 << 30, nil, 10 << 30},
		{"request 2 CPUs without limit", &runtimeapi.LinuxContainerResources{CpuShares: 2048}, 2, 1 << 30, nil, 10 << 30},
		{"best effort shares", &runtimeapi.LinuxContainerResources{CpuShares: 2}, 1, 1 << 30, nil, 10 << 30},
		{"capped at host cores", &runtimeapi.LinuxContainerResources{CpuQuota: 1600000, CpuPeriod: 100000}, 4, 1 << 30, nil, 10 << 30},
		{"memory raised to cocoon minimum", &runtimeapi.LinuxContainerResources{MemoryLimitInBytes: 100 << 20}, 1, 512 << 20, nil, 10 << 30},
		{"memory rounded to MiB", &runtimeapi.LinuxContainerResources{MemoryLimitInBytes: 1<<30 + 1}, 1, 1<<30 + 1<<20, nil, 10 << 30},
		{"storage annotation", nil, 1, 1 << 30, map[string]string{AnnotationStorage: "20Gi"}, 20 << 30},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			vm, err := s.planVM(id64, container(tc.res), podSandbox(tc.annotate), cloudImage, true)
			if err != nil {
				t.Fatal(err)
			}
			if vm.Mode != store.VMBoot || vm.CPU != tc.cpu || vm.Memory != tc.memory || vm.Storage != tc.storage {
				t.Fatalf("got mode=%s cpu=%d memory=%d storage=%d", vm.Mode, vm.CPU, vm.Memory, vm.Storage)
			}
			if vm.Backend != cocoon.HypervisorCloudHypervisor || vm.Source != "cri-sha256-c" || vm.OnDemand {
				t.Fatalf("got %+v", vm)
			}
		})
	}
}

// A clone never shrinks below its snapshot: fewer CPUs than it has only throttle it, so it keeps its
// vCPUs; a memory limit below its memory would get it OOM-killed, so that is refused, as is a
// snapshot disk above --max-storage.
func TestCloneNeverShrinksBelowTheSnapshot(t *testing.T) {
	s := testServer()
	fewCPUs := &runtimeapi.LinuxContainerResources{CpuQuota: 100000, CpuPeriod: 100000, MemoryLimitInBytes: 2 << 30}
	vm, err := s.planVM(id64, container(fewCPUs), podSandbox(nil), chSnapshot, true)
	if err != nil {
		t.Fatal(err)
	}
	if vm.Mode != store.VMClone || vm.CPU != 2 || vm.Memory != 2<<30 || vm.Storage != 20<<30 || !vm.OnDemand {
		t.Fatalf("got %+v", vm)
	}
	for _, resizes := range []bool{true, false} {
		small := &runtimeapi.LinuxContainerResources{MemoryLimitInBytes: 1 << 30}
		_, err = s.planVM(id64, container(small), podSandbox(nil), chSnapshot, resizes)
		if grpcerr.Code(err) != codes.InvalidArgument || !strings.Contains(err.Error(), "raise the limit to at least 2Gi") {
			t.Fatalf("a memory limit below the snapshot's memory (resize %v): %v", resizes, err)
		}
	}
	capped := testServer()
	capped.cfg.MaxStorage = 15 << 30
	if _, err = capped.planVM(id64, container(nil), podSandbox(nil), chSnapshot, true); grpcerr.Code(err) != codes.InvalidArgument || !strings.Contains(err.Error(), "--max-storage") {
		t.Fatalf("a snapshot disk above --max-storage: %v", err)
	}
	big := &runtimeapi.LinuxContainerResources{CpuQuota: 300000, CpuPeriod: 100000, MemoryLimitInBytes: 4 << 30}
	vm, err = s.planVM(id64, container(big), podSandbox(map[string]string{AnnotationStorage: "30Gi"}), chSnapshot, true)
	if err != nil {
		t.Fatal(err)
	}
	if vm.CPU != 3 || vm.Memory != 4<<30 || vm.Storage != 30<<30 {
		t.Fatalf("got %+v", vm)
	}
}

// On a cocoon whose clone cannot resize (v0.5), a clone runs at its snapshot's size whatever the
// limits, and a storage annotation beyond the snapshot's disk is refused.
func TestCloneWithoutResizeRunsAtTheSnapshotSize(t *testing.T) {
	s := testServer()
	big := &runtimeapi.LinuxContainerResources{CpuQuota: 300000, CpuPeriod: 100000, MemoryLimitInBytes: 4 << 30}
	vm, err := s.planVM(id64, container(big), podSandbox(nil), chSnapshot, false)
	if err != nil {
		t.Fatal(err)
	}
	if vm.CPU != 2 || vm.Memory != 2<<30 || vm.Storage != 20<<30 || !vm.OnDemand {
		t.Fatalf("got %+v, want the snapshot's 2 vCPUs, 2 GiB, 20 GiB", vm)
	}
	_, err = s.planVM(id64, container(big), podSandbox(map[string]string{AnnotationStorage: "30Gi"}), chSnapshot, false)
	if grpcerr.Code(err) != codes.InvalidArgument || !strings.Contains(err.Error(), "cannot resize a clone") {
		t.Fatalf("a storage annotation beyond the snapshot: %v", err)
	}
}

func TestPlanRefusesWhatCocoonCannotDo(t *testing.T) {
	s := testServer()
	cases := []struct {
		name     string
		annotate map[string]string
		img      *store.Image
		want     string
	}{
		{"firecracker snapshot without a NIC", nil, fcSnapshotNoNIC, "Firecracker cannot add one to a clone"},
		{"backend other than the snapshot's", map[string]string{AnnotationBackend: "cloud-hypervisor"}, fcSnapshot, "a clone runs under its snapshot's hypervisor"},
		{"firecracker with a cloud image", map[string]string{AnnotationBackend: "firecracker"}, cloudImage, "Firecracker boots OCI VM images only"},
		{"unknown snapshot hypervisor", nil, &store.Image{ID: "sha256:q", Kind: store.ImageSnapshot, Snapshot: &store.SnapshotInfo{Hypervisor: "qemu"}}, "a hypervisor cocoon-cri does not know"},
		{"windows OCI image", map[string]string{AnnotationOS: "windows"}, ociImage, "Windows guests need a cloud image"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			_, err := s.planVM(id64, container(nil), podSandbox(tc.annotate), tc.img, true)
			if grpcerr.Code(err) != codes.InvalidArgument || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("err = %v, want InvalidArgument saying %q", err, tc.want)
			}
		})
	}
}

func TestParseVMOptions(t *testing.T) {
	opts, err := parseVMOptions(map[string]string{
		AnnotationBackend: "cloud-hypervisor", AnnotationNoDirectIO: "true", AnnotationStorage: "25Gi",
		AnnotationOS: "windows", AnnotationNetwork: "cocoon-dhcp", "unrelated": "x",
	})
	if err != nil {
		t.Fatal(err)
	}
	want := store.VMOptions{Backend: "cloud-hypervisor", NoDirectIO: true, Storage: 25 << 30, Windows: true, Network: "cocoon-dhcp"}
	if opts != want {
		t.Fatalf("got %+v, want %+v", opts, want)
	}
	for name, bad := range map[string]map[string]string{
		"backend":       {AnnotationBackend: "qemu"},
		"no-direct-io":  {AnnotationNoDirectIO: "yes"},
		"storage":       {AnnotationStorage: "lots"},
		"storage min":   {AnnotationStorage: "5Gi"},
		"os":            {AnnotationOS: "plan9"},
		"network empty": {AnnotationNetwork: " "},
	} {
		if _, err := parseVMOptions(bad); err == nil {
			t.Errorf("%s: %v accepted", name, bad)
		}
	}
	if opts, err := parseVMOptions(map[string]string{AnnotationBackend: "firecracker"}); err != nil || opts.Backend != "firecracker" {
		t.Errorf("the firecracker backend: %+v, %v", opts, err)
	}
}

// A Firecracker clone has its snapshot's size and NIC in every release: nothing to resize, no
// --nics, and the snapshot's memory file is not needed once cloned. A VM image boots under the
// annotation's hypervisor, and stops gracefully there without the exec path.
func TestFirecrackerPlans(t *testing.T) {
	s := testServer()
	big := &runtimeapi.LinuxContainerResources{CpuQuota: 200000, CpuPeriod: 100000, MemoryLimitInBytes: 4 << 30}
	vm, err := s.planVM(id64, container(big), podSandbox(nil), fcSnapshot, true)
	if err != nil {
		t.Fatal(err)
	}
	if vm.Backend != cocoon.HypervisorFirecracker || vm.CPU != 1 || vm.Memory != 1<<30 || vm.NICs != 0 || vm.OnDemand || cocoon.StopsAtOnce(vm.Backend, vm.DirectBoot) {
		t.Fatalf("clone plan %+v: want the snapshot's size under firecracker, no --nics, not on demand, a graceful stop", vm)
	}
	vm, err = s.planVM(id64, container(big), podSandbox(map[string]string{AnnotationBackend: "firecracker"}), ociImage, false)
	if err != nil {
		t.Fatal(err)
	}
	if vm.Backend != cocoon.HypervisorFirecracker || vm.Mode != store.VMBoot || vm.CPU != 2 || vm.Memory != 4<<30 || !vm.DirectBoot || cocoon.StopsAtOnce(vm.Backend, vm.DirectBoot) {
		t.Fatalf("boot plan %+v", vm)
	}
	vm, err = s.planVM(id64, container(nil), podSandbox(nil), ociImage, false)
	if err != nil || vm.Backend != cocoon.HypervisorCloudHypervisor || !cocoon.StopsAtOnce(vm.Backend, vm.DirectBoot) {
		t.Fatalf("a direct boot without the annotation: %+v, %v: want cloud-hypervisor, stopped at once by cocoon", vm, err)
	}
}

func TestVMNames(t *testing.T) {
	name := vmName(id64, "web", "app")
	if name != "cri-0123456789ab-web-app" {
		t.Fatalf("name %q", name)
	}
	long := vmName(id64, strings.Repeat("very-long-pod-name", 10), "c")
	if len(long) > 63 || !strings.HasPrefix(long, "cri-0123456789ab-") {
		t.Fatalf("long name %q (%d)", long, len(long))
	}
	odd := vmName(id64, "my pod/ü", "x_y")
	if odd != "cri-0123456789ab-my-pod-x_y" {
		t.Fatalf("odd name %q", odd)
	}
	for _, n := range []string{name, long, odd} {
		if !vmNamePattern.MatchString(n) {
			t.Fatalf("%q breaks cocoon's name rule", n)
		}
	}
}

// vmNamePattern is cocoon's rule for VM names.
var vmNamePattern = regexp.MustCompile(`^[a-zA-Z0-9][a-zA-Z0-9._-]{0,62}$`)

// TestPlanKnowsDirectBoot: VMs that boot their kernel directly (OCI VM images and snapshots of
// them) are marked, since cocoon stops them without a power button; UEFI guests are not.
func TestPlanKnowsDirectBoot(t *testing.T) {
	s := testServer()
	cloudSnapshot := &store.Image{ID: "sha256:u", Kind: store.ImageSnapshot, LocalName: "cri-sha256-u",
		Snapshot: &store.SnapshotInfo{CPU: 1, Memory: 1 << 30, Storage: 10 << 30, Hypervisor: cocoon.HypervisorCloudHypervisor, ImageType: cocoon.ImageTypeCloudImg}}
	for _, tc := range []struct {
		img  *store.Image
		want bool
	}{
		{chSnapshot, true},
		{cloudSnapshot, false},
		{cloudImage, false},
		{&store.Image{ID: "sha256:o", Kind: store.ImageOCI, LocalName: "cri-sha256-o"}, true},
	} {
		vm, err := s.planVM(id64, container(nil), podSandbox(nil), tc.img, true)
		if err != nil {
			t.Fatal(err)
		}
		if vm.DirectBoot != tc.want {
			t.Errorf("image %s (%s): DirectBoot %v, want %v", tc.img.ID, tc.img.Kind, vm.DirectBoot, tc.want)
		}
	}
}
