package store

import (
	"errors"
	"fmt"
	"path/filepath"
	"strconv"
	"sync"
	"testing"

	bolt "go.etcd.io/bbolt"
	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"
)

func openTemp(t *testing.T) (*Store, string) {
	t.Helper()
	path := filepath.Join(t.TempDir(), "state", "cocoon-cri.db")
	s, err := Open(path)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	return s, path
}

func sandbox(id, name string) *Sandbox {
	return &Sandbox{
		ID: id, Name: name, State: SandboxReady, RuntimeHandler: "cocoon", CreatedAt: 42,
		Config: Proto[*runtimeapi.PodSandboxConfig]{Msg: &runtimeapi.PodSandboxConfig{
			Metadata:    &runtimeapi.PodSandboxMetadata{Name: "web", Namespace: "default", Uid: "u1", Attempt: 3},
			Labels:      map[string]string{"app": "web"},
			Annotations: map[string]string{"vm.cocoonstack.io/backend": "cloud-hypervisor"},
			Linux:       &runtimeapi.LinuxPodSandboxConfig{CgroupParent: "/kubepods/pod1"},
		}},
		VM: VMOptions{Storage: 20 << 30},
	}
}

func TestRecordsSurviveReopen(t *testing.T) {
	s, path := openTemp(t)
	if err := s.Sandboxes.Create(sandbox("sb1", "web_default_u1_3")); err != nil {
		t.Fatal(err)
	}
	ctr := &Container{ID: "c1", SandboxID: "sb1", Name: "app_web_0", State: ContainerRunning,
		Config: Proto[*runtimeapi.ContainerConfig]{Msg: &runtimeapi.ContainerConfig{
			Metadata: &runtimeapi.ContainerMetadata{Name: "app"}, Image: &runtimeapi.ImageSpec{Image: "snap:1"},
		}},
		VM: VM{Name: "cri-c1", Mode: VMClone, Source: "cri-abc", CPU: 2, Memory: 1 << 30, ID: "VMID", PID: 99}}
	if err := s.Containers.Create(ctr); err != nil {
		t.Fatal(err)
	}
	img := &Image{ID: "sha256:aa", RepoTags: []string{"docker.io/library/snap:1"}, Kind: ImageSnapshot, LocalName: "cri-aa",
		Snapshot: &SnapshotInfo{CPU: 1, Memory: 512 << 20, Hypervisor: "cloud-hypervisor"}}
	if err := s.Images.Create(img); err != nil {
		t.Fatal(err)
	}
	s.Close()

	s2, err := Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer s2.Close()
	sb, err := s2.Sandboxes.Get("sb1")
	if err != nil {
		t.Fatal(err)
	}
	md := sb.Config.Msg.GetMetadata()
	if md.GetName() != "web" || md.GetAttempt() != 3 || sb.Config.Msg.GetLabels()["app"] != "web" ||
		sb.Config.Msg.GetLinux().GetCgroupParent() != "/kubepods/pod1" || sb.VM.Storage != 20<<30 || sb.CreatedAt != 42 {
		t.Fatalf("sandbox after reopen: %+v / %v", sb, sb.Config.Msg)
	}
	c, err := s2.Containers.Get("c1")
	if err != nil {
		t.Fatal(err)
	}
	if c.VM.PID != 99 || c.Config.Msg.GetImage().GetImage() != "snap:1" || c.State != ContainerRunning {
		t.Fatalf("container after reopen: %+v", c)
	}
	i, ok := s2.Images.Lookup("docker.io/library/snap:1")
	if !ok || i.ID != "sha256:aa" || i.Snapshot.Memory != 512<<20 {
		t.Fatalf("image lookup after reopen: %+v %v", i, ok)
	}
}

