package vmruntime

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"io"
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
)

// checkpointServer is a server over a fresh store with one ready pod "pod1" whose container "c1"
// runs VM "vm1" in the in-process cocoon, which saves and exports snapshots as cocoon does.
func checkpointServer(t *testing.T) (*Runtime, *fakeCocoon) {
	t.Helper()
	n := newFakeNode(t, Config{CheckpointJournal: filepath.Join(t.TempDir(), "checkpoints")})
	s := n.s
	addSandbox(t, s, "pod1", store.SandboxReady)
	n.cocoon.addVM(cocoon.VM{ID: "vm1", Hypervisor: cocoon.HypervisorCloudHypervisor, State: cocoon.VMStateRunning, PID: fakeDeadPIDs,
		Config: cocoon.VMConfig{Name: "cri-c1", Config: cocoon.Config{CPU: 2, Memory: 512 << 20, Storage: 10 << 30, Image: "cocoon.local/base:v1"}}})
	addContainer(t, s, &store.Container{ID: "c1", SandboxID: "pod1", State: store.ContainerRunning, ImageRef: "sha256:abc", VM: store.VM{ID: "vm1"}})
	return s, n.cocoon
}

// snapshotCalls are the snapshot commands the cocoon ran.
func snapshotCalls(fc *fakeCocoon) []string {
	return fc.calls("SnapshotSave", "SnapshotExport", "SnapshotRemove", "SnapshotImport")
}

func TestCheckpointContainerWritesOneArchive(t *testing.T) {
	s, fc := checkpointServer(t)
	location := filepath.Join(t.TempDir(), "c1.tar")
	if _, err := s.CheckpointContainer(context.Background(), &runtimeapi.CheckpointContainerRequest{ContainerId: "c1", Location: location}); err != nil {
		t.Fatal(err)
	}
	info, err := os.Stat(location)
	if err != nil {
		t.Fatal(err)
	}
	if info.Mode().Perm() != 0o600 {
		t.Errorf("archive mode %v, want 0600: it holds the guest's memory", info.Mode().Perm())
	}
	f, err := os.Open(location)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	br := bufio.NewReader(f)
	md, err := checkpoint.Read(br)
	if err != nil || md == nil {
		t.Fatalf("metadata %v, %v", md, err)
	}
	if md.Pod.Name != "pod1" || md.Pod.Namespace != "ns" || md.Container.Name != "c1" || md.Container.ImageRef != "sha256:abc" ||
		md.Hypervisor != cocoon.HypervisorCloudHypervisor || md.BaseImage != "cocoon.local/base:v1" || md.CPU != 2 || md.MemoryBytes != 512<<20 {
		t.Errorf("metadata %+v", md)
	}
	calls := snapshotCalls(fc)
	if len(calls) != 3 || !strings.HasPrefix(calls[0], "SnapshotSave vm1 "+checkpointSnapshotPrefix+"c1-") {
		t.Fatalf("cocoon calls %q", calls)
	}
	name := strings.Fields(calls[0])[2]
	if calls[1] != "SnapshotExport "+name || calls[2] != "SnapshotRemove "+name {
		t.Errorf("cocoon calls %q: the snapshot saved must be exported and deleted", calls)
	}
	rest, _ := io.ReadAll(br)
	if export := fc.exported(name); len(export) == 0 || !bytes.Equal(rest, export) {
		t.Error("the archive does not hold cocoon's export byte for byte after the metadata")
	}
	if left := fc.snapshotNames(); len(left) != 0 {
		t.Errorf("snapshots left in cocoon: %q", left)
	}
	c, _ := s.store.Containers.Get("c1")
	if c.State != store.ContainerRunning {
		t.Errorf("container is %s after a checkpoint", c.State)
	}
	if entries, _ := os.ReadDir(filepath.Dir(location)); len(entries) != 1 {
		t.Errorf("the checkpoint left %v beside its archive", entries)
	}
	if notes, _ := os.ReadDir(s.cfg.CheckpointJournal); len(notes) != 0 {
		t.Errorf("a finished checkpoint left journal notes %v", notes)
	}
}

