package vmruntime

import (
	"context"
	"log/slog"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/containerd/errdefs"

	"github.com/cocoonstack/cocoon-cri/pkg/cocoon"
	"github.com/cocoonstack/cocoon-cri/pkg/store"
	"github.com/cocoonstack/cocoon-cri/streaming"
)

// newGuestExecutor is an executor over the fake cocoon and a store holding one running container
// whose VM is vm.
func newGuestExecutor(t *testing.T, fc *fakeCocoon, login GuestSSH, vm cocoon.VM) (*guestExecutor, *store.Container) {
	t.Helper()
	st, err := store.Open(filepath.Join(t.TempDir(), "state.db"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = st.Close() })
	c := &store.Container{ID: "c1", Name: "c1", State: store.ContainerRunning, StartedAt: time.Now().UnixNano(),
		VM: store.VM{ID: vm.ID, Name: "vm"}}
	if err := st.Containers.Create(c); err != nil {
		t.Fatal(err)
	}
	g := &guestExecutor{ssh: login, readyTimeout: time.Minute, log: slog.New(slog.DiscardHandler), store: st, cocoon: fc,
		cocoonFor: func(*store.Sandbox) Cocoon { return fc }, now: time.Now}
	return g, c
}

func TestGuestExecutorFindsItsWayIn(t *testing.T) {
	ctx := context.Background()
	sb := &store.Sandbox{ID: "pod"}
	echo := systemCommand("true")

	t.Run("a cocoon without vm exec and no SSH login", func(t *testing.T) {
		fc := newFakeCocoon()
		g, c := newGuestExecutor(t, fc, GuestSSH{}, fc.addVM(cocoon.VM{State: cocoon.VMStateRunning}))
		if path, err := g.path(ctx); err != nil || path != ExecPathNone {
			t.Fatalf("path %q, %v; want none", path, err)
		}
		if _, err := g.run(ctx, sb, c, echo, streaming.ExecIO{}); !errdefs.IsFailedPrecondition(err) || !strings.Contains(err.Error(), "--guest-ssh-key-file") {
			t.Fatalf("run: %v, want a failed precondition that says what to configure", err)
		}
	})

	t.Run("the agent answers", func(t *testing.T) {
		fc := newFakeCocoon()
		fc.setCaps(capsV05)
		fc.setGuest(func(context.Context, cocoon.VM, []string, cocoon.ExecOptions) (int, error) { return 3, nil })
		g, c := newGuestExecutor(t, fc, GuestSSH{}, fc.addVM(cocoon.VM{State: cocoon.VMStateRunning, VsockSocket: "/run/vsock"}))
		if code, err := g.run(ctx, sb, c, echo, streaming.ExecIO{}); err != nil || code != 3 {
			t.Fatalf("run: %d, %v; want the command's exit code 3", code, err)
		}
		if cur, _ := g.store.Containers.Get(c.ID); !cur.VM.GuestExecKnown || cur.VM.GuestExec != ExecPathAgent {
			t.Fatalf("learned %+v, want the agent path recorded", cur.VM)
		}
	})

	t.Run("a guest without an agent", func(t *testing.T) {
		fc := newFakeCocoon()
		fc.setCaps(capsV05)
		g, c := newGuestExecutor(t, fc, GuestSSH{}, fc.addVM(cocoon.VM{State: cocoon.VMStateRunning}))
		if _, err := g.run(ctx, sb, c, echo, streaming.ExecIO{}); !errdefs.IsFailedPrecondition(err) || !strings.Contains(err.Error(), "vsock") {
			t.Fatalf("run: %v, want a failed precondition that names the missing vsock", err)
		}
		if path, learned, err := g.vmPath(ctx, c); err != nil || !learned || path != ExecPathNone {
			t.Fatalf("vmPath %q learned=%v %v; want none, learned", path, learned, err)
		}
		fc.reset()
		if _, err := g.run(ctx, sb, c, echo, streaming.ExecIO{}); !errdefs.IsFailedPrecondition(err) {
			t.Fatalf("run again: %v", err)
		}
		if calls := fc.calls("VMExec"); len(calls) != 0 {
			t.Fatalf("the agent was asked again once known absent: %v", calls)
		}
	})
}
