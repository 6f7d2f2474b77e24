// Package harness runs what the end-to-end tests and hack/cluster.sh stand on: a node (cocoon-cri
// on the cocoon simulator, in a network namespace of its own, optionally with containerd beside
// it), a kubelet driving it, and a cluster of such nodes with a control plane, cluster DNS and a
// registry. Every process is stopped by PID, and every namespace, mount and file removed, when the
// test (or the program, test/cmd/cocoon-cluster) that started it ends.
package harness

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
)

// Binaries are the executables a node and a cluster run.
type Binaries struct {
	CocoonCRI, CocoonSim, Crictl, Critest, Kubelet string
	// CocoonCRIPlain is the daemon without the race detector, for the crash-safety test: its
	// hundreds of restarts are CPU-bound, and the race build costs a third more there.
	CocoonCRIPlain string
	// The control plane of a cluster.
	Etcd, KubeAPIServer, KubeControllerManager, KubeScheduler, KubeProxy, CoreDNS, Kubectl string
}

// Bins are the executables of this process's nodes and clusters, set once before the first starts.
var Bins Binaries

// FindTools sets the tools' paths in Bins (crictl, critest, the kubelet and the control plane) to
// those in dir, where make tools puts them, and fails if one is missing.
func FindTools(dir string) error {
	tools := map[*string]string{
		&Bins.Crictl: "crictl", &Bins.Critest: "critest", &Bins.Kubelet: "kubelet",
		&Bins.Etcd: "etcd", &Bins.KubeAPIServer: "kube-apiserver", &Bins.KubeControllerManager: "kube-controller-manager",
		&Bins.KubeScheduler: "kube-scheduler", &Bins.KubeProxy: "kube-proxy", &Bins.CoreDNS: "coredns", &Bins.Kubectl: "kubectl",
	}
	for path, name := range tools {
		tool := filepath.Join(dir, name)
		if _, err := os.Stat(tool); err != nil {
			return fmt.Errorf("%s is missing: run make tools (make test does)", tool)
		}
		*path = tool
	}
	return nil
}

// RepoRoot is the module's directory, found from the working directory.
func RepoRoot() (string, error) {
	out, err := exec.Command("go", "env", "GOMOD").Output()
	if err != nil {
		return "", fmt.Errorf("find the module root: %w", err)
	}
	return filepath.Dir(string(out[:len(out)-1])), nil
}
