// Package e2e drives a live cocoon-cri on the cocoon simulator with the real clients: crictl and
// critest. Each test gets a node of its own (state, cocoon and network-namespace directories in a
// temporary directory) and stops everything it started, by PID, also when it fails.
package e2e

import (
	"flag"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strconv"
	"testing"

	"github.com/cocoonstack/cocoon-cri/test/harness"
	"github.com/cocoonstack/cocoon-cri/test/hostguard"
)

// bins are the executables under test, built (or found) once for the package.
var bins = &harness.Bins

// clusterProgram is test/cmd/cocoon-cluster, built for this run.
var clusterProgram string

func TestMain(m *testing.M) {
	os.Exit(run(m))
}

// testsAtOnce is how many tests run at once unless -parallel says otherwise. Each has a node of its
// own and spends most of its time waiting (a guest's boot, a kubelet's sync, a daemon's restart),
// so the package runs more of them than the machine has cores: go test's default is GOMAXPROCS.
const testsAtOnce = 4

func setParallel() {
	flag.Parse()
	explicit := false
	flag.Visit(func(f *flag.Flag) { explicit = explicit || f.Name == "test.parallel" })
	if !explicit {
		_ = flag.Set("test.parallel", strconv.Itoa(max(testsAtOnce, runtime.GOMAXPROCS(0))))
	}
}

func run(m *testing.M) int {
	setParallel()
	if os.Geteuid() != 0 {
		if os.Getenv("CI") != "" {
			fmt.Fprintln(os.Stderr, "e2e: the end-to-end tests need root (network namespaces) and CI runs as root")
			return 1
		}
		fmt.Fprintln(os.Stderr, "e2e: skipped: needs root to create network namespaces")
		return 0
	}
	// A run killed before its cleanups (CI cut short, a machine snapshotted mid-run) left nodes
	// behind: the cluster tests would find the host link taken.
	swept, err := harness.SweepStale(os.TempDir())
	if len(swept) > 0 {
		fmt.Fprintf(os.Stderr, "e2e: removed what killed runs left: %v\n", swept)
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "e2e:", err)
		return 1
	}
	dir, err := harness.MkdirOwned("", "-e2e-bin")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	defer os.RemoveAll(dir)
	root, err := harness.RepoRoot()
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	// The daemon is built with the race detector so the end-to-end runs check it too; not for the
	// benchmarks, which measure it.
	race := []string{"-race"}
	if os.Getenv(benchEnv) != "" {
		race = nil
	}
	builds := []struct {
		out  *string
		name string
		pkg  string
		args []string
	}{
		{&bins.CocoonCRI, "cocoon-cri", "./cmd/cocoon-cri", race},
		{&bins.CocoonCRIPlain, "cocoon-cri-plain", "./cmd/cocoon-cri", nil},
		{&bins.CocoonSim, "cocoon-sim", "./test/cocoonsim/cmd/cocoon-sim", nil},
		// Beside the daemon and the simulator, which it runs: hack/cluster.sh serves the cluster
		// tests' clusters with it.
		{&clusterProgram, "cocoon-cluster", "./test/cmd/cocoon-cluster", nil},
	}
	for _, b := range builds {
		*b.out = filepath.Join(dir, b.name)
		args := append(append([]string{"build"}, b.args...), "-o", *b.out, b.pkg)
		cmd := exec.Command("go", args...)
		cmd.Dir = root
		if out, err := cmd.CombinedOutput(); err != nil {
			fmt.Fprintf(os.Stderr, "e2e: go build %s: %v\n%s", b.pkg, err, out)
			return 1
		}
	}
	toolDir := os.Getenv("COCOON_CRI_BIN")
	if toolDir == "" {
		toolDir = filepath.Join(root, "bin")
	}
	if err := harness.FindTools(toolDir); err != nil {
		fmt.Fprintln(os.Stderr, "e2e:", err)
		return 1
	}
	host := hostguard.Snapshot()
	code := m.Run()
	if err := harness.RemovePoolCgroupParent(); err != nil {
		fmt.Fprintln(os.Stderr, "e2e:", err)
		return 1
	}
	if err := host.Check(); err != nil {
		fmt.Fprintln(os.Stderr, "e2e:", err)
		return 1
	}
	return code
}
