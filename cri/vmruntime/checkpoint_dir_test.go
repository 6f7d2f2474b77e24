package vmruntime

import (
	"context"
	"encoding/json"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/cocoonstack/cocoon-cri/cri/grpcerr"

	"google.golang.org/grpc/codes"
	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"

	"github.com/cocoonstack/cocoon-cri/pkg/checkpoint"
	"github.com/cocoonstack/cocoon-cri/pkg/cocoon"
	"github.com/cocoonstack/cocoon-cri/pkg/store"
	"github.com/cocoonstack/cocoon-cri/test/dirtree"
)

// dirCheckpointNode is a node on a cocoon that writes and clones snapshot directories, with a
// running pod "web" of a snapshot taken under hypervisor checkpointed into a pod checkpoint
// directory.
func dirCheckpointNode(t *testing.T, hypervisor string) (n *fakeNode, sandboxID, containerID, out string) {
	t.Helper()
	n = newFakeNode(t, Config{CheckpointJournal: filepath.Join(t.TempDir(), "checkpoints")})
	n.cocoon.setCaps(capsV05)
	snap := appSnapshot()
	if hypervisor == cocoon.HypervisorFirecracker {
		// Firecracker boots OCI VM images only.
		snap.Hypervisor, snap.ImageType = hypervisor, cocoon.ImageTypeOCI
	}
	n.importSnapshot(snapshotRef, snap)
	sandboxID, containerID = n.runningPod("web")
	out = t.TempDir()
	if _, err := n.s.CheckpointPod(context.Background(), &runtimeapi.CheckpointPodRequest{PodSandboxId: sandboxID, OutputPath: out, ContainerIds: []string{containerID}}); err != nil {
		t.Fatal(err)
	}
	return n, sandboxID, containerID, out
}

// TestPodCheckpointOfSnapshotDirectories: where cocoon exports snapshots into directories and
// clones them in place, a pod checkpoint holds each container as cocoon's snapshot directory
// (root's alone) with its metadata in pod.json, and a restore records the directory as the
// container's image, with no import into cocoon: StartContainer clones it with --from-dir. The
// checkpoint is only read, by every restore of it, and removing the restored pods and the image
// leaves it as it was. Both hypervisors.
func TestPodCheckpointOfSnapshotDirectories(t *testing.T) {
	for _, hypervisor := range []string{cocoon.HypervisorCloudHypervisor, cocoon.HypervisorFirecracker} {
		t.Run(hypervisor, func(t *testing.T) { testPodCheckpointOfSnapshotDirectories(t, hypervisor) })
	}
}

