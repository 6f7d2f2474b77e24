package e2e

import (
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/cocoonstack/cocoon-cri/test/harness"
)

// TestDemo runs the README's main job, hack/demo.sh, with the binaries under test: a change that
// breaks what a new user runs first fails here.
func TestDemo(t *testing.T) {
	t.Parallel()
	root, err := harness.RepoRoot()
	if err != nil {
		t.Fatal(err)
	}
	bin := t.TempDir()
	build := exec.Command("go", "build", "-o", filepath.Join(bin, "mktestimage"), "./test/cmd/mktestimage")
	build.Dir = root
	if out, err := build.CombinedOutput(); err != nil {
		t.Fatalf("build mktestimage: %v\n%s", err, out)
	}
	for name, target := range map[string]string{"cocoon-cri": bins.CocoonCRI, "cocoon-sim": bins.CocoonSim, "crictl": bins.Crictl} {
		if err := os.Symlink(target, filepath.Join(bin, name)); err != nil {
			t.Fatal(err)
		}
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	demo := exec.CommandContext(ctx, "./hack/demo.sh")
	demo.Dir = root
	demo.Env = append(os.Environ(), "DEMO_BIN="+bin, "DEMO_KEEP=")
	out, err := demo.CombinedOutput()
	if err != nil || !strings.Contains(string(out), "demo done: a VM pod ran on cocoon-cri and left nothing behind") {
		t.Fatalf("hack/demo.sh: %v\n%s", err, out)
	}
}
