package vmruntime

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/cocoonstack/cocoon-cri/cri/grpcerr"
	"github.com/cocoonstack/cocoon-cri/pkg/cocoon"
	"github.com/cocoonstack/cocoon-cri/pkg/store"

	"google.golang.org/grpc/codes"
	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"
)

func TestValidateMountsRefusesWhatNoCopyHonours(t *testing.T) {
	ok := func(target string) *runtimeapi.Mount {
		return &runtimeapi.Mount{ContainerPath: target, HostPath: "/var/lib/kubelet/pods/x/volumes/v"}
	}
	for _, tc := range []struct {
		name   string
		mounts []*runtimeapi.Mount
		want   string // "" accepted
	}{
		{"plain", []*runtimeapi.Mount{ok("/etc/app"), ok("/etc/app/nested"), ok("/dev/termination-log")}, ""},
		{"host-to-container", []*runtimeapi.Mount{{ContainerPath: "/mnt", HostPath: "/srv",
			Propagation: runtimeapi.MountPropagation_PROPAGATION_HOST_TO_CONTAINER}}, ""},
		{"relative target", []*runtimeapi.Mount{ok("etc/app")}, "absolute path in the guest"},
		{"root", []*runtimeapi.Mount{ok("/")}, "other than /"},
		{"NUL", []*runtimeapi.Mount{ok("/etc/a\x00b")}, "absolute path in the guest"},
		{"relative source", []*runtimeapi.Mount{{ContainerPath: "/a", HostPath: "srv"}}, "absolute path on the node"},
		{"twice", []*runtimeapi.Mount{ok("/etc/app"), ok("/etc/app/")}, "mounted twice"},
		{"image", []*runtimeapi.Mount{{ContainerPath: "/img", HostPath: "/x", Image: &runtimeapi.ImageSpec{Image: "busybox"}}}, "image volume"},
		{"bidirectional", []*runtimeapi.Mount{{ContainerPath: "/mnt", HostPath: "/srv",
			Propagation: runtimeapi.MountPropagation_PROPAGATION_BIDIRECTIONAL}}, "bidirectional"},
		{"idmap", []*runtimeapi.Mount{{ContainerPath: "/mnt", HostPath: "/srv",
			UidMappings: []*runtimeapi.IDMapping{{HostId: 1000, ContainerId: 0, Length: 1}}}}, "ID mappings"},
		{"rro", []*runtimeapi.Mount{{ContainerPath: "/mnt", HostPath: "/srv", Readonly: true, RecursiveReadOnly: true}}, "recursive read-only"},
	} {
		err := validateMounts(tc.mounts)
		switch {
		case tc.want == "" && err != nil:
			t.Errorf("%s: refused: %v", tc.name, err)
		case tc.want != "" && (grpcerr.Code(err) != codes.InvalidArgument || !strings.Contains(err.Error(), tc.want)):
			t.Errorf("%s: %v, want InvalidArgument with %q", tc.name, err, tc.want)
		}
	}
}

// Parents are bound before what is mounted inside them, whatever order the kubelet gave; only
// read-only volumes are kept in step.
func TestContainerVolumesOrderAndPolicy(t *testing.T) {
	cfg := &runtimeapi.ContainerConfig{Mounts: []*runtimeapi.Mount{
		{ContainerPath: "/var/run/secrets/kubernetes.io/serviceaccount", HostPath: "/t", Readonly: true},
		{ContainerPath: "/var/run", HostPath: "/e"},
		{ContainerPath: "/etc/hosts/", HostPath: "/h"},
	}}
	var got []string
	for _, vc := range containerVolumes(cfg, true) {
		got = append(got, vc.guest.Target+" "+vc.guest.DataDir+" "+map[bool]string{true: "once", false: "synced"}[vc.guest.Once])
	}
	want := []string{
		"/etc/hosts /run/cocoon-cri/volumes/0 once",
		"/var/run /run/cocoon-cri/volumes/1 once",
		"/var/run/secrets/kubernetes.io/serviceaccount /run/cocoon-cri/volumes/2 synced",
	}
	if strings.Join(got, "\n") != strings.Join(want, "\n") {
		t.Fatalf("got\n%s\nwant\n%s", strings.Join(got, "\n"), strings.Join(want, "\n"))
	}
}

