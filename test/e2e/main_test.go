// Package e2e drives a live cocoon-cri on the cocoon simulator with the real clients: crictl and
// critest. Each test gets a node of its own (state, cocoon and network-namespace directories in a
// temporary directory) and stops everything it started, by PID, also when it fails.
package e2e

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"testing"

	"github.com/cocoonstack/cocoon-cri/test/hostguard"
)

// bins are the executables under test, built once for the package.
var bins struct {
	cocoonCRI, cocoonSim, crictl, critest, kubelet string
	// cocoonCRIPlain is the daemon without the race detector, for the crash-safety test: its
	// hundreds of restarts are CPU-bound, and the race build costs a third more there.
	cocoonCRIPlain string
	// The control plane of the cluster tests.
	etcd, kubeAPIServer, kubeControllerManager, kubeScheduler, kubeProxy, coreDNS, kubectl string
}

func TestMain(m *testing.M) {
	os.Exit(run(m))
}

func run(m *testing.M) int {
	if os.Geteuid() != 0 {
		if os.Getenv("CI") != "" {
			fmt.Fprintln(os.Stderr, "e2e: the end-to-end tests need root (network namespaces) and CI runs as root")
			return 1
		}
		fmt.Fprintln(os.Stderr, "e2e: skipped: needs root to create network namespaces")
		return 0
	}
	dir, err := os.MkdirTemp("", "cocoon-cri-e2e-bin")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	defer os.RemoveAll(dir)
	root, err := repoRoot()
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
		{&bins.cocoonCRI, "cocoon-cri", "./cmd/cocoon-cri", race},
		{&bins.cocoonCRIPlain, "cocoon-cri-plain", "./cmd/cocoon-cri", nil},
		{&bins.cocoonSim, "cocoon-sim", "./test/cocoonsim/cmd/cocoon-sim", nil},
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
	tools := map[*string]string{
		&bins.crictl: "crictl", &bins.critest: "critest", &bins.kubelet: "kubelet",
		&bins.etcd: "etcd", &bins.kubeAPIServer: "kube-apiserver", &bins.kubeControllerManager: "kube-controller-manager",
		&bins.kubeScheduler: "kube-scheduler", &bins.kubeProxy: "kube-proxy", &bins.coreDNS: "coredns", &bins.kubectl: "kubectl",
	}
	for path, name := range tools {
		tool := filepath.Join(toolDir, name)
		*path = tool
		if _, err := os.Stat(tool); err != nil {
			fmt.Fprintf(os.Stderr, "e2e: %s is missing: run make tools (make test does)\n", tool)
			return 1
		}
	}
	host := hostguard.Snapshot()
	code := m.Run()
	if err := host.Check(); err != nil {
		fmt.Fprintln(os.Stderr, "e2e:", err)
		return 1
	}
	return code
}

func repoRoot() (string, error) {
	out, err := exec.Command("go", "env", "GOMOD").Output()
	if err != nil {
		return "", fmt.Errorf("find the module root: %w", err)
	}
	return filepath.Dir(string(out[:len(out)-1])), nil
}
