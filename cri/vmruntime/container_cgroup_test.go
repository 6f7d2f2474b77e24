package vmruntime

import (
	"context"
	"errors"
	"maps"
	"slices"
	"strings"
	"sync"
	"testing"

	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"

	"github.com/cocoonstack/cocoon-cri/pkg/cgroups"
	"github.com/cocoonstack/cocoon-cri/pkg/store"
)

// fakeCgroups is a cgroup driver in memory: a cgroup is a path holding the PIDs placed in it.
// Place and Remove are recorded and can be made to fail (faults).
type fakeCgroups struct {
	faults
	mu     sync.Mutex
	groups map[string][]int
}

var _ cgroups.Driver = (*fakeCgroups)(nil)

func (f *fakeCgroups) Name() string { return cgroups.Cgroupfs }

func (f *fakeCgroups) CheckParent(parent string) error {
	if parent != "" && !strings.HasPrefix(parent, "/kubepods") {
		return errors.New("cgroup parent " + parent + " is not under /kubepods")
	}
	return nil
}

func (f *fakeCgroups) Path(parent, id string) (string, error) { return parent + "/" + id, nil }

func (f *fakeCgroups) Place(parent, id string, pids []int) (string, string, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	cgroup := parent + "/" + id
	if err := f.call("Place", cgroup); err != nil {
		return cgroup, cgroup, err
	}
	if f.groups == nil {
		f.groups = map[string][]int{}
	}
	f.groups[cgroup] = pids
	return cgroup, cgroup, nil
}

func (f *fakeCgroups) Remove(_ context.Context, cgroup, _ string) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	if err := f.call("Remove", cgroup); err != nil {
		return err
	}
	delete(f.groups, cgroup)
	return nil
}

func (f *fakeCgroups) pids(cgroup string) []int {
	f.mu.Lock()
	defer f.mu.Unlock()
	return slices.Clone(f.groups[cgroup])
}

func (f *fakeCgroups) held() []string {
	f.mu.Lock()
	defer f.mu.Unlock()
	return slices.Sorted(maps.Keys(f.groups))
}

// cgroupNode is a node whose pods name a cgroup parent, as the kubelet's do, with a live process
// standing in for every hypervisor: placing one reads its process tree in /proc.
func cgroupNode(t *testing.T) (*fakeNode, *fakeCgroups, int, string) {
	t.Helper()
	driver := &fakeCgroups{}
	n := newFakeNode(t, Config{Cgroups: driver})
	pid, _ := hypervisorStandIn(t)
	n.cocoon.setPID(func() int { return pid })
	n.importSnapshot(snapshotRef, appSnapshot())
	cfg := podConfig("web")
	cfg.Linux = &runtimeapi.LinuxPodSandboxConfig{CgroupParent: "/kubepods/burstable/poduid-web"}
	resp, err := n.s.RunPodSandbox(context.Background(), &runtimeapi.RunPodSandboxRequest{Config: cfg, RuntimeHandler: HandlerName})
	if err != nil {
		t.Fatal(err)
	}
	return n, driver, pid, resp.GetPodSandboxId()
}

func TestVMJoinsThePodCgroup(t *testing.T) {
	n, driver, pid, sandboxID := cgroupNode(t)
	ctx := context.Background()
	id := n.createContainer(sandboxID, "app", snapshotRef)
	n.startContainer(id)
	want := "/kubepods/burstable/poduid-web/" + id
	c := n.container(id)
	if c.VM.Cgroup != want || c.VM.CgroupCreated != want {
		t.Fatalf("container VM %+v", c.VM)
	}
	if pids := driver.pids(want); len(pids) == 0 || pids[0] != pid {
		t.Fatalf("cgroup %s holds %v, want the hypervisor %d first", want, pids, pid)
	}
	// The cgroup goes as soon as the VM is gone, and the removal finds nothing left.
	if _, err := n.s.StopContainer(ctx, &runtimeapi.StopContainerRequest{ContainerId: id, Timeout: 5}); err != nil {
		t.Fatal(err)
	}
	if held := driver.held(); len(held) != 0 {
		t.Errorf("cgroups after the stop %q", held)
	}
	if _, err := n.s.RemoveContainer(ctx, &runtimeapi.RemoveContainerRequest{ContainerId: id}); err != nil {
		t.Fatal(err)
	}
	wantCalls(t, "cgroups", driver.calls(), "Place "+want, "Remove "+want, "Remove "+want)
}

// A VM that cannot join its pod's cgroup would escape the pod's limits: the start fails, and
// leaves neither the VM nor the cgroup.
func TestStartFailsWhenTheVMCannotJoinThePodCgroup(t *testing.T) {
	n, driver, _, sandboxID := cgroupNode(t)
	id := n.createContainer(sandboxID, "app", snapshotRef)
	driver.failOnce("Place", errors.New("write cgroup.procs: device or resource busy"))
	if _, err := n.s.StartContainer(context.Background(), &runtimeapi.StartContainerRequest{ContainerId: id}); err == nil {
		t.Fatal("the start succeeded")
	}
	c := n.container(id)
	if c.State != store.ContainerExited || c.Reason != reasonStartError || !strings.Contains(c.Message, "pod's cgroup") {
		t.Fatalf("container %+v", c)
	}
	if names := n.cocoon.vmNames(); len(names) != 0 {
		t.Errorf("VMs left %q", names)
	}
	want := "/kubepods/burstable/poduid-web/" + id
	wantCalls(t, "cgroups", driver.calls(), "Place "+want, "Remove "+want)
}
