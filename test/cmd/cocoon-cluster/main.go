// Command cocoon-cluster serves a Kubernetes of one to three nodes on this machine, built from the
// end-to-end tests' harness (test/harness): on every node cocoon-cri on the cocoon simulator with
// containerd beside it, a kubelet and kube-proxy; the control plane, CoreDNS and a registry beside
// them. hack/cluster.sh up runs it in the background and hack/cluster.sh down stops it; it needs
// root (network namespaces, mounts, cgroups).
//
// It writes <dir>/env (the exports for kubectl, crictl and the registry) and <dir>/node,
// <dir>/node-2 … (where each node keeps its files) once everything is up, and serves until SIGTERM
// or SIGINT. Then it stops every process it started, by PID, and removes every namespace, mount,
// cgroup and file, as the tests do when they end; a failure on the way up undoes the same. Before
// it starts, it removes what killed runs left (harness.SweepStale).
package main

import (
	"flag"
	"fmt"
	"os"
	"os/signal"
	"path/filepath"
	"syscall"

	"github.com/cocoonstack/cocoon-cri/test/harness"
)

func main() {
	self, err := os.Executable()
	if err != nil {
		fmt.Fprintln(os.Stderr, "cocoon-cluster:", err)
		os.Exit(1)
	}
	beside := filepath.Dir(self)
	dir := flag.String("dir", "", "the directory to write the cluster's env and node files to (required; it must exist)")
	nodes := flag.Int("nodes", 1, fmt.Sprintf("how many nodes (1 to %d)", harness.MaxClusterNodes))
	cocoonCRI := flag.String("cocoon-cri", filepath.Join(beside, "cocoon-cri"), "the cocoon-cri executable")
	cocoonSim := flag.String("cocoon-sim", filepath.Join(beside, "cocoon-sim"), "the cocoon simulator's executable")
	tools := flag.String("tools", envOr("COCOON_CRI_BIN", beside), "where make tools put the kubelet, the control plane, crictl and kubectl ($COCOON_CRI_BIN)")
	flag.Parse()
	if err := check(*dir, *nodes, flag.Args()); err != nil {
		fmt.Fprintln(os.Stderr, "cocoon-cluster:", err)
		flag.Usage()
		os.Exit(2)
	}
	harness.Bins.CocoonCRI, harness.Bins.CocoonSim = *cocoonCRI, *cocoonSim
	for _, bin := range []string{*cocoonCRI, *cocoonSim} {
		if _, err := os.Stat(bin); err != nil {
			fmt.Fprintf(os.Stderr, "cocoon-cluster: %v (make build makes it)\n", err)
			os.Exit(1)
		}
	}
	if err := harness.FindTools(*tools); err != nil {
		fmt.Fprintln(os.Stderr, "cocoon-cluster:", err)
		os.Exit(1)
	}
	// Caught from the start: a signal on the way up stops the cluster once it is up, through the
	// same cleanups, instead of killing the program with everything left behind.
	stop := make(chan os.Signal, 1)
	signal.Notify(stop, syscall.SIGTERM, os.Interrupt)
	r := newRunner(os.Stderr)
	os.Exit(r.run(func() {
		// A cluster killed before its cleanups (kill -9, a test run cut short) left its nodes and
		// the host link this one needs.
		swept, err := harness.SweepStale(os.TempDir())
		if len(swept) > 0 {
			r.Logf("removed what killed runs left: %v", swept)
		}
		if err != nil {
			r.Fatal(err)
		}
		c := harness.UpCluster(r, *nodes)
		if err := c.WriteFiles(*dir); err != nil {
			r.Fatal(err)
		}
		r.Logf("the cluster is up")
		sig := <-stop
		r.Logf("%s: stopping the cluster", sig)
	}))
}

func check(dir string, nodes int, args []string) error {
	switch {
	case len(args) > 0:
		return fmt.Errorf("unexpected arguments %q", args)
	case dir == "":
		return fmt.Errorf("--dir is required")
	case nodes < 1 || nodes > harness.MaxClusterNodes:
		return fmt.Errorf("--nodes %d: a cluster has 1 to %d nodes", nodes, harness.MaxClusterNodes)
	}
	if info, err := os.Stat(dir); err != nil || !info.IsDir() {
		return fmt.Errorf("--dir %s: not a directory", dir)
	}
	return nil
}

func envOr(key, fallback string) string {
	if v := os.Getenv(key); v != "" {
		return v
	}
	return fallback
}