// TestRestartRemovesWhatACheckpointLeft plays a crash in the middle of a checkpoint: its journal
// note, its temporary archive (or the directory a pod checkpoint's container was being exported
// into) and its snapshot are there at the next start, which removes them.
func TestRestartRemovesWhatACheckpointLeft(t *testing.T) {
	s, fc := checkpointServer(t)
	fc.putSnapshot(cocoon.SnapshotConfig{Name: checkpointSnapshotPrefix + "c1-0000", Hypervisor: cocoon.HypervisorCloudHypervisor})
	fc.putSnapshot(cocoon.SnapshotConfig{Name: checkpointSnapshotPrefix + "c1-0001", Hypervisor: cocoon.HypervisorCloudHypervisor})
	dir := t.TempDir()
	partial := filepath.Join(dir, ".c1.tar."+checkpointSnapshotPrefix+"c1-0000.partial")
	if _, err := s.noteCheckpoint(checkpointSnapshotPrefix+"c1-0000", partial); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(partial, []byte("half an archive"), 0o600); err != nil {
		t.Fatal(err)
	}
	partialDir := filepath.Join(dir, ".c1."+checkpointSnapshotPrefix+"c1-0001.partial")
	if _, err := s.noteCheckpoint(checkpointSnapshotPrefix+"c1-0001", partialDir); err != nil {
		t.Fatal(err)
	}
	if err := os.Mkdir(partialDir, 0o700); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(partialDir, "memory-ranges"), []byte("half the memory"), 0o600); err != nil {
		t.Fatal(err)
	}
	keep := filepath.Join(dir, "other.tar")
	if err := os.WriteFile(keep, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	s.removeCutShortCheckpoints(context.Background())
	if entries, _ := os.ReadDir(dir); len(entries) != 1 || entries[0].Name() != "other.tar" {
		t.Errorf("after the restart the directory holds %v", entries)
	}
	if calls := snapshotCalls(fc); !slices.Equal(calls, []string{"SnapshotRemove " + checkpointSnapshotPrefix + "c1-0000", "SnapshotRemove " + checkpointSnapshotPrefix + "c1-0001"}) {
		t.Errorf("cocoon calls %q, want the checkpoints' snapshots removed", calls)
	}
	if left := fc.snapshotNames(); len(left) != 0 {
		t.Errorf("snapshots left in cocoon: %q", left)
	}
	if notes, _ := os.ReadDir(s.cfg.CheckpointJournal); len(notes) != 0 {
		t.Errorf("journal notes left: %v", notes)
	}
}

