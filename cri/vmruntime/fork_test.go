package vmruntime

import (
	"context"
	"strings"
	"sync"
	"testing"

	"google.golang.org/grpc/codes"
	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"

	"github.com/cocoonstack/cocoon-cri/pkg/cocoon"
	"github.com/cocoonstack/cocoon-cri/pkg/store"
)

// runPodWith runs a pod whose config change edits first.
func (n *fakeNode) runPodWith(name string, change func(*runtimeapi.PodSandboxConfig)) (string, error) {
	cfg := podConfig(name)
	change(cfg)
	resp, err := n.s.RunPodSandbox(context.Background(), &runtimeapi.RunPodSandboxRequest{Config: cfg, RuntimeHandler: HandlerName})
	return resp.GetPodSandboxId(), err
}

// forkPod runs a pod that forks from source, and creates its container of image.
func (n *fakeNode) forkPod(name, source, image string) (sandboxID, containerID string, err error) {
	n.t.Helper()
	sandboxID, err = n.runPodWith(name, func(cfg *runtimeapi.PodSandboxConfig) {
		cfg.Annotations = map[string]string{AnnotationForkFrom: source}
	})
	if err != nil {
		return "", "", err
	}
	sb := n.sandbox(sandboxID)
	resp, err := n.s.CreateContainer(context.Background(), &runtimeapi.CreateContainerRequest{
		PodSandboxId: sandboxID, Config: containerConfig("app", image), SandboxConfig: sb.Config.Msg,
	})
	return sandboxID, resp.GetContainerId(), err
}

func forkSnapshots(fc *fakeCocoon) []string { return fc.snapshotsNamed(forkSnapshotPrefix) }

func TestForkCopiesARunningPod(t *testing.T) {
	n := newFakeNode(t, Config{})
	n.cocoon.setCaps(capsV05)
	_, source := n.runningPod("source")
	src := n.container(source)
	settle(n.s)
	n.cocoon.reset()

	_, fork, err := n.forkPod("fork", "default/source", snapshotRef)
	if err != nil {
		t.Fatal(err)
	}
	n.startContainer(fork)
	c := n.container(fork)
	vm, _ := n.cocoon.vm(c.VM.ID)
	if c.State != store.ContainerRunning || c.VM.ForkOf != source || !strings.HasPrefix(c.VM.Source, forkSnapshotPrefix) || c.VM.ID == src.VM.ID ||
		vm.State != cocoon.VMStateRunning || !n.cocoon.copiedClone(c.VM.ID) {
		t.Fatalf("fork %+v, VM %+v", c, vm)
	}
	calls := n.cocoon.calls("SnapshotSave", "VMClone", "SnapshotRemove")
	wantCalls(t, "fork", calls, "SnapshotSave "+src.VM.ID+" "+c.VM.Source, "VMClone "+c.VM.Name+" "+c.VM.Source, "SnapshotRemove "+c.VM.Source)
	if srcVM, _ := n.cocoon.vm(src.VM.ID); srcVM.State != cocoon.VMStateRunning {
		t.Fatalf("the source after the fork: %+v", srcVM)
	}
	if left := forkSnapshots(n.cocoon); len(left) != 0 {
		t.Fatalf("fork saves left: %q", left)
	}
}

// Forks of one source that start together share one save, deleted after the last clone.
func TestForksStartedTogetherShareOneSave(t *testing.T) {
	n := newFakeNode(t, Config{})
	n.cocoon.setCaps(capsV05)
	_, source := n.runningPod("source")
	settle(n.s)
	var forks []string
	for _, name := range []string{"fork-a", "fork-b"} {
		_, id, err := n.forkPod(name, "default/source", snapshotRef)
		if err != nil {
			t.Fatal(err)
		}
		forks = append(forks, id)
	}
	// The save waits until both starts use it.
	n.cocoon.duringSave = func(context.Context) {
		eventually(t, "both fork starts waiting for the save", func() bool {
			n.s.forks.mu.Lock()
			defer n.s.forks.mu.Unlock()
			save := n.s.forks.inFlight[source]
			return save != nil && save.users == 2
		})
	}
	n.cocoon.reset()
	var wg sync.WaitGroup
	for _, id := range forks {
		wg.Go(func() {
			if _, err := n.s.StartContainer(context.Background(), &runtimeapi.StartContainerRequest{ContainerId: id}); err != nil {
				t.Error(err)
			}
		})
	}
	wg.Wait()
	if saves, clones, removals := len(n.cocoon.calls("SnapshotSave")), len(n.cocoon.calls("VMClone")), len(n.cocoon.calls("SnapshotRemove")); saves != 1 || clones != 2 || removals != 1 {
		t.Fatalf("%d saves, %d clones, %d removals; want 1, 2, 1", saves, clones, removals)
	}
	if a, b := n.container(forks[0]), n.container(forks[1]); a.VM.Source != b.VM.Source || a.State != store.ContainerRunning || b.State != store.ContainerRunning {
		t.Fatalf("forks %+v and %+v", a.VM, b.VM)
	}
	if left := forkSnapshots(n.cocoon); len(left) != 0 {
		t.Fatalf("fork saves left: %q", left)
	}
}

