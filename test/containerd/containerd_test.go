package containerdtest

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"

	"github.com/cocoonstack/cocoon-cri/tapmanager"
	"github.com/cocoonstack/cocoon-cri/test/testproc"
)

// TestCleanupAfterKill: a containerd killed with a pod running leaves its shim, the pod's
// processes, cgroups and mounts behind; the test's cleanup must remove them all.
func TestCleanupAfterKill(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("needs root: network namespaces, cgroups and mounts")
	}
	dir, err := os.MkdirTemp("", "ctrdtest")
	if err != nil {
		t.Fatal(err)
	}
	defer os.RemoveAll(dir)
	netns := filepath.Join(dir, "netns")
	if err := (&tapmanager.NetNS{}).CreateNetNS(netns); err != nil {
		t.Fatal(err)
	}
	defer func() { _ = (&tapmanager.NetNS{}).RemoveNetNS(netns) }()
	cniConf := filepath.Join(dir, "net.d")
	if err := os.Mkdir(cniConf, 0o755); err != nil {
		t.Fatal(err)
	}

	var (
		daemonDir string
		cgroups   []string
		shims     []int
		sockets   []string
	)
	t.Run("a pod runs, containerd is killed", func(t *testing.T) {
		daemonDir = filepath.Join(dir, "ctrd")
		d := Start(t, Options{Dir: daemonDir, NetNS: netns, CNIConfDir: cniConf})
		err := d.withCRI(time.Minute, func(ctx context.Context, rt runtimeapi.RuntimeServiceClient) error {
			pod := &runtimeapi.PodSandboxConfig{
				Metadata: &runtimeapi.PodSandboxMetadata{Name: "p", Namespace: "default", Uid: "u"},
				Linux: &runtimeapi.LinuxPodSandboxConfig{SecurityContext: &runtimeapi.LinuxSandboxSecurityContext{
					NamespaceOptions: &runtimeapi.NamespaceOption{Network: runtimeapi.NamespaceMode_NODE},
				}},
			}
			run, err := rt.RunPodSandbox(ctx, &runtimeapi.RunPodSandboxRequest{Config: pod})
			if err != nil {
				return err
			}
			ctr, err := rt.CreateContainer(ctx, &runtimeapi.CreateContainerRequest{PodSandboxId: run.PodSandboxId, SandboxConfig: pod,
				Config: &runtimeapi.ContainerConfig{
					Metadata: &runtimeapi.ContainerMetadata{Name: "c"},
					Image:    &runtimeapi.ImageSpec{Image: BusyboxImage},
					Command:  []string{"sleep", "3600"},
				}})
			if err != nil {
				return err
			}
			_, err = rt.StartContainer(ctx, &runtimeapi.StartContainerRequest{ContainerId: ctr.ContainerId})
			return err
		})
		if err != nil {
			t.Fatalf("run a pod: %v\n%s", err, d.Log())
		}
		if cgroups, err = d.containerCgroups(); err != nil || len(cgroups) == 0 {
			t.Fatalf("the pod's cgroups: %v %v", cgroups, err)
		}
		if shims = d.shimPIDs(); len(shims) == 0 {
			t.Fatal("no shim serves the pod")
		}
		if sockets = d.shimSockets(); len(sockets) == 0 {
			t.Fatal("the pod's shim has no socket")
		}
		d.Kill()
	})

	for _, cg := range cgroups {
		if _, err := os.Stat(cg); !os.IsNotExist(err) {
			t.Errorf("cgroup %s is still there: %v", cg, err)
		}
	}
	for _, pid := range shims {
		if testproc.Running(pid) {
			t.Errorf("shim %d still runs", pid)
		}
	}
	// The directory itself is shared with every containerd on the host, other test runs' among
	// them: only this daemon's sockets must go.
	for _, socket := range sockets {
		if _, err := os.Stat(socket); !os.IsNotExist(err) {
			t.Errorf("shim socket %s is left: %v", socket, err)
		}
	}
	mounts, _ := os.ReadFile("/proc/self/mountinfo")
	if strings.Contains(string(mounts), daemonDir) {
		t.Errorf("mounts are left under %s", daemonDir)
	}
	if _, err := os.Stat(daemonDir); !os.IsNotExist(err) {
		t.Errorf("%s is still there: %v", daemonDir, err)
	}
}
