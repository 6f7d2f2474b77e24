package e2e

import (
	"bufio"
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"google.golang.org/protobuf/encoding/protojson"
	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"

	"github.com/cocoonstack/cocoon-cri/pkg/checkpoint"
	"github.com/cocoonstack/cocoon-cri/pkg/faultpoint"
	"github.com/cocoonstack/cocoon-cri/test/dirtree"
	"github.com/cocoonstack/cocoon-cri/test/registry"
)

// TestCheckpointCarriesTheGuestToANewPod checkpoints a running VM pod with crictl, imports the
// archive, and runs a new pod of it: the new pod has the old guest's memory at the checkpoint,
// nothing written after it, and an identity of its own.
func TestCheckpointCarriesTheGuestToANewPod(t *testing.T) {
	t.Parallel()
	n := newNode(t)
	n.withSnapshot()
	srcPod, src, _ := n.runningPod("src", snapRef)
	n.mustCrictl("exec", src, "sh", "-c", "echo kept > /dev/shm/state")

	archive := filepath.Join(n.Dir, "src-checkpoint.tar")
	n.mustCrictl("checkpoint", "--export="+archive, src)
	if info, err := os.Stat(archive); err != nil || info.Mode().Perm() != 0o600 {
		t.Fatalf("archive: %v, %v", info, err)
	}
	// The source runs on: it was paused only for the save.
	if state := field(n.inspect("inspect", src), "status", "state"); state != "CONTAINER_RUNNING" {
		t.Fatalf("source container is %v after the checkpoint", state)
	}
	n.mustCrictl("exec", src, "sh", "-c", "echo later > /dev/shm/later")
	// A second checkpoint to the same file is refused and leaves the first.
	n.crictlFails("AlreadyExists", "checkpoint", "--export="+archive, src)

	n.ImportImage("e2e/checkpoint:v1", archive)
	dstPod, dst, _ := n.runningPod("dst", "e2e/checkpoint:v1")
	if out := n.mustCrictl("exec", dst, "sh", "-c", "cat /dev/shm/state; ls /dev/shm; hostname"); out != "kept\nstate\ndst" {
		t.Fatalf("restored guest: %q, want its memory at the checkpoint and its own hostname", out)
	}
	if srcIP, dstIP := n.podIP(srcPod), n.podIP(dstPod); srcIP == "" || srcIP == dstIP {
		t.Fatalf("pod IPs %q and %q: a restored pod has its own", srcIP, dstIP)
	}
	if snaps, _ := n.cocoon("snapshot", "list", "-o", "json"); strings.Contains(snaps, "cri-ckpt-") {
		t.Fatalf("a checkpoint's snapshot is left in cocoon: %s", snaps)
	}

	// Pushed to a registry, the checkpoint runs on another node, which pulls it as any image.
	n2 := newNode(t)
	n2.withSnapshot() // the node has the checkpoint's base image, as the fleet's nodes do
	reg := n2.registry(registry.Options{})
	ref := reg.Host + "/e2e/checkpoint:v1"
	push := exec.Command("nsenter", "--net="+n2.NodeNS, "--", bins.CocoonCRI, "image", "push", archive, ref)
	if out, err := push.CombinedOutput(); err != nil {
		t.Fatalf("image push: %v: %s", err, out)
	}
	n2.pull(ref)
	_, moved, _ := n2.runningPod("moved", ref)
	if out := n2.mustCrictl("exec", moved, "sh", "-c", "cat /dev/shm/state; hostname"); out != "kept\nmoved" {
		t.Fatalf("the checkpoint pulled on another node: %q", out)
	}

	// cocoon-cri killed between the save and the export: once it is back, the VM runs and nothing
	// of the checkpoint is left.
	n.Stop()
	n.Env = []string{faultpoint.EnvVar + "=cocoon snapshot export/before"}
	n.Start()
	crashDir := filepath.Join(n.Dir, "crash")
	if err := os.Mkdir(crashDir, 0o700); err != nil {
		t.Fatal(err)
	}
	if out, err := n.crictl("checkpoint", "--export="+filepath.Join(crashDir, "src.tar"), src); err == nil || !n.Died(10*time.Second) {
		t.Fatalf("checkpoint with a crash in it: %v %s; the daemon must have died at the export", err, out)
	}
	n.Env = nil
	n.Start()
	if out := n.mustCrictl("exec", src, "cat", "/dev/shm/state"); out != "kept" {
		t.Fatalf("source guest after the crash: %q", out)
	}
	if entries, _ := os.ReadDir(crashDir); len(entries) != 0 {
		t.Fatalf("an interrupted checkpoint left %v", entries)
	}
	if snaps, _ := n.cocoon("snapshot", "list", "-o", "json"); strings.Contains(snaps, "cri-ckpt-") {
		t.Fatalf("an interrupted checkpoint's snapshot is left in cocoon: %s", snaps)
	}
}

