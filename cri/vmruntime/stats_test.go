package vmruntime

import (
	"context"
	"errors"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	"testing"

	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"

	"github.com/cocoonstack/cocoon-cri/imagestore"
	"github.com/cocoonstack/cocoon-cri/pkg/cocoon"
	"github.com/cocoonstack/cocoon-cri/pkg/store"
	"github.com/cocoonstack/cocoon-cri/pkg/store/storetest"
	"github.com/cocoonstack/cocoon-cri/pkg/vmstats"
	"github.com/cocoonstack/cocoon-cri/tapmanager"
)

// statsServer is a server over a fresh store, enough for the stats RPCs (which never call cocoon).
func statsServer(t testing.TB) (*Runtime, string) {
	t.Helper()
	dir := t.TempDir()
	st := storetest.Open(t)
	runDir := filepath.Join(dir, "run")
	cc := cocoon.New(cocoon.Options{Binary: "/nonexistent/cocoon"})
	images, err := imagestore.New(st, cc, slog.New(slog.DiscardHandler), imagestore.Dirs{Root: dir, Run: runDir}, imagestore.PullOptions{CredentialsDir: filepath.Join(dir, "pull-credentials")})
	if err != nil {
		t.Fatal(err)
	}
	nets := tapmanager.NewManager(tapmanager.Config{StateDir: filepath.Join(dir, "network")})
	return New(Config{}, slog.New(slog.DiscardHandler), st, CocoonClient(cc), nets, images), runDir
}

// hypervisorStandIn is a live process to read, as a hypervisor would be read.
func hypervisorStandIn(t *testing.T) (pid int, start uint64) {
	t.Helper()
	cmd := exec.Command("sleep", "600")
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = cmd.Process.Kill(); _ = cmd.Wait() })
	start, err := vmstats.StartTicks(procRoot, cmd.Process.Pid)
	if err != nil {
		t.Fatal(err)
	}
	return cmd.Process.Pid, start
}

func addSandbox(t *testing.T, s *Runtime, id string, state store.SandboxState) {
	t.Helper()
	cfg := &runtimeapi.PodSandboxConfig{
		Metadata: &runtimeapi.PodSandboxMetadata{Name: id, Namespace: "ns", Uid: id},
		Labels:   map[string]string{"pod": id},
	}
	if err := s.store.Sandboxes.Create(&store.Sandbox{ID: id, Name: id, State: state, Config: store.Proto[*runtimeapi.PodSandboxConfig]{Msg: cfg}}); err != nil {
		t.Fatal(err)
	}
}

func addContainer(t *testing.T, s *Runtime, c *store.Container) {
	t.Helper()
	c.Name = c.ID
	c.Config = store.Proto[*runtimeapi.ContainerConfig]{Msg: &runtimeapi.ContainerConfig{
		Metadata: &runtimeapi.ContainerMetadata{Name: c.ID},
		Labels:   map[string]string{"name": c.ID},
	}}
	if err := s.store.Containers.Create(c); err != nil {
		t.Fatal(err)
	}
}