// Every refusal leaves nothing: no sandbox for a forbidden or malformed source, no container for
// a source that cannot be copied.
func TestForkRefusals(t *testing.T) {
	n := newFakeNode(t, Config{})
	n.cocoon.setCaps(capsV05)
	n.runningPod("source")
	n.importCloudImage(cloudRef)
	_, stopped := n.runningPod("stopped")
	if _, err := n.s.StopContainer(context.Background(), &runtimeapi.StopContainerRequest{ContainerId: stopped}); err != nil {
		t.Fatal(err)
	}
	for value, code := range map[string]codes.Code{
		"source":         codes.InvalidArgument,
		"default/":       codes.InvalidArgument,
		"other/source":   codes.PermissionDenied,
		"kube-system/db": codes.PermissionDenied,
	} {
		pods := len(n.st.Sandboxes.List(nil))
		_, err := n.runPodWith("bad", func(cfg *runtimeapi.PodSandboxConfig) {
			cfg.Annotations = map[string]string{AnnotationForkFrom: value}
		})
		wantCode(t, err, code)
		if len(n.st.Sandboxes.List(nil)) != pods {
			t.Fatalf("%q: a refused fork left a sandbox", value)
		}
	}
	for i, c := range []struct {
		source, image string
		code          codes.Code
		message       string
	}{
		{"default/nobody", snapshotRef, codes.FailedPrecondition, "not a VM pod on this node"},
		{"default/stopped", snapshotRef, codes.FailedPrecondition, "runs no VM"},
		{"default/source", cloudRef, codes.InvalidArgument, "runs its source's image"},
	} {
		containers := len(n.st.Containers.List(nil))
		_, _, err := n.forkPod("fork"+string(rune('a'+i)), c.source, c.image)
		wantCode(t, err, c.code)
		if !strings.Contains(err.Error(), c.message) {
			t.Fatalf("%s: %v", c.source, err)
		}
		if len(n.st.Containers.List(nil)) != containers {
			t.Fatalf("%s: a refused fork left a container", c.source)
		}
	}
}

// A hibernated source wakes for the fork's save, as for an exec: the fork copies it awake.
func TestForkWakesAHibernatedSource(t *testing.T) {
	n, obs := hibernatingNode(t)
	_, source := n.runningPod("source")
	n.idleUntilHibernated(source)
	if !n.container(source).VM.Hibernated() {
		t.Fatal("the source did not hibernate")
	}
	_, fork, err := n.forkPod("fork", "default/source", snapshotRef)
	if err != nil {
		t.Fatal(err)
	}
	n.startContainer(fork)
	src, c := n.container(source), n.container(fork)
	if src.VM.Hibernated() || obs.wakes != 1 {
		t.Fatalf("the source after the fork: %+v, wakes %d", src.VM, obs.wakes)
	}
	if c.State != store.ContainerRunning || c.VM.ForkOf != source || !n.cocoon.copiedClone(c.VM.ID) {
		t.Fatalf("fork %+v", c)
	}
	if calls := n.cocoon.calls("VMRestore", "SnapshotSave"); len(calls) != 2 || !strings.HasPrefix(calls[0], "VMRestore "+src.VM.ID) ||
		!strings.HasPrefix(calls[1], "SnapshotSave "+src.VM.ID) {
		t.Fatalf("calls %q: want the source woken, then saved", calls)
	}
}

// A save a restart cut short is deleted at the next start.
func TestRecoverRemovesForkSaves(t *testing.T) {
	n := newFakeNode(t, Config{})
	n.cocoon.putSnapshot(cocoon.SnapshotConfig{Name: forkSnapshotPrefix + "0123456789ab-cafe", Hypervisor: cocoon.HypervisorCloudHypervisor})
	n.restartAndRecover()
	if left := forkSnapshots(n.cocoon); len(left) != 0 {
		t.Fatalf("fork saves left: %q", left)
	}
}
