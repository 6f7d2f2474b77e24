package harness

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/cocoonstack/cocoon-cri/test/cocoonsim/guest"
	containerdtest "github.com/cocoonstack/cocoon-cri/test/containerd"
	"github.com/cocoonstack/cocoon-cri/test/testimage"
	"github.com/cocoonstack/cocoon-cri/test/testproc"
)

// The images every node of a cluster has: two VM images, and busybox for ordinary pods.
const (
	ClusterWebImage     = "cocoon.local/agent-sandbox:v1"
	ClusterCrashImage   = "cocoon.local/crashing:v1"
	ClusterBusyboxImage = "cocoon.local/busybox:v1"
)

// ClusterPoolSize is the warm pool of ClusterWebImage every cluster keeps (docs/warm-pool.md).
const ClusterPoolSize = 5

// UpCluster brings a cluster of count nodes up (1 to MaxClusterNodes): on each, cocoon-cri on the
// simulator with containerd beside it through passthrough, a kubelet and kube-proxy; the control
// plane and a registry beside them. Every node has the cluster's images; the first keeps a warm
// pool of ClusterWebImage. Everything stops and goes when t ends.
func UpCluster(t testproc.TB, count int) *Cluster {
	t.Helper()
	if count < 1 || count > MaxClusterNodes {
		t.Fatalf("a cluster of %d nodes: want 1 to %d", count, MaxClusterNodes)
	}
	nodes := make([]*clusterNode, count)
	for i := range nodes {
		cn := &clusterNode{index: i, name: NodeName(i), cgroupRoot: CgroupParent(t)} // removed after the node, registered before it
		MakeCgroup(t, cn.cgroupRoot)
		extra := []string{"--registry-insecure", ClusterRegistry}
		if i == 0 {
			// The first node keeps a warm pool of the web image (docs/warm-pool.md); the others
			// clone, and leave the two cores to the pods.
			extra = append(extra, "--warm-pool", fmt.Sprintf("%s=%d", ClusterWebImage, ClusterPoolSize))
		}
		cn.n, cn.containerd = NewPassthroughNode(t, containerdtest.Options{PlainHTTPRegistries: []string{ClusterRegistry}}, extra...)
		cn.n.WriteNetworkConfig(PodNetwork(i))
		cn.n.Start()
		nodes[i] = cn
	}
	c := startCluster(nodes)
	for _, cn := range nodes {
		cn.containerd.Tag(containerdtest.BusyboxImage, ClusterBusyboxImage)
		cn.n.ImportImage(ClusterWebImage, cn.n.SnapshotImage("web", testimage.SnapshotOptions{Guest: guest.Spec{Busybox: true, HTTPPort: 80}}))
		cn.n.ImportImage(ClusterCrashImage, cn.n.SnapshotImage("crash", testimage.SnapshotOptions{Guest: guest.Spec{CrashAfter: guest.Duration(10 * time.Second)}}))
	}
	return c
}

// WriteFiles writes what hack/cluster.sh and its users read into dir: the administrator's
// kubeconfig; node, node-2 … (where each node keeps its files, as key=value lines); and, last,
// env (the exports for kubectl, crictl and the registry), which hack/cluster.sh up waits for.
func (c *Cluster) WriteFiles(dir string) error {
	data, err := os.ReadFile(c.kubeconfig)
	if err != nil {
		return err
	}
	kubeconfig := filepath.Join(dir, "kubeconfig")
	if err := writeFileAtomic(kubeconfig, data); err != nil {
		return err
	}
	for i, cn := range c.nodes {
		n := cn.n
		file := "node"
		if i > 0 {
			file = fmt.Sprintf("node-%d", i+1)
		}
		if err := writeFileAtomic(filepath.Join(dir, file), []byte(strings.Join([]string{
			"name=" + cn.name, "socket=" + n.Socket, "log=" + n.LogFile, "state=" + n.StateDir, "netns=" + n.NetnsDir, "ipam=" + n.IPAMDir,
			"node-netns=" + n.NodeNS, "cocoon-root=" + n.RootDir, "cocoon-run=" + n.RunDir, "cocoon-log=" + n.LogDir,
			"containerd=" + cn.containerd.Endpoint(), "control-plane=" + c.dir, "cgroup-root=" + cn.cgroupRoot,
			"kubelet-root=" + filepath.Join(cn.kubelet.Dir, "root"),
		}, "\n")+"\n")); err != nil {
			return err
		}
	}
	return writeFileAtomic(filepath.Join(dir, "env"), fmt.Appendf(nil,
		"export KUBECONFIG=%s\nexport CONTAINER_RUNTIME_ENDPOINT=unix://%s\nexport COCOON_REGISTRY=%s\n", kubeconfig, c.nodes[0].n.Socket, ClusterRegistry))
}

// writeFileAtomic writes path whole or not at all: a reader polling for it never sees it half
// written.
func writeFileAtomic(path string, data []byte) error {
	if err := os.WriteFile(path+".tmp", data, 0o600); err != nil {
		return err
	}
	return os.Rename(path+".tmp", path)
}