func TestStatsFromTheHypervisorProcess(t *testing.T) {
	s, runDir := statsServer(t)
	pid, start := hypervisorStandIn(t)
	cow := filepath.Join(runDir, "cloudhypervisor", "vm1", "cow.raw")
	if err := os.MkdirAll(filepath.Dir(cow), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(cow, make([]byte, 64<<10), 0o644); err != nil {
		t.Fatal(err)
	}
	addSandbox(t, s, "pod1", store.SandboxReady)
	addSandbox(t, s, "pod2", store.SandboxNotReady)
	startedAt := s.now() - 1e9
	// running: a live hypervisor and its writable disk, as recorded at start.
	addContainer(t, s, &store.Container{ID: "running", SandboxID: "pod1", State: store.ContainerRunning, StartedAt: startedAt,
		VM: store.VM{ID: "vm1", PID: pid, PIDStart: start, COWPath: cow}})
	// reused: the recorded PID now names another process.
	addContainer(t, s, &store.Container{ID: "reused", SandboxID: "pod1", State: store.ContainerRunning, StartedAt: startedAt,
		VM: store.VM{ID: "vm2", PID: pid, PIDStart: start + 1}})
	// gone: running by its record, no process.
	addContainer(t, s, &store.Container{ID: "gone", SandboxID: "pod2", State: store.ContainerRunning, StartedAt: startedAt,
		VM: store.VM{ID: "vm3", PID: 1 << 30}})
	addContainer(t, s, &store.Container{ID: "created", SandboxID: "pod2", State: store.ContainerCreated})

	ctx := context.Background()
	list, err := s.ListContainerStats(ctx, &runtimeapi.ListContainerStatsRequest{})
	if err != nil {
		t.Fatal(err)
	}
	byID := map[string]*runtimeapi.ContainerStats{}
	for _, st := range list.GetStats() {
		byID[st.GetAttributes().GetId()] = st
		if st.GetCpu().GetTimestamp() == 0 || st.GetMemory().GetTimestamp() == 0 || st.GetWritableLayer().GetFsId().GetMountpoint() != runDir {
			t.Errorf("%s: %v", st.GetAttributes().GetId(), st)
		}
	}
	if len(byID) != 4 {
		t.Fatalf("listed %d containers, want 4", len(byID))
	}
	run := byID["running"]
	if run.GetMemory().GetWorkingSetBytes().GetValue() == 0 || run.GetMemory().GetRssBytes().GetValue() > run.GetMemory().GetUsageBytes().GetValue() {
		t.Fatalf("running: memory %v", run.GetMemory())
	}
	// The running VM's CPU was sampled (the first sample's rate is the average since the VM
	// started); the others, with no live hypervisor, were not.
	if n := s.stats.cpuRate.Len(); n != 1 {
		t.Fatalf("%d CPU samples kept, want 1 (running's): CPU %v", n, run.GetCpu())
	}
	// Only the running VM's hypervisor files stay open for the next sample: not those of the
	// process that reused a PID.
	if n := s.stats.samplers.Len(); n != 1 {
		t.Fatalf("%d containers' /proc files kept open, want 1 (running's)", n)
	}
	if used := run.GetWritableLayer().GetUsedBytes().GetValue(); used < 64<<10 || run.GetWritableLayer().GetInodesUsed().GetValue() != 1 {
		t.Fatalf("running: writable layer %v", run.GetWritableLayer())
	}
	for _, id := range []string{"reused", "gone", "created"} {
		st := byID[id]
		if st.GetCpu().GetUsageCoreNanoSeconds().GetValue() != 0 || st.GetMemory().GetWorkingSetBytes().GetValue() != 0 {
			t.Errorf("%s: usage %v %v, want zero", id, st.GetCpu(), st.GetMemory())
		}
	}

	// Filters: ID prefix, sandbox, labels.
	for _, c := range []struct {
		f    *runtimeapi.ContainerStatsFilter
		want int
	}{
		{&runtimeapi.ContainerStatsFilter{Id: "run"}, 1},
		{&runtimeapi.ContainerStatsFilter{PodSandboxId: "pod2"}, 2},
		{&runtimeapi.ContainerStatsFilter{LabelSelector: map[string]string{"name": "gone"}}, 1},
		{&runtimeapi.ContainerStatsFilter{PodSandboxId: "pod1", LabelSelector: map[string]string{"name": "gone"}}, 0},
	} {
		got, err := s.ListContainerStats(ctx, &runtimeapi.ListContainerStatsRequest{Filter: c.f})
		if err != nil || len(got.GetStats()) != c.want {
			t.Errorf("filter %v: %d stats, %v; want %d", c.f, len(got.GetStats()), err, c.want)
		}
	}
	one, err := s.ContainerStats(ctx, &runtimeapi.ContainerStatsRequest{ContainerId: "runn"})
	if err != nil || one.GetStats().GetAttributes().GetId() != "running" {
		t.Fatalf("ContainerStats by prefix: %v, %v", one, err)
	}
	// The edge maps the error to NotFound.
	if _, err := s.ContainerStats(ctx, &runtimeapi.ContainerStatsRequest{ContainerId: "nope"}); !errors.Is(err, store.ErrNotFound) {
		t.Fatalf("ContainerStats of an unknown container: %v", err)
	}

	// Pods: only ready ones are listed; a pod's usage is its running VM's.
	pods, err := s.ListPodSandboxStats(ctx, &runtimeapi.ListPodSandboxStatsRequest{})
	if err != nil || len(pods.GetStats()) != 1 {
		t.Fatalf("ListPodSandboxStats: %v, %v", pods, err)
	}
	p := pods.GetStats()[0]
	if p.GetAttributes().GetId() != "pod1" || len(p.GetLinux().GetContainers()) != 2 ||
		p.GetLinux().GetMemory().GetWorkingSetBytes().GetValue() == 0 || p.GetLinux().GetProcess().GetProcessCount().GetValue() != 1 {
		t.Fatalf("pod1 stats: %v", p)
	}
	if got, err := s.ListPodSandboxStats(ctx, &runtimeapi.ListPodSandboxStatsRequest{Filter: &runtimeapi.PodSandboxStatsFilter{LabelSelector: map[string]string{"pod": "other"}}}); err != nil || len(got.GetStats()) != 0 {
		t.Fatalf("pod label filter: %v, %v", got, err)
	}
	// A stopped pod answers by ID, with zero usage.
	p2, err := s.PodSandboxStats(ctx, &runtimeapi.PodSandboxStatsRequest{PodSandboxId: "pod2"})
	if err != nil || p2.GetStats().GetLinux().GetCpu().GetUsageCoreNanoSeconds().GetValue() != 0 || p2.GetStats().GetLinux().GetNetwork() != nil {
		t.Fatalf("pod2 stats: %v, %v", p2, err)
	}

	// Samples of removed containers are dropped.
	if err := s.store.Containers.Delete("running"); err != nil {
		t.Fatal(err)
	}
	if _, err := s.ListContainerStats(ctx, &runtimeapi.ListContainerStatsRequest{}); err != nil {
		t.Fatal(err)
	}
	if n := s.stats.cpuRate.Len(); n != 0 {
		t.Fatalf("%d CPU samples kept after the containers went", n)
	}
	if n := s.stats.samplers.Len(); n != 0 {
		t.Fatalf("%d containers' /proc files kept open after the containers went", n)
	}
}