// The kubelet's own files are recognised by where the kubelet keeps them, and only those are left
// out of a guest that takes no copies.
func TestKubeletFilesAreLeftOutOfGuestsWithoutCopies(t *testing.T) {
	pod := "/var/lib/kubelet/pods/0c2f/"
	cfg := &runtimeapi.ContainerConfig{Metadata: &runtimeapi.ContainerMetadata{Name: "app"}, Mounts: []*runtimeapi.Mount{
		{ContainerPath: "/etc/hosts", HostPath: pod + "etc-hosts"},
		{ContainerPath: "/dev/termination-log", HostPath: pod + "containers/app/3f1c9a2e"},
		{ContainerPath: "/etc/config", HostPath: pod + "volumes/kubernetes.io~configmap/config", Readonly: true},
		{ContainerPath: "/etc/hosts2", HostPath: "/srv/etc-hosts"},
	}}
	var kept []string
	for _, vc := range containerVolumes(cfg, false) {
		kept = append(kept, vc.guest.Target)
	}
	if want := "/etc/config /etc/hosts2"; strings.Join(kept, " ") != want {
		t.Fatalf("kept %q, want %q", kept, want)
	}
	if got := len(containerVolumes(cfg, true)); got != 4 {
		t.Fatalf("a guest that takes copies gets %d volumes, want all 4", got)
	}
}

// The copier alone, over the fake cocoon's agent: a volume reaches the guest as a script with a
// tar stream on its stdin; a sync with nothing changed runs nothing; a change on the host is sent.
func TestVolumeCopierSendsWhatChanged(t *testing.T) {
	ctx := context.Background()
	fc := newFakeCocoon()
	fc.setCaps(capsV05)
	var sent []string // per exec: the script's target and the bytes on stdin
	fc.setGuest(func(_ context.Context, _ cocoon.VM, argv []string, o cocoon.ExecOptions) (int, error) {
		data, err := io.ReadAll(o.Stdin)
		if err != nil {
			return -1, err
		}
		sent = append(sent, fmt.Sprintf("%v %d", strings.Contains(argv[len(argv)-1], "/etc/config"), len(data)))
		return 0, nil
	})
	g, c := newGuestExecutor(t, fc, GuestSSH{}, fc.addVM(cocoon.VM{State: cocoon.VMStateRunning, VsockSocket: "/run/vsock"}))
	vs := &volumeCopier{maxBytes: 1 << 20, syncInterval: time.Hour, log: slog.New(slog.DiscardHandler), store: g.store, guest: g}
	host := t.TempDir()
	if err := os.WriteFile(filepath.Join(host, "key"), []byte("one"), 0o644); err != nil {
		t.Fatal(err)
	}
	copies := containerVolumes(&runtimeapi.ContainerConfig{Mounts: []*runtimeapi.Mount{{ContainerPath: "/etc/config", HostPath: host, Readonly: true}}}, true)
	sb := &store.Sandbox{ID: "pod"}
	if err := vs.deliver(ctx, sb, c, copies); err != nil {
		t.Fatal(err)
	}
	if len(sent) != 1 || !strings.HasPrefix(sent[0], "true ") || sent[0] == "true 0" {
		t.Fatalf("the first copy sent %q, want one script for /etc/config with a tar stream", sent)
	}
	if err := vs.sync(ctx, sb, c, copies[0]); err != nil || len(sent) != 1 {
		t.Fatalf("a sync with nothing changed: %v, sent %q", err, sent)
	}
	if err := os.WriteFile(filepath.Join(host, "key"), []byte("two, longer"), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := vs.sync(ctx, sb, c, copies[0]); err != nil || len(sent) != 2 {
		t.Fatalf("a sync after a change: %v, sent %q", err, sent)
	}
}
