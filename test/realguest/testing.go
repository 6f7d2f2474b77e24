package realguest

import (
	"errors"
	"fmt"
	"os"
	"os/exec"
	"testing"

	"github.com/cocoonstack/cocoon-cri/test/cocoonsim/qemu"
)

// ForTest builds the guest under t.TempDir() for a test that boots it with QEMU. When something
// hack/setup-realguest.sh installs is missing the test is skipped, except in CI (CI set), where
// the setup is part of the run and a skip would hide that it did not happen.
func ForTest(t testing.TB) *Guest {
	t.Helper()
	g, err := build(t.TempDir())
	if errors.Is(err, ErrNotInstalled) {
		if os.Getenv("CI") != "" {
			t.Fatalf("real guest: %v", err)
		}
		t.Skipf("real guest: %v", err)
	}
	if err != nil {
		t.Fatalf("build real guest: %v", err)
	}
	return g
}

// build is Build after checking for QEMU too, which a test needs as much as the guest.
func build(dir string) (*Guest, error) {
	if _, err := exec.LookPath(qemu.DefaultBinary); err != nil {
		return nil, fmt.Errorf("%s: qemu-system-x86 %w", qemu.DefaultBinary, ErrNotInstalled)
	}
	return Build(dir)
}