// TestRestorePodThroughTheCRI checkpoints a pod and restores it as a new pod through a CRI client,
// as the kubelet's pod-level checkpoint does: the restored container is CREATED until started.
func TestRestorePodThroughTheCRI(t *testing.T) {
	t.Parallel()
	n := newNode(t)
	n.withSnapshot()
	srcPod, src, _ := n.runningPod("src", snapRef)
	n.mustCrictl("exec", src, "sh", "-c", "echo kept > /dev/shm/state")
	rt, _ := n.clients()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()

	dir := filepath.Join(n.Dir, "pod-checkpoint")
	if err := os.Mkdir(dir, 0o700); err != nil {
		t.Fatal(err)
	}
	if _, err := rt.CheckpointPod(ctx, &runtimeapi.CheckpointPodRequest{PodSandboxId: srcPod, OutputPath: dir, ContainerIds: []string{src}}); err != nil {
		t.Fatal(err)
	}
	// cocoon v0.5 exports the container into a snapshot directory, which the restore clones in
	// place, as crictl info says.
	if format := field(n.inspect("info"), "info", "stateMobility", "podCheckpoint"); format != "snapshotDirectory" {
		t.Errorf("crictl info's stateMobility.podCheckpoint on cocoon v0.5: %v", format)
	}
	if _, err := os.Stat(filepath.Join(dir, src, "snapshot.json")); err != nil {
		t.Fatalf("the pod checkpoint holds no snapshot directory of the container: %v", err)
	}
	checkpointed := dirtree.Describe(t, dir)
	resp, err := rt.RestorePod(ctx, &runtimeapi.RestorePodRequest{
		CheckpointPath: dir, Config: n.podConfig("restored", "uid-restored"), RuntimeHandler: "cocoon",
		ContainerConfigs: []*runtimeapi.ContainerConfig{containerConfig("app", snapRef)},
	})
	if err != nil {
		t.Fatal(err)
	}
	if len(resp.GetRestoredContainers()) != 1 || resp.GetRestoredContainers()[0].GetName() != "app" {
		t.Fatalf("restored %v", resp.GetRestoredContainers())
	}
	ctr := resp.GetRestoredContainers()[0].GetContainerId()
	if state := field(n.inspect("inspect", ctr), "status", "state"); state != "CONTAINER_CREATED" {
		t.Fatalf("restored container is %v before its start", state)
	}
	n.mustCrictl("start", ctr)
	if out := n.mustCrictl("exec", ctr, "sh", "-c", "cat /dev/shm/state; hostname"); out != "kept\nrestored" {
		t.Fatalf("restored guest: %q", out)
	}
	if image := field(n.inspect("inspect", ctr), "status", "image", "image"); !strings.HasPrefix(fmt.Sprint(image), "cocoon-cri.local/checkpoint:") {
		t.Errorf("the restored container's image: %v", image)
	}
	if after := dirtree.Describe(t, dir); after != checkpointed {
		t.Errorf("the restore changed the checkpoint:\n%s\nwas:\n%s", after, checkpointed)
	}

	// The container's directory travels as an image too: pushed, pulled and run as a pod's image.
	reg := n.registry(registry.Options{})
	ref := reg.Host + "/e2e/pod-checkpoint:v1"
	push := exec.Command("nsenter", "--net="+n.NodeNS, "--", bins.CocoonCRI, "image", "push", filepath.Join(dir, src), ref)
	if out, err := push.CombinedOutput(); err != nil || !strings.Contains(string(out), "checkpoint of container app of pod") {
		t.Fatalf("image push of the container's directory: %v: %s", err, out)
	}
	n.pull(ref)
	_, pulled, _ := n.runningPod("pulled", ref)
	if out := n.mustCrictl("exec", pulled, "sh", "-c", "cat /dev/shm/state; hostname"); out != "kept\npulled" {
		t.Fatalf("the pushed directory's guest: %q", out)
	}
	// And through an import, as the archive cocoon would export of it: the pod checkpoint of one
	// container is that container's.
	n.ImportImage("e2e/pod-checkpoint-imported:v1", dir)
	_, imported, _ := n.runningPod("imported", "e2e/pod-checkpoint-imported:v1")
	if out := n.mustCrictl("exec", imported, "sh", "-c", "cat /dev/shm/state; hostname"); out != "kept\nimported" {
		t.Fatalf("the imported directory's guest: %q", out)
	}
	if after := dirtree.Describe(t, dir); after != checkpointed {
		t.Errorf("the push and the import changed the checkpoint:\n%s\nwas:\n%s", after, checkpointed)
	}

	// The same from the command line: cocoon-cri pod checkpoint and pod restore.
	cliDir := filepath.Join(n.Dir, "cli-checkpoint")
	if out, err := exec.Command(bins.CocoonCRI, "pod", "checkpoint", "--socket", n.Socket, "default/src", cliDir).CombinedOutput(); err != nil || string(out) != cliDir+"\n" {
		t.Fatalf("pod checkpoint: %v: %s", err, out)
	}
	podFile := filepath.Join(n.Dir, "cli-restored.json")
	if data, err := protojson.Marshal(n.podConfig("cli-restored", "uid-cli-restored")); err != nil || os.WriteFile(podFile, data, 0o600) != nil {
		t.Fatalf("pod config: %v", err)
	}
	out, err := exec.Command(bins.CocoonCRI, "pod", "restore", "--socket", n.Socket, "--start", cliDir, podFile).Output()
	lines := strings.Fields(string(out))
	if err != nil || len(lines) != 3 || lines[1] != "app" {
		t.Fatalf("pod restore: %v: %q", err, out)
	}
	if got := n.mustCrictl("exec", lines[2], "sh", "-c", "cat /dev/shm/state; hostname"); got != "kept\ncli-restored" {
		t.Fatalf("the guest restored from the command line: %q", got)
	}
	// Configured by its name alone, the container logs where the kubelet would have put its log.
	if logPath := field(n.inspect("inspect", lines[2]), "status", "logPath"); logPath != filepath.Join(n.PodLogs, "default_cli-restored_uid-cli-restored", "app", "0.log") {
		t.Errorf("the restored container's log path: %v", logPath)
	}

	// A checkpoint whose containers the request does not name is refused and leaves no pod.
	pods := n.mustCrictl("pods", "-q")
	_, err = rt.RestorePod(ctx, &runtimeapi.RestorePodRequest{
		CheckpointPath: dir, Config: n.podConfig("wrong", "uid-wrong"), RuntimeHandler: "cocoon",
		ContainerConfigs: []*runtimeapi.ContainerConfig{containerConfig("web", snapRef)},
	})
	if err == nil || !strings.Contains(err.Error(), "not in the checkpoint") {
		t.Fatalf("restore of unknown containers: %v", err)
	}
	if after := n.mustCrictl("pods", "-q"); after != pods {
		t.Fatalf("a refused restore left a pod: %q, was %q", after, pods)
	}
}

