package harness

import (
	"path/filepath"

	containerdtest "github.com/cocoonstack/cocoon-cri/test/containerd"

	"github.com/cocoonstack/cocoon-cri/test/testproc"
)

// NewPassthroughNode is a node with a real containerd beside cocoon-cri, as on a kubeadm node: in
// the node's namespace, with the node's CNI configuration (and IP address pool), and cocoon-cri
// handing it every pod that is not a VM pod. opts may change containerd's configuration.
func NewPassthroughNode(t testproc.TB, opts containerdtest.Options, extra ...string) (*Node, *containerdtest.Daemon) {
	t.Helper()
	n := PrepareNode(t, nil, extra...)
	opts.Dir = filepath.Join(n.Dir, "containerd")
	opts.NetNS = n.NodeNS
	opts.CNIConfDir = n.CNIConf
	opts.CNIBinDirs = []string{"/usr/lib/cni"}
	ctrd := containerdtest.Start(t, opts)
	n.Extra = append(n.Extra, "--passthrough-endpoint", ctrd.Endpoint())
	return n, ctrd
}