func TestUniqueNamesAreEnforced(t *testing.T) {
	s, _ := openTemp(t)
	if err := s.Sandboxes.Create(sandbox("sb1", "n")); err != nil {
		t.Fatal(err)
	}
	err := s.Sandboxes.Create(sandbox("sb2", "n"))
	if !errors.Is(err, ErrExists) {
		t.Fatalf("duplicate name: err = %v", err)
	}
	if _, err := s.Sandboxes.Get("sb2"); !errors.Is(err, ErrNotFound) {
		t.Fatalf("refused record was stored: %v", err)
	}
	if !s.Sandboxes.Has("sb1") || s.Sandboxes.Has("sb2") || s.Sandboxes.Has("sb") {
		t.Fatal("Has does not match the stored records exactly")
	}
	if err := s.Sandboxes.Create(sandbox("sb1", "other")); !errors.Is(err, ErrExists) {
		t.Fatalf("duplicate ID: err = %v", err)
	}
	// The name is free again once its holder is gone.
	if err := s.Sandboxes.Delete("sb1"); err != nil {
		t.Fatal(err)
	}
	if err := s.Sandboxes.Create(sandbox("sb2", "n")); err != nil {
		t.Fatal(err)
	}
	if got, ok := s.Sandboxes.Lookup(SandboxNameKey("n")); !ok || got.ID != "sb2" {
		t.Fatalf("lookup by name = %+v, %v", got, ok)
	}
}

func TestModifyIsAtomic(t *testing.T) {
	s, _ := openTemp(t)
	if err := s.Sandboxes.Create(sandbox("sb1", "n")); err != nil {
		t.Fatal(err)
	}
	boom := errors.New("boom")
	_, err := s.Sandboxes.Modify("sb1", func(sb *Sandbox) error {
		sb.State = SandboxNotReady
		return boom
	})
	if !errors.Is(err, boom) {
		t.Fatalf("err = %v", err)
	}
	if sb, _ := s.Sandboxes.Get("sb1"); sb.State != SandboxReady {
		t.Fatalf("failed modify changed the record: %s", sb.State)
	}
	got, err := s.Sandboxes.Modify("sb1", func(sb *Sandbox) error { sb.State = SandboxNotReady; return nil })
	if err != nil || got.State != SandboxNotReady {
		t.Fatalf("modify = %+v, %v", got, err)
	}
	if _, err := s.Sandboxes.Modify("missing", func(*Sandbox) error { return nil }); !errors.Is(err, ErrNotFound) {
		t.Fatalf("modify missing: %v", err)
	}
	if err := s.Sandboxes.Delete("missing"); !errors.Is(err, ErrNotFound) {
		t.Fatalf("delete missing: %v", err)
	}
}

func TestCopiesDoNotAlias(t *testing.T) {
	s, _ := openTemp(t)
	img := &Image{ID: "sha256:aa", RepoTags: []string{"a:1"}, Snapshot: &SnapshotInfo{CPU: 1}}
	if err := s.Images.Create(img); err != nil {
		t.Fatal(err)
	}
	img.RepoTags[0] = "changed"
	got, _ := s.Images.Get("sha256:aa")
	got.RepoTags[0] = "changed too"
	got.Snapshot.CPU = 9
	again, _ := s.Images.Get("sha256:aa")
	if again.RepoTags[0] != "a:1" || again.Snapshot.CPU != 1 {
		t.Fatalf("stored record was changed through a copy: %+v", again)
	}
}

func TestTransactionMovesAReferenceBetweenImages(t *testing.T) {
	s, _ := openTemp(t)
	if err := s.Images.Create(&Image{ID: "sha256:old", RepoTags: []string{"app:1"}}); err != nil {
		t.Fatal(err)
	}
	// A new image may not take a tag another image holds, unless the same transaction frees it.
	if err := s.Images.Create(&Image{ID: "sha256:new", RepoTags: []string{"app:1"}}); !errors.Is(err, ErrExists) {
		t.Fatalf("err = %v", err)
	}
	err := s.Images.Update(func(tx *Tx[Image]) error {
		old, _ := tx.Get("sha256:old")
		old.RepoTags = nil
		if err := tx.Put(old); err != nil {
			return err
		}
		if holder, ok := tx.Holder("app:1"); ok {
			return fmt.Errorf("tag still held by %s", holder)
		}
		return tx.Put(&Image{ID: "sha256:new", RepoTags: []string{"app:1"}})
	})
	if err != nil {
		t.Fatal(err)
	}
	if got, ok := s.Images.Lookup("app:1"); !ok || got.ID != "sha256:new" {
		t.Fatalf("lookup = %+v, %v", got, ok)
	}
	if n := len(s.Images.List(nil)); n != 2 {
		t.Fatalf("%d images", n)
	}
}