// readCheckpointMetadata reads the metadata of a checkpoint archive.
func readCheckpointMetadata(t *testing.T, path string) *checkpoint.Metadata {
	t.Helper()
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	md, err := checkpoint.Read(bufio.NewReader(f))
	if err != nil || md == nil {
		t.Fatalf("%s is not a checkpoint archive: %v", path, err)
	}
	return md
}

// TestCheckpointOnCocoon038: cocoon v0.3.8 saves and exports snapshots as v0.5 does, so a VM pod
// on it is checkpointed, and a pod of the checkpoint runs. (v0.3.8 has no vm exec: the guest's
// memory is checked on v0.5 only.)
func TestCheckpointOnCocoon038(t *testing.T) {
	t.Parallel()
	n := oldCocoonNode(t)
	// The node says up front what its cocoon allows: archives for a pod checkpoint, no hibernation.
	if mobility := field(n.inspect("info"), "info", "stateMobility"); fmt.Sprint(mobility) != "map[hibernate:false hibernateUnavailable:cocoon v0.3.8 has no vm hibernate (v0.5 and later have) podCheckpoint:archive]" {
		t.Errorf("crictl info's stateMobility on cocoon v0.3.8: %v", mobility)
	}
	_, src, _ := n.runningPod("old", snapRef)
	archive := filepath.Join(n.Dir, "old-checkpoint.tar")
	n.mustCrictl("checkpoint", "--export="+archive, src)
	if md := readCheckpointMetadata(t, archive); md.CocoonVersion != "v0.3.8" || md.Container.Name != "app" {
		t.Fatalf("checkpoint metadata %+v", md)
	}
	n.ImportImage("e2e/old-checkpoint:v1", archive)
	_, restored, _ := n.runningPod("old-restored", "e2e/old-checkpoint:v1")
	if state := field(n.inspect("inspect", restored), "status", "state"); state != "CONTAINER_RUNNING" {
		t.Fatalf("a pod of the checkpoint is %v", state)
	}
}
