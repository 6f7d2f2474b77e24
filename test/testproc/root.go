package testproc

import (
	"os"
	"testing"
)

// RequireRoot skips t unless it runs as root, saying what needs root (network namespaces, a
// mount, a device node). Under CI, which runs as root, it fails instead: no test may stop running
// there unnoticed.
func RequireRoot(t testing.TB, what string) {
	t.Helper()
	if os.Geteuid() == 0 {
		return
	}
	if os.Getenv("CI") != "" {
		t.Fatalf("%s needs root, and CI runs as root", what)
	}
	t.Skipf("%s needs root", what)
}