func TestResolvePrefix(t *testing.T) {
	s, _ := openTemp(t)
	for _, id := range []string{"abc123", "abd456", "xyz"} {
		if err := s.Containers.Create(&Container{ID: id, Name: id}); err != nil {
			t.Fatal(err)
		}
	}
	for in, want := range map[string]string{"abc123": "abc123", "abc": "abc123", "x": "xyz"} {
		if got, err := s.Containers.Resolve(in); err != nil || got != want {
			t.Errorf("Resolve(%q) = %q, %v; want %q", in, got, err, want)
		}
	}
	if _, err := s.Containers.Resolve("ab"); !errors.Is(err, ErrAmbiguous) {
		t.Errorf("ambiguous: %v", err)
	}
	for _, in := range []string{"nope", ""} {
		if _, err := s.Containers.Resolve(in); !errors.Is(err, ErrNotFound) {
			t.Errorf("Resolve(%q): %v", in, err)
		}
	}
}

func TestNewerSchemaIsRefused(t *testing.T) {
	s, path := openTemp(t)
	err := s.db.Update(func(tx *bolt.Tx) error {
		return tx.Bucket(metaBucket).Put(schemaKey, []byte(strconv.Itoa(SchemaVersion+1)))
	})
	if err != nil {
		t.Fatal(err)
	}
	s.Close()
	if _, err := Open(path); err == nil {
		t.Fatal("opened a database of a newer schema")
	}
}

func TestSecondOpenFailsFast(t *testing.T) {
	_, path := openTemp(t)
	if _, err := Open(path); err == nil {
		t.Fatal("a second open of a held database succeeded")
	}
}

func TestConcurrentModifiesAreSerialised(t *testing.T) {
	s, _ := openTemp(t)
	if err := s.Containers.Create(&Container{ID: "c", Name: "c"}); err != nil {
		t.Fatal(err)
	}
	var wg sync.WaitGroup
	for range 20 {
		wg.Go(func() {
			if _, err := s.Containers.Modify("c", func(c *Container) error { c.ExitCode++; return nil }); err != nil {
				t.Error(err)
			}
			s.Containers.List(nil)
		})
	}
	wg.Wait()
	if c, _ := s.Containers.Get("c"); c.ExitCode != 20 {
		t.Fatalf("lost updates: %d", c.ExitCode)
	}
}

// A record that cannot be decoded does not stop the store from opening: it is moved, as it was, to
// the quarantine bucket and reported, and every other record loads; it stays out on later opens.
func TestCorruptRecordIsQuarantined(t *testing.T) {
	s, path := openTemp(t)
	for _, id := range []string{"sb1", "sb2"} {
		if err := s.Sandboxes.Create(sandbox(id, "web_default_"+id+"_0")); err != nil {
			t.Fatal(err)
		}
	}
	garbage := []byte(`{"id": "sb2", "state": `)
	err := s.db.Update(func(tx *bolt.Tx) error { return tx.Bucket([]byte("sandboxes")).Put([]byte("sb2"), garbage) })
	if err != nil {
		t.Fatal(err)
	}
	s.Close()

	s2, err := Open(path)
	if err != nil {
		t.Fatalf("a corrupt record stops the store from opening: %v", err)
	}
	if len(s2.Quarantined) != 1 || s2.Quarantined[0].Table != "sandboxes" || s2.Quarantined[0].Key != "sb2" || s2.Quarantined[0].Err == "" {
		t.Fatalf("quarantined: %+v", s2.Quarantined)
	}
	if _, err := s2.Sandboxes.Get("sb1"); err != nil {
		t.Fatalf("the good record: %v", err)
	}
	if s2.Sandboxes.Has("sb2") {
		t.Fatal("the corrupt record is still served")
	}
	var kept []byte
	_ = s2.db.View(func(tx *bolt.Tx) error {
		kept = append(kept, tx.Bucket(quarantineBucket).Get([]byte("sandboxes/sb2"))...)
		return nil
	})
	if string(kept) != string(garbage) {
		t.Fatalf("quarantine holds %q, want the record as it was", kept)
	}
	s2.Close()
	s3, err := Open(path)
	if err != nil || len(s3.Quarantined) != 0 {
		t.Fatalf("reopen: %+v, %v", s3.Quarantined, err)
	}
	s3.Close()
}