func TestCheckpointContainerRefusals(t *testing.T) {
	s, fc := checkpointServer(t)
	addContainer(t, s, &store.Container{ID: "c2", SandboxID: "pod1", State: store.ContainerExited})
	// Running, but with what cocoon refuses to snapshot: a virtio-fs share, a hot-attached device.
	addContainer(t, s, &store.Container{ID: "c3", SandboxID: "pod1", State: store.ContainerRunning, VM: store.VM{ID: "vm3", Share: store.Share{Attached: true}}})
	addContainer(t, s, &store.Container{ID: "c4", SandboxID: "pod1", State: store.ContainerRunning, VM: store.VM{ID: "vm4"}})
	if _, err := s.store.Containers.Modify("c4", func(r *store.Container) error {
		r.Config.Msg.Devices = []*runtimeapi.Device{{HostPath: "/dev/vdb", ContainerPath: "/dev/data"}}
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	existing := filepath.Join(dir, "existing.tar")
	if err := os.WriteFile(existing, []byte("keep me"), 0o644); err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	for _, tc := range []struct {
		name string
		req  *runtimeapi.CheckpointContainerRequest
		code codes.Code
	}{
		{"no ID", &runtimeapi.CheckpointContainerRequest{Location: filepath.Join(dir, "a.tar")}, codes.InvalidArgument},
		{"relative location", &runtimeapi.CheckpointContainerRequest{ContainerId: "c1", Location: "c1.tar"}, codes.InvalidArgument},
		{"unclean location", &runtimeapi.CheckpointContainerRequest{ContainerId: "c1", Location: dir + "/../x.tar"}, codes.InvalidArgument},
		{"negative timeout", &runtimeapi.CheckpointContainerRequest{ContainerId: "c1", Location: filepath.Join(dir, "a.tar"), Timeout: -1}, codes.InvalidArgument},
		{"not running", &runtimeapi.CheckpointContainerRequest{ContainerId: "c2", Location: filepath.Join(dir, "a.tar")}, codes.FailedPrecondition},
		{"a share attached", &runtimeapi.CheckpointContainerRequest{ContainerId: "c3", Location: filepath.Join(dir, "a.tar")}, codes.FailedPrecondition},
		{"a device attached", &runtimeapi.CheckpointContainerRequest{ContainerId: "c4", Location: filepath.Join(dir, "a.tar")}, codes.FailedPrecondition},
		{"existing file", &runtimeapi.CheckpointContainerRequest{ContainerId: "c1", Location: existing}, codes.AlreadyExists},
		{"missing directory", &runtimeapi.CheckpointContainerRequest{ContainerId: "c1", Location: filepath.Join(dir, "no", "a.tar")}, codes.InvalidArgument},
	} {
		_, err := s.CheckpointContainer(ctx, tc.req)
		if grpcerr.Code(err) != tc.code {
			t.Errorf("%s: %v, want %s", tc.name, err, tc.code)
		}
	}
	if _, err := s.CheckpointContainer(ctx, &runtimeapi.CheckpointContainerRequest{ContainerId: "nope", Location: filepath.Join(dir, "a.tar")}); !errors.Is(err, store.ErrNotFound) {
		t.Errorf("unknown container: %v, want not found", err)
	}
	if data, _ := os.ReadFile(existing); string(data) != "keep me" {
		t.Error("an existing file was overwritten")
	}
	if entries, _ := os.ReadDir(dir); len(entries) != 1 {
		t.Errorf("refusals left files: %v", entries)
	}
	if calls := fc.calls(); len(calls) != 0 {
		t.Errorf("refusals called cocoon: %q", calls)
	}
}

func TestCheckpointContainerFailureLeavesNothing(t *testing.T) {
	for _, tc := range []struct {
		command, method, message string
		kind                     error
		saved                    bool
	}{
		{"export", "SnapshotExport", "write archive: write /dev/stdout: no space left on device", cocoon.ErrNoSpace, true},
		{"save", "SnapshotSave", "snapshot VM vm1: save snapshot: no space left on device", cocoon.ErrNoSpace, false},
	} {
		t.Run(tc.command, func(t *testing.T) {
			s, fc := checkpointServer(t)
			fc.failOnce(tc.method, cocoonErr(tc.kind, tc.message, "snapshot", tc.command))
			dir := t.TempDir()
			_, err := s.CheckpointContainer(context.Background(), &runtimeapi.CheckpointContainerRequest{ContainerId: "c1", Location: filepath.Join(dir, "c1.tar")})
			if !errors.Is(err, tc.kind) {
				t.Fatalf("error %v, want %v", err, tc.kind)
			}
			if entries, _ := os.ReadDir(dir); len(entries) != 0 {
				t.Errorf("a failed checkpoint left %v", entries)
			}
			if notes, _ := os.ReadDir(s.cfg.CheckpointJournal); len(notes) != 0 {
				t.Errorf("a failed checkpoint left journal notes %v", notes)
			}
			calls := snapshotCalls(fc)
			if last := calls[len(calls)-1]; !strings.HasPrefix(last, "SnapshotRemove "+checkpointSnapshotPrefix) {
				t.Errorf("cocoon calls %q: the snapshot must be deleted after a failure", calls)
			}
			if left := fc.snapshotNames(); len(left) != 0 {
				t.Errorf("snapshots left in cocoon: %q", left)
			}
			if c, _ := s.store.Containers.Get("c1"); c.State != store.ContainerRunning {
				t.Errorf("container is %s after a failed checkpoint", c.State)
			}
		})
	}
}

// TestCheckpointSaveOutlivesTheDeadline: the guest is paused inside cocoon's save, which resumes
// it only at its end, so the caller's deadline passing during the save must not cut the save
// short; the call fails after it, and leaves nothing.
func TestCheckpointSaveOutlivesTheDeadline(t *testing.T) {
	s, fc := checkpointServer(t)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	var saveCut error
	fc.duringSave = func(saveCtx context.Context) {
		cancel() // the caller gives up while the guest is paused
		saveCut = saveCtx.Err()
	}
	dir := t.TempDir()
	_, err := s.CheckpointContainer(ctx, &runtimeapi.CheckpointContainerRequest{ContainerId: "c1", Location: filepath.Join(dir, "c1.tar")})
	if !errors.Is(err, context.Canceled) {
		t.Fatalf("error %v, want the caller's cancellation", err)
	}
	if saveCut != nil {
		t.Fatalf("the save's context ended with the caller's (%v): cocoon would be killed with the guest paused", saveCut)
	}
	if entries, _ := os.ReadDir(dir); len(entries) != 0 {
		t.Errorf("a checkpoint past its deadline left %v", entries)
	}
	if len(fc.snapshots) != 0 {
		t.Errorf("a checkpoint past its deadline left snapshots %v", fc.snapshots)
	}
}

func TestCheckpointPod(t *testing.T) {
	s, _ := checkpointServer(t)
	ctx := context.Background()
	out := t.TempDir()
	if _, err := s.CheckpointPod(ctx, &runtimeapi.CheckpointPodRequest{PodSandboxId: "pod1", OutputPath: out, ContainerIds: []string{"c1"}}); err != nil {
		t.Fatal(err)
	}
	entries, _ := os.ReadDir(out)
	if len(entries) != 2 || entries[0].Name() != "c1.tar" /* the container ID */ || entries[1].Name() != checkpoint.PodFile {
		t.Fatalf("checkpoint directory holds %v", entries)
	}
	members, err := readPodCheckpoint(out, []*runtimeapi.ContainerConfig{{Metadata: &runtimeapi.ContainerMetadata{Name: "c1"}}})
	if err != nil || len(members) != 1 || members[0].meta.Container.ID != "c1" {
		t.Fatalf("members %+v, %v", members, err)
	}
}

func TestCheckpointPodRefusals(t *testing.T) {
	s, fc := checkpointServer(t)
	addContainer(t, s, &store.Container{ID: "done", SandboxID: "pod1", State: store.ContainerExited})
	addSandbox(t, s, "pod2", store.SandboxReady)
	addContainer(t, s, &store.Container{ID: "other", SandboxID: "pod2", State: store.ContainerRunning, VM: store.VM{ID: "vm2"}})
	ctx := context.Background()
	full := t.TempDir()
	if err := os.WriteFile(filepath.Join(full, "x"), nil, 0o600); err != nil {
		t.Fatal(err)
	}
	empty := t.TempDir()
	for _, tc := range []struct {
		name string
		req  *runtimeapi.CheckpointPodRequest
		code codes.Code
	}{
		{"no sandbox ID", &runtimeapi.CheckpointPodRequest{OutputPath: empty, ContainerIds: []string{"c1"}}, codes.InvalidArgument},
		{"unknown option", &runtimeapi.CheckpointPodRequest{PodSandboxId: "pod1", OutputPath: empty, ContainerIds: []string{"c1"}, Options: map[string]string{"compress": "yes"}}, codes.InvalidArgument},
		{"relative output", &runtimeapi.CheckpointPodRequest{PodSandboxId: "pod1", OutputPath: "out", ContainerIds: []string{"c1"}}, codes.InvalidArgument},
		{"output not empty", &runtimeapi.CheckpointPodRequest{PodSandboxId: "pod1", OutputPath: full, ContainerIds: []string{"c1"}}, codes.InvalidArgument},
		{"output missing", &runtimeapi.CheckpointPodRequest{PodSandboxId: "pod1", OutputPath: filepath.Join(empty, "no"), ContainerIds: []string{"c1"}}, codes.InvalidArgument},
		{"no containers", &runtimeapi.CheckpointPodRequest{PodSandboxId: "pod1", OutputPath: empty}, codes.InvalidArgument},
		{"duplicate", &runtimeapi.CheckpointPodRequest{PodSandboxId: "pod1", OutputPath: empty, ContainerIds: []string{"c1", "c1"}}, codes.InvalidArgument},
		{"exited container", &runtimeapi.CheckpointPodRequest{PodSandboxId: "pod1", OutputPath: empty, ContainerIds: []string{"done"}}, codes.InvalidArgument},
		{"another pod's container", &runtimeapi.CheckpointPodRequest{PodSandboxId: "pod1", OutputPath: empty, ContainerIds: []string{"c1", "other"}}, codes.InvalidArgument},
	} {
		_, err := s.CheckpointPod(ctx, tc.req)
		if grpcerr.Code(err) != tc.code {
			t.Errorf("%s: %v, want %s", tc.name, err, tc.code)
		}
	}
	// Two running VMs cannot be cut at one instant.
	addContainer(t, s, &store.Container{ID: "c3", SandboxID: "pod1", State: store.ContainerRunning, VM: store.VM{ID: "vm3"}})
	_, err := s.CheckpointPod(ctx, &runtimeapi.CheckpointPodRequest{PodSandboxId: "pod1", OutputPath: empty, ContainerIds: []string{"c1", "c3"}})
	wantCode(t, err, codes.Unimplemented)
	if entries, _ := os.ReadDir(empty); len(entries) != 0 {
		t.Errorf("refusals wrote %v", entries)
	}
	if calls := fc.calls(); len(calls) != 0 {
		t.Errorf("refusals called cocoon: %q", calls)
	}
}

func TestCheckpointPodFailureRemovesItsFiles(t *testing.T) {
	s, fc := checkpointServer(t)
	fc.failOnce("SnapshotExport", cocoonErr(nil, "write archive: broken pipe", "snapshot", "export"))
	out := t.TempDir()
	if _, err := s.CheckpointPod(context.Background(), &runtimeapi.CheckpointPodRequest{PodSandboxId: "pod1", OutputPath: out, ContainerIds: []string{"c1"}}); err == nil {
		t.Fatal("checkpoint succeeded with a failing export")
	}
	if entries, _ := os.ReadDir(out); len(entries) != 0 {
		t.Errorf("a failed pod checkpoint left %v", entries)
	}
	if _, err := os.Stat(out); err != nil {
		t.Errorf("the caller's directory was removed: %v", err)
	}
}

func TestRestorePodRefusesWhatItCannotRestore(t *testing.T) {
	s, fc := checkpointServer(t)
	ctx := context.Background()
	good := t.TempDir()
	if _, err := s.CheckpointPod(ctx, &runtimeapi.CheckpointPodRequest{PodSandboxId: "pod1", OutputPath: good, ContainerIds: []string{"c1"}}); err != nil {
		t.Fatal(err)
	}
	before := fc.calls()
	junk := t.TempDir()
	if err := os.WriteFile(filepath.Join(junk, checkpoint.PodFile), []byte("not json"), 0o600); err != nil {
		t.Fatal(err)
	}
	notArchive := t.TempDir()
	if err := os.WriteFile(filepath.Join(notArchive, checkpoint.PodFile), []byte(`{"version":1,"containers":[{"name":"c1","archive":"c1.tar"}]}`), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(notArchive, "c1.tar"), []byte("junk"), 0o600); err != nil {
		t.Fatal(err)
	}
	escape := t.TempDir()
	if err := os.WriteFile(filepath.Join(escape, checkpoint.PodFile), []byte(`{"version":1,"containers":[{"name":"c1","archive":"../c1.tar"}]}`), 0o600); err != nil {
		t.Fatal(err)
	}
	named := func(names ...string) []*runtimeapi.ContainerConfig {
		var cfgs []*runtimeapi.ContainerConfig
		for _, n := range names {
			cfgs = append(cfgs, &runtimeapi.ContainerConfig{Metadata: &runtimeapi.ContainerMetadata{Name: n}})
		}
		return cfgs
	}
	podConfig := &runtimeapi.PodSandboxConfig{Metadata: &runtimeapi.PodSandboxMetadata{Name: "restored", Namespace: "ns", Uid: "u2"}}
	for _, tc := range []struct {
		name string
		req  *runtimeapi.RestorePodRequest
	}{
		{"no config", &runtimeapi.RestorePodRequest{CheckpointPath: good, ContainerConfigs: named("c1")}},
		{"unknown option", &runtimeapi.RestorePodRequest{CheckpointPath: good, Config: podConfig, ContainerConfigs: named("c1"), Options: map[string]string{"x": "y"}}},
		{"relative path", &runtimeapi.RestorePodRequest{CheckpointPath: "ckpt", Config: podConfig, ContainerConfigs: named("c1")}},
		{"empty directory", &runtimeapi.RestorePodRequest{CheckpointPath: t.TempDir(), Config: podConfig, ContainerConfigs: named("c1")}},
		{"junk pod.json", &runtimeapi.RestorePodRequest{CheckpointPath: junk, Config: podConfig, ContainerConfigs: named("c1")}},
		{"junk archive", &runtimeapi.RestorePodRequest{CheckpointPath: notArchive, Config: podConfig, ContainerConfigs: named("c1")}},
		{"archive outside", &runtimeapi.RestorePodRequest{CheckpointPath: escape, Config: podConfig, ContainerConfigs: named("c1")}},
		{"no containers", &runtimeapi.RestorePodRequest{CheckpointPath: good, Config: podConfig}},
		{"other name", &runtimeapi.RestorePodRequest{CheckpointPath: good, Config: podConfig, ContainerConfigs: named("web")}},
		{"extra name", &runtimeapi.RestorePodRequest{CheckpointPath: good, Config: podConfig, ContainerConfigs: named("c1", "web")}},
		{"twice", &runtimeapi.RestorePodRequest{CheckpointPath: good, Config: podConfig, ContainerConfigs: named("c1", "c1")}},
		{"other image", &runtimeapi.RestorePodRequest{CheckpointPath: good, Config: podConfig, ContainerConfigs: []*runtimeapi.ContainerConfig{
			{Metadata: &runtimeapi.ContainerMetadata{Name: "c1"}, Image: &runtimeapi.ImageSpec{Image: "cocoon.local/other:v1"}}}}},
	} {
		_, err := s.RestorePod(ctx, tc.req)
		if grpcerr.Code(err) != codes.InvalidArgument {
			t.Errorf("%s: %v, want InvalidArgument", tc.name, err)
		}
	}
	if sandboxes := s.store.Sandboxes.List(nil); len(sandboxes) != 1 {
		t.Errorf("refused restores left sandboxes: %d", len(sandboxes))
	}
	if after := fc.calls(); len(after) != len(before) {
		t.Errorf("refused restores called cocoon: %q", after[len(before):])
	}
	if data, _ := os.ReadFile(filepath.Join(notArchive, "c1.tar")); string(data) != "junk" {
		t.Error("the checkpoint data was modified")
	}
}

// TestCheckpointAndRestoreAPod runs a pod, checkpoints it, restores the checkpoint as a new pod
// and starts it, all on the in-process cocoon and network: the restored container clones the
// snapshot its VM was saved to, under the new pod's own sandbox and address.
func TestCheckpointAndRestoreAPod(t *testing.T) {
	n := newFakeNode(t, Config{CheckpointJournal: filepath.Join(t.TempDir(), "checkpoints")})
	ctx := context.Background()
	sandboxID, containerID := n.runningPod("web")
	saved := n.container(containerID)
	out := t.TempDir()
	if _, err := n.s.CheckpointPod(ctx, &runtimeapi.CheckpointPodRequest{PodSandboxId: sandboxID, OutputPath: out, ContainerIds: []string{containerID}}); err != nil {
		t.Fatal(err)
	}
	if c := n.container(containerID); c.State != store.ContainerRunning {
		t.Fatalf("container is %s after the checkpoint", c.State)
	}
	image, _ := n.s.images.Get(snapshotRef)
	if snaps := n.cocoon.snapshotNames(); !slices.Equal(snaps, []string{image.LocalName}) {
		t.Fatalf("snapshots after the checkpoint %q: the checkpoint's own must be gone", snaps)
	}

	restore := func(name string) (*runtimeapi.RestorePodResponse, error) {
		return n.s.RestorePod(ctx, &runtimeapi.RestorePodRequest{
			CheckpointPath: out, Config: podConfig(name), RuntimeHandler: HandlerName,
			ContainerConfigs: []*runtimeapi.ContainerConfig{containerConfig("app", snapshotRef)},
		})
	}
	resp, err := restore("web-restored")
	if err != nil {
		t.Fatal(err)
	}
	if resp.GetPodSandboxId() == sandboxID || len(resp.GetRestoredContainers()) != 1 || resp.GetRestoredContainers()[0].GetName() != "app" {
		t.Fatalf("RestorePod answered %v", resp)
	}
	restoredID := resp.GetRestoredContainers()[0].GetContainerId()
	sb := n.sandbox(resp.GetPodSandboxId())
	if sb.State != store.SandboxReady || sb.Network.IPs[0] == n.sandbox(sandboxID).Network.IPs[0] {
		t.Errorf("restored sandbox %+v, network %+v: it needs its own address", sb, sb.Network)
	}
	c := n.container(restoredID)
	img, err := n.s.images.Get(c.ImageRef)
	if c.State != store.ContainerCreated || !strings.HasPrefix(c.ImageRef, checkpointRepository+":sha256-") || err != nil ||
		img.Kind != store.ImageSnapshot || img.Snapshot.CPU != saved.VM.CPU || img.Snapshot.Memory != saved.VM.Memory || c.VM.Source != img.LocalName {
		t.Fatalf("restored container %+v, image %+v, %v", c, img, err)
	}
	n.startContainer(restoredID)
	c = n.container(restoredID)
	vm, ok := n.cocoon.vm(c.VM.ID)
	if c.State != store.ContainerRunning || !ok || vm.Config.Image != "cocoon.local/base:v1" || n.cocoon.vmConfDir(vm.ID) != n.net.CocoonConfDir(sb.ID) {
		t.Fatalf("restored container %+v, VM %+v", c, vm)
	}
	wantCalls(t, "clone", n.cocoon.calls("VMClone")[1:], "VMClone "+c.VM.Name+" "+img.LocalName)

	// The same checkpoint again: its archive is imported once.
	if _, err := restore("web-restored-again"); err != nil {
		t.Fatal(err)
	}
	if calls := n.cocoon.calls("SnapshotImport"); len(calls) != 2 /* the app image, the checkpoint */ {
		t.Errorf("imports %q", calls)
	}

	// A restore that fails once its sandbox exists leaves no sandbox: its container's creation
	// fails, or its archive's import, which runs beside the sandbox's making.
	settle(n.s)
	before := len(n.st.Sandboxes.List(nil))
	held := n.net.held()
	n.cocoon.failOnce("Capabilities", cocoonErr(nil, "cocoon is being upgraded", "version"))
	if _, err := restore("web-restored-failed"); err == nil {
		t.Fatal("the restore succeeded")
	}
	if after := len(n.st.Sandboxes.List(nil)); after != before {
		t.Errorf("%d sandboxes after a failed restore, %d before", after, before)
	}
	if after := n.net.held(); !slices.Equal(after, held) {
		t.Errorf("a failed restore left %q on the network (before: %q)", after, held)
	}
	other := t.TempDir()
	if _, err := n.s.CheckpointPod(ctx, &runtimeapi.CheckpointPodRequest{PodSandboxId: sandboxID, OutputPath: other, ContainerIds: []string{containerID}}); err != nil {
		t.Fatal(err)
	}
	imports := len(n.cocoon.calls("SnapshotImport"))
	n.cocoon.failOnce("SnapshotImport", cocoonErr(nil, "no space left on device", "snapshot", "import"))
	_, err = n.s.RestorePod(ctx, &runtimeapi.RestorePodRequest{
		CheckpointPath: other, Config: podConfig("web-import-failed"), RuntimeHandler: HandlerName,
		ContainerConfigs: []*runtimeapi.ContainerConfig{containerConfig("app", snapshotRef)},
	})
	if err == nil || len(n.cocoon.calls("SnapshotImport")) != imports+1 {
		t.Fatalf("a restore whose import failed: %v", err)
	}
	if after := len(n.st.Sandboxes.List(nil)); after != before {
		t.Errorf("%d sandboxes after a restore whose import failed, %d before", after, before)
	}
	if after := n.net.held(); !slices.Equal(after, held) {
		t.Errorf("a restore whose import failed left %q on the network (before: %q)", after, held)
	}
}