func testPodCheckpointOfSnapshotDirectories(t *testing.T, hypervisor string) {
	n, sandboxID, containerID, out := dirCheckpointNode(t, hypervisor)
	ctx := context.Background()
	saved := n.container(containerID)
	if c := n.container(containerID); c.State != store.ContainerRunning {
		t.Fatalf("container is %s after the checkpoint", c.State)
	}
	entries, _ := os.ReadDir(out)
	if names := dirNames(entries); !slices.Equal(names, []string{containerID, checkpoint.PodFile}) {
		t.Fatalf("the checkpoint holds %q", names)
	}
	member := filepath.Join(out, containerID)
	if info, err := os.Stat(member); err != nil || info.Mode().Perm() != 0o700 {
		t.Fatalf("the container's snapshot directory: %v, %v; want mode 0700, it holds the guest's memory", info, err)
	}
	if _, err := os.Stat(filepath.Join(member, "snapshot.json")); err != nil {
		t.Fatalf("no snapshot.json in the container's directory: %v", err)
	}
	var pc checkpoint.PodCheckpoint
	data, err := os.ReadFile(filepath.Join(out, checkpoint.PodFile))
	if err == nil {
		err = json.Unmarshal(data, &pc)
	}
	if err != nil || len(pc.Containers) != 1 || pc.Containers[0].Snapshot != containerID || pc.Containers[0].Archive != "" ||
		pc.Containers[0].Metadata == nil || pc.Containers[0].Metadata.Container.ID != containerID || pc.Containers[0].Metadata.CPU != saved.VM.CPU {
		t.Fatalf("pod.json %+v, %v", pc, err)
	}
	if calls := n.cocoon.calls("SnapshotExport", "SnapshotExportToDir"); len(calls) != 1 || !strings.HasPrefix(calls[0], "SnapshotExportToDir ") {
		t.Fatalf("exports %q, want one into a directory", calls)
	}
	image, _ := n.s.images.Get(snapshotRef)
	if snaps := n.cocoon.snapshotNames(); !slices.Equal(snaps, []string{image.LocalName}) {
		t.Fatalf("snapshots after the checkpoint %q: the checkpoint's own must be gone", snaps)
	}
	before := dirtree.Describe(t, out)

	restore := func(name string) string {
		t.Helper()
		resp, err := n.s.RestorePod(ctx, &runtimeapi.RestorePodRequest{
			CheckpointPath: out, Config: podConfig(name), RuntimeHandler: HandlerName,
			ContainerConfigs: []*runtimeapi.ContainerConfig{containerConfig("app", snapshotRef)},
		})
		if err != nil {
			t.Fatal(err)
		}
		if resp.GetPodSandboxId() == sandboxID || len(resp.GetRestoredContainers()) != 1 {
			t.Fatalf("RestorePod answered %v", resp)
		}
		return resp.GetRestoredContainers()[0].GetContainerId()
	}
	imports := len(n.cocoon.calls("SnapshotImport"))
	restored := restore("web-restored")
	c := n.container(restored)
	img, err := n.s.images.Get(c.ImageRef)
	if c.State != store.ContainerCreated || err != nil || !img.FromDir || img.LocalName != member || img.Kind != store.ImageSnapshot ||
		img.Snapshot.CPU != saved.VM.CPU || img.Snapshot.Memory != saved.VM.Memory || !c.VM.FromDir || c.VM.Source != member || c.VM.OnDemand {
		t.Fatalf("restored container %+v, image %+v, %v", c, img, err)
	}
	// The directory is the checkpoint's, not the image filesystem's: the kubelet's image GC counts
	// nothing for it, and the verbose status says what it takes.
	status, err := n.s.ImageStatus(ctx, &runtimeapi.ImageStatusRequest{Image: &runtimeapi.ImageSpec{Image: c.ImageRef}, Verbose: true})
	if err != nil {
		t.Fatal(err)
	}
	var info imageInfo
	if err := json.Unmarshal([]byte(status.GetInfo()["info"]), &info); err != nil || status.GetImage().GetSize() != 0 || img.Size <= 0 || info.DirBytes != img.Size || !info.FromDir {
		t.Fatalf("image status %v, info %+v (%v); the directory takes %d bytes", status, info, err, img.Size)
	}
	if listed := n.s.listImages(&runtimeapi.ImageFilter{Image: &runtimeapi.ImageSpec{Image: c.ImageRef}}); len(listed) != 1 || listed[0].GetSize() != 0 {
		t.Fatalf("ListImages %v", listed)
	}
	n.startContainer(restored)
	c = n.container(restored)
	vm, ok := n.cocoon.vm(c.VM.ID)
	if c.State != store.ContainerRunning || !ok || vm.Config.Image != "cocoon.local/base:v1" || vm.Hypervisor != hypervisor {
		t.Fatalf("restored container %+v, VM %+v", c, vm)
	}
	if clones := n.cocoon.calls("VMClone"); clones[len(clones)-1] != "VMClone "+c.VM.Name+" "+member {
		t.Fatalf("clones %q, want the last from the checkpoint's directory", clones)
	}

	again := restore("web-restored-again")
	if n.container(again).ImageID != c.ImageID {
		t.Errorf("a second restore of the checkpoint made another image: %s, %s", n.container(again).ImageID, c.ImageID)
	}
	if after := len(n.cocoon.calls("SnapshotImport")); after != imports {
		t.Errorf("restores imported %d snapshots into cocoon", after-imports)
	}

	for _, id := range []string{restored, again} {
		if _, err := n.s.RemoveContainer(ctx, &runtimeapi.RemoveContainerRequest{ContainerId: id}); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := n.s.RemoveImage(ctx, &runtimeapi.RemoveImageRequest{Image: &runtimeapi.ImageSpec{Image: c.ImageID}}); err != nil {
		t.Fatal(err)
	}
	if _, err := n.st.Images.Get(c.ImageID); err == nil {
		t.Error("the removed checkpoint image's record stayed")
	}
	if after := dirtree.Describe(t, out); after != before {
		t.Fatalf("the checkpoint changed:\n%s\nwas:\n%s", after, before)
	}
}

func dirNames(entries []os.DirEntry) []string {
	var names []string
	for _, e := range entries {
		names = append(names, e.Name())
	}
	return names
}

// TestPodCheckpointOfSnapshotDirectoriesRefusals: a restore refuses what it cannot clone or what is
// not a snapshot directory, before any sandbox or cocoon call, and changes nothing.
func TestPodCheckpointOfSnapshotDirectoriesRefusals(t *testing.T) {
	n, _, containerID, out := dirCheckpointNode(t, cocoon.HypervisorCloudHypervisor)
	ctx := context.Background()
	writePod := func(members string) string {
		dir := t.TempDir()
		if err := os.CopyFS(dir, os.DirFS(out)); err != nil {
			t.Fatal(err)
		}
		if members != "" {
			if err := os.WriteFile(filepath.Join(dir, checkpoint.PodFile), []byte(`{"version":1,"containers":`+members+`}`), 0o600); err != nil {
				t.Fatal(err)
			}
		}
		return dir
	}
	var pc checkpoint.PodCheckpoint
	data, _ := os.ReadFile(filepath.Join(out, checkpoint.PodFile))
	if err := json.Unmarshal(data, &pc); err != nil {
		t.Fatal(err)
	}
	meta, _ := json.Marshal(pc.Containers[0].Metadata)
	noEnvelope := writePod("")
	if err := os.Remove(filepath.Join(noEnvelope, containerID, "snapshot.json")); err != nil {
		t.Fatal(err)
	}
	otherHypervisor := writePod("")
	envelope := cocoon.SnapshotExport{Version: cocoon.SnapshotExportVersion, Config: cocoon.SnapshotConfig{Hypervisor: cocoon.HypervisorFirecracker}}
	if data, err := json.Marshal(envelope); err != nil || os.WriteFile(filepath.Join(otherHypervisor, containerID, "snapshot.json"), data, 0o600) != nil {
		t.Fatal(err)
	}
	cases := []struct {
		name string
		dir  string
		code codes.Code
	}{
		{"no snapshot.json", noEnvelope, codes.InvalidArgument},
		{"another hypervisor than its metadata", otherHypervisor, codes.InvalidArgument},
		{"archive and directory", writePod(`[{"name":"app","archive":"a.tar","snapshot":"` + containerID + `","metadata":` + string(meta) + `}]`), codes.InvalidArgument},
		{"no metadata", writePod(`[{"name":"app","snapshot":"` + containerID + `"}]`), codes.InvalidArgument},
		{"directory outside", writePod(`[{"name":"app","snapshot":"..","metadata":` + string(meta) + `}]`), codes.InvalidArgument},
		{"not a directory", writePod(`[{"name":"app","snapshot":"` + checkpoint.PodFile + `","metadata":` + string(meta) + `}]`), codes.InvalidArgument},
	}
	sandboxes := len(n.st.Sandboxes.List(nil))
	held := n.net.held()
	calls := len(n.cocoon.calls())
	for _, tc := range cases {
		before := dirtree.Describe(t, tc.dir)
		_, err := n.s.RestorePod(ctx, &runtimeapi.RestorePodRequest{
			CheckpointPath: tc.dir, Config: podConfig("refused"), RuntimeHandler: HandlerName,
			ContainerConfigs: []*runtimeapi.ContainerConfig{containerConfig("app", snapshotRef)},
		})
		if code := grpcerr.Code(err); code != tc.code {
			t.Errorf("%s: %v, want %s", tc.name, err, tc.code)
		}
		if after := dirtree.Describe(t, tc.dir); after != before {
			t.Errorf("%s: the checkpoint changed", tc.name)
		}
	}
	if got := n.cocoon.calls()[calls:]; len(got) != 0 {
		t.Errorf("refused restores called cocoon: %q", got)
	}

	// A checkpoint removed between the restore and the start: the start says so.
	gone := writePod("")
	resp, err := n.s.RestorePod(ctx, &runtimeapi.RestorePodRequest{
		CheckpointPath: gone, Config: podConfig("gone"), RuntimeHandler: HandlerName,
		ContainerConfigs: []*runtimeapi.ContainerConfig{containerConfig("app", snapshotRef)},
	})
	if err != nil {
		t.Fatal(err)
	}
	if err := os.RemoveAll(gone); err != nil {
		t.Fatal(err)
	}
	clones := len(n.cocoon.calls("VMClone"))
	_, err = n.s.StartContainer(ctx, &runtimeapi.StartContainerRequest{ContainerId: resp.GetRestoredContainers()[0].GetContainerId()})
	if grpcerr.Code(err) != codes.FailedPrecondition || !strings.Contains(err.Error(), "is gone") || len(n.cocoon.calls("VMClone")) != clones {
		t.Errorf("a start whose checkpoint is gone: %v, want FailedPrecondition before any clone", err)
	}
	if _, err := n.s.StopPodSandbox(ctx, &runtimeapi.StopPodSandboxRequest{PodSandboxId: resp.GetPodSandboxId()}); err != nil {
		t.Fatal(err)
	}
	if _, err := n.s.RemovePodSandbox(ctx, &runtimeapi.RemovePodSandboxRequest{PodSandboxId: resp.GetPodSandboxId()}); err != nil {
		t.Fatal(err)
	}

	// A cocoon without --from-dir cannot clone the directories: refused before a sandbox is made.
	n.cocoon.setCaps(capsV038)
	_, err = n.s.RestorePod(ctx, &runtimeapi.RestorePodRequest{
		CheckpointPath: out, Config: podConfig("old-cocoon"), RuntimeHandler: HandlerName,
		ContainerConfigs: []*runtimeapi.ContainerConfig{containerConfig("app", snapshotRef)},
	})
	if grpcerr.Code(err) != codes.FailedPrecondition || !strings.Contains(err.Error(), "--from-dir") {
		t.Errorf("a restore on a cocoon that cannot clone a directory: %v, want FailedPrecondition", err)
	}
	if after := len(n.st.Sandboxes.List(nil)); after != sandboxes {
		t.Errorf("%d sandboxes after the refusals, %d before", after, sandboxes)
	}
	if after := n.net.held(); !slices.Equal(after, held) {
		t.Errorf("refusals left %q on the network (before: %q)", after, held)
	}
}

// TestPodCheckpointOfSnapshotDirectoriesFailure: an export that fails after cocoon wrote part of
// the directory leaves nothing in the checkpoint directory and no snapshot in cocoon, and the VM
// runs on.
func TestPodCheckpointOfSnapshotDirectoriesFailure(t *testing.T) {
	n := newFakeNode(t, Config{CheckpointJournal: filepath.Join(t.TempDir(), "checkpoints")})
	n.cocoon.setCaps(capsV05)
	sandboxID, containerID := n.runningPod("web")
	snapshots := n.cocoon.snapshotNames()
	n.cocoon.failOnce("SnapshotExportToDir", cocoonErr(cocoon.ErrNoSpace, "export-to-dir: copy memory-ranges: no space left on device", "snapshot", "export"))
	out := t.TempDir()
	_, err := n.s.CheckpointPod(context.Background(), &runtimeapi.CheckpointPodRequest{PodSandboxId: sandboxID, OutputPath: out, ContainerIds: []string{containerID}})
	wantCode(t, err, codes.ResourceExhausted)
	if entries, _ := os.ReadDir(out); len(entries) != 0 {
		t.Errorf("a failed pod checkpoint left %q", dirNames(entries))
	}
	if left := n.cocoon.snapshotNames(); !slices.Equal(left, snapshots) {
		t.Errorf("snapshots %q after the failure, %q before", left, snapshots)
	}
	if notes, _ := os.ReadDir(n.s.cfg.CheckpointJournal); len(notes) != 0 {
		t.Errorf("journal notes left: %v", notes)
	}
	if c := n.container(containerID); c.State != store.ContainerRunning {
		t.Errorf("the container is %s after a failed checkpoint", c.State)
	}
}

// TestRestartRemovesWhatAPodCheckpointLeft: a pod checkpoint is noted in the journal, with every
// entry it writes into its output directory, from before its first write until its pod.json: a
// crash after a container's entry was renamed into place, before pod.json, leaves nothing in the
// caller's directory once cocoon-cri is back.
func TestRestartRemovesWhatAPodCheckpointLeft(t *testing.T) {
	n := newFakeNode(t, Config{CheckpointJournal: filepath.Join(t.TempDir(), "checkpoints")})
	n.cocoon.setCaps(capsV05)
	sandboxID, containerID := n.runningPod("web")
	out := t.TempDir()
	var during []journalEntry
	n.cocoon.duringSave = func(context.Context) {
		notes, _ := os.ReadDir(n.s.cfg.CheckpointJournal)
		for _, note := range notes {
			if !strings.HasPrefix(note.Name(), podCheckpointNotePrefix) {
				continue
			}
			var e journalEntry
			data, _ := os.ReadFile(filepath.Join(n.s.cfg.CheckpointJournal, note.Name()))
			if json.Unmarshal(data, &e) == nil {
				during = append(during, e)
			}
		}
	}
	if _, err := n.s.CheckpointPod(context.Background(), &runtimeapi.CheckpointPodRequest{PodSandboxId: sandboxID, OutputPath: out, ContainerIds: []string{containerID}}); err != nil {
		t.Fatal(err)
	}
	n.cocoon.duringSave = nil
	if len(during) != 1 || !slices.Contains(during[0].Outputs, filepath.Join(out, checkpoint.PodFile)) || !slices.Contains(during[0].Outputs, filepath.Join(out, containerID)) {
		t.Fatalf("the pod checkpoint's notes during the save: %+v", during)
	}
	if notes, _ := os.ReadDir(n.s.cfg.CheckpointJournal); len(notes) != 0 {
		t.Fatalf("notes left after the checkpoint: %v", dirNames(notes))
	}

	// What a crash before pod.json leaves: the note, and the container's directory in place.
	crashed := t.TempDir()
	if _, err := n.s.notePodCheckpoint(sandboxID, []string{filepath.Join(crashed, checkpoint.PodFile), filepath.Join(crashed, containerID)}); err != nil {
		t.Fatal(err)
	}
	if err := os.CopyFS(filepath.Join(crashed, containerID), os.DirFS(filepath.Join(out, containerID))); err != nil {
		t.Fatal(err)
	}
	n.cocoon.reset()
	n.s.removeCutShortCheckpoints(context.Background())
	if entries, _ := os.ReadDir(crashed); len(entries) != 0 {
		t.Errorf("after the restart the output directory holds %q", dirNames(entries))
	}
	if notes, _ := os.ReadDir(n.s.cfg.CheckpointJournal); len(notes) != 0 {
		t.Errorf("notes left: %v", dirNames(notes))
	}
	if calls := n.cocoon.calls("SnapshotRemove"); len(calls) != 0 {
		t.Errorf("a pod checkpoint's note names no snapshot, yet: %q", calls)
	}
	if entries, _ := os.ReadDir(out); len(entries) != 2 {
		t.Errorf("the finished checkpoint lost entries: %q", dirNames(entries))
	}
}
