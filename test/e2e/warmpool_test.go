package e2e

import (
	"encoding/json"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"

	"github.com/cocoonstack/cocoon-cri/cri/vmruntime"
	"github.com/cocoonstack/cocoon-cri/pkg/faultpoint"
	"github.com/cocoonstack/cocoon-cri/test/cocoonsim/guest"
	"github.com/cocoonstack/cocoon-cri/test/harness"
	"github.com/cocoonstack/cocoon-cri/test/stale"
	"github.com/cocoonstack/cocoon-cri/test/testimage"
)

// warmPools is what crictl info shows of the pools.
func (n *node) warmPools() []vmruntime.WarmPoolInfo {
	n.t.Helper()
	var info struct {
		Info struct {
			WarmPools []vmruntime.WarmPoolInfo `json:"warmPools"`
		} `json:"info"`
	}
	if err := json.Unmarshal([]byte(n.mustCrictl("info", "-o", "json")), &info); err != nil {
		n.t.Fatal(err)
	}
	return info.Info.WarmPools
}

// waitPoolReady waits until the first pool has ready VMs ready.
func (n *node) waitPoolReady(ready int) {
	n.t.Helper()
	for deadline := time.Now().Add(2 * time.Minute); ; time.Sleep(200 * time.Millisecond) {
		pools := n.warmPools()
		if len(pools) > 0 && pools[0].Ready == ready {
			return
		}
		if time.Now().After(deadline) {
			n.t.Fatalf("the warm pool never had %d ready: %+v", ready, pools)
		}
	}
}

// cocoonVMNames are the names of cocoon's VMs that start with prefix, sorted.
func (n *node) cocoonVMNames(prefix string) []string {
	n.t.Helper()
	out, err := n.cocoon("vm", "list", "-o", "json")
	if err != nil {
		n.t.Fatal(err)
	}
	var vms []struct {
		Config struct {
			Name string `json:"name"`
		} `json:"config"`
	}
	if err := json.Unmarshal([]byte(out), &vms); err != nil {
		n.t.Fatalf("vm list: %v: %s", err, out)
	}
	var names []string
	for _, vm := range vms {
		if strings.HasPrefix(vm.Config.Name, prefix) {
			names = append(names, vm.Config.Name)
		}
	}
	slices.Sort(names)
	return names
}

// TestWarmPoolHandsReadyVMsToPods: with --warm-pool, VMs of the image are cloned ahead; a pod of
// the image takes one at its start, with its own hostname, environment, IP (it answers HTTP there)
// and machine-id, and it hibernates and wakes as any pod; a pod whose VM would differ is cloned;
// the pool refills; a restart adopts the pool; RemoveImage drains it.
func TestWarmPoolHandsReadyVMsToPods(t *testing.T) {
	t.Parallel()
	// The pods have a cgroup parent, as a kubelet's do: a pooled VM leaves the pool's cgroup for it.
	parent := harness.CgroupParent(t)
	harness.MakeCgroup(t, parent)
	n := newNode(t, "--warm-pool", snapRef+"=2")
	n.podCgroupParent = parent
	n.ImportImage(snapRef, n.SnapshotImage("web", testimage.SnapshotOptions{Guest: guest.Spec{HTTPPort: 80}}))
	n.waitPoolReady(2)
	pool := n.cocoonVMNames("cri-pool-")
	if len(pool) != 2 {
		t.Fatalf("pool VMs in cocoon %q, want 2", pool)
	}
	if pods := n.mustCrictl("pods", "-q"); pods != "" {
		t.Fatalf("pool VMs show as pods: %q", pods)
	}

	ids := map[string]string{}
	var sleepyPod, sleepy string
	for _, name := range []string{"alpha", "beta"} {
		// beta hibernates when idle, as any pod may.
		annotations := map[string]string{}
		if name == "beta" {
			annotations[vmruntime.AnnotationHibernateAfter] = "2s"
		}
		podID, ctr, _ := n.runningPodAnnotated(name, snapRef, annotations, func(c *runtimeapi.ContainerConfig) {
			c.Envs = append(c.Envs, &runtimeapi.KeyValue{Key: "GREETING", Value: []byte("hello " + name)})
		})
		sleepyPod, sleepy = podID, ctr
		vm, _ := field(n.inspect("inspect", ctr), "info", "vm", "name").(string)
		if !slices.Contains(pool, vm) {
			t.Fatalf("pod %s runs VM %q, not one of the pool's %q", name, vm, pool)
		}
		if cgroup, pid := parent+"/"+ctr, n.vmPID(ctr); cgroupV1() && procCgroups(t, pid)["memory"] != cgroup ||
			!cgroupV1() && procCgroups(t, pid)[""] != cgroup {
			t.Errorf("pod %s's hypervisor %d is in %v, want the pod's cgroup %s", name, pid, procCgroups(t, pid), cgroup)
		}
		if left := harness.CgroupDirs("/cocoon-cri-pool/" + strings.TrimPrefix(vm, "cri-")); len(left) != 0 {
			t.Errorf("pod %s's VM left its pool cgroup behind: %v", name, left)
		}
		if out := n.mustCrictl("exec", ctr, "sh", "-c", "hostname; echo $GREETING"); out != name+"\nhello "+name {
			t.Fatalf("pod %s from the pool: %q, want its own hostname and environment", name, out)
		}
		n.httpGetUntil(fmt.Sprintf("http://%s/", n.podIP(podID)), name)
		ids[name] = n.mustCrictl("exec", ctr, "cat", "/etc/machine-id")
	}
	if ids["alpha"] == "" || ids["alpha"] == ids["beta"] {
		t.Fatalf("machine-ids %q: each pooled pod has its own", ids)
	}

	// A pooled VM hibernates and wakes on traffic with the pod's identity: its NIC's placeholder
	// MAC in cocoon's records does not come back.
	n.waitHibernated(sleepy)
	n.httpGetUntil(fmt.Sprintf("http://%s/", n.podIP(sleepyPod)), "beta")
	if out := n.mustCrictl("exec", sleepy, "hostname"); out != "beta" {
		t.Fatalf("the woken pooled pod: hostname %q", out)
	}

	// A pod whose VM would differ from the pool's (no direct I/O) is cloned: a miss.
	_, odd, _ := n.runningPodAnnotated("odd", snapRef, map[string]string{vmruntime.AnnotationNoDirectIO: "true"}, func(*runtimeapi.ContainerConfig) {})
	if vm, _ := field(n.inspect("inspect", odd), "info", "vm", "name").(string); strings.HasPrefix(vm, "cri-pool-") {
		t.Fatalf("a pod that does not fit the pool took pool VM %s", vm)
	}

	// The pool refills; a restart adopts its VMs rather than cloning new ones.
	n.waitPoolReady(2)
	refilled := slices.DeleteFunc(n.cocoonVMNames("cri-pool-"), func(name string) bool { return slices.Contains(pool, name) })
	n.Restart()
	n.waitPoolReady(2)
	after := slices.DeleteFunc(n.cocoonVMNames("cri-pool-"), func(name string) bool { return slices.Contains(pool, name) })
	if !slices.Equal(after, refilled) {
		t.Fatalf("pool VMs after a restart %q, want the adopted %q", after, refilled)
	}

	// RemoveImage drains the pool; the pods' VMs stay.
	n.mustCrictl("rmi", snapRef)
	if left := n.cocoonVMNames("cri-pool-"); !slices.Equal(left, pool) {
		t.Fatalf("VMs after RemoveImage %q, want only the pods' %q", left, pool)
	}
	if pools := n.warmPools(); pools[0].Ready != 0 || !strings.Contains(pools[0].Reason, "not on the node") {
		t.Fatalf("the pool without its image: %+v", pools)
	}
}

// poolHoldings is what the node holds for its pool VMs (their namespaces, the VMs' namespaces and
// cocoon configurations), which a pod's life may leave.
func (n *node) poolHoldings() map[string]bool {
	n.t.Helper()
	claimed := map[string]bool{}
	for _, id := range strings.Fields(n.mustCrictl("ps", "-a", "-q")) {
		name, _ := field(n.inspect("inspect", id), "info", "vm", "name").(string)
		claimed[name] = true
	}
	held := map[string]bool{}
	for _, vm := range n.vms() {
		if name := vm.Config.Name; isPoolVM(name) && !claimed[name] {
			netID := "pool" + strings.TrimPrefix(name, "cri-pool-")
			held["cocoon-cri-"+netID], held["cocoon-"+vm.ID], held["cocoon network config "+netID] = true, true, true
			held["vm "+name] = true
		}
	}
	return held
}

// isPoolVM says whether a VM's name is one cocoon-cri gives the pools' VMs.
func isPoolVM(name string) bool { return strings.HasPrefix(name, "cri-pool-") }

// checkOnlyPoolLeft checks that nothing but the pool's own VMs and their network is on the node.
func (n *node) checkOnlyPoolLeft(when string) {
	n.t.Helper()
	held := n.poolHoldings()
	for _, vm := range n.vms() {
		if !held["vm "+vm.Config.Name] {
			n.t.Fatalf("%s: VM %s (%s) is neither a pool's nor a container's", when, vm.Config.Name, vm.State)
		}
	}
	for _, item := range n.leftovers() {
		if !held[item] {
			n.t.Fatalf("%s: left behind: %s (the pool holds %v)", when, item, held)
		}
	}
}

// TestCrashInAWarmPoolHandOver kills cocoon-cri with SIGKILL in a pool's fill and at every named
// point of a hand-over; after the restart the kubelet starts the container again, and it runs with
// the pod's identity; the pod's removal leaves nothing but the pool; a restart without the pool
// leaves nothing at all.
func TestCrashInAWarmPoolHandOver(t *testing.T) {
	t.Parallel()
	n := newNodeWithEnv(t, []string{faultpoint.EnvVar + "=cocoon vm clone/after"}, "--warm-pool", snapRef+"=1")
	n.withSnapshot() // the pool fills, and its clone is the daemon's first
	if !n.Died(time.Minute) {
		t.Fatal("cocoon-cri did not die after the pool's clone")
	}
	n.Env = nil
	n.Start()
	n.waitPoolReady(1)
	n.checkOnlyPoolLeft("after a crash in the pool's fill")

	n.Bin = bins.CocoonCRIPlain
	for i, point := range []string{faultpoint.HandOverClaimed, faultpoint.HandOverTaken, "placeholder set aside",
		"pod interface handed over", faultpoint.HandOverGuestSetUp} {
		name := fmt.Sprintf("handover-%d", i)
		n.Stop()
		n.Env = []string{faultpoint.EnvVar + "=" + point}
		n.Start()
		n.waitPoolReady(1)
		pod := n.podConfig(name, "uid-"+name)
		podFile := n.configFile(name+"-pod.json", pod)
		podID := n.mustCrictl("runp", "--runtime", "cocoon", podFile)
		ctr := n.mustCrictl("create", "--no-pull", podID, n.configFile(name+"-ctr.json", containerConfig("app", snapRef)), podFile)
		if _, err := n.crictl("start", ctr); err == nil || !n.Died(5*time.Second) {
			t.Fatalf("%s: the start did not die there: %v", point, err)
		}
		n.Env = nil
		n.Start()
		if state := field(n.inspect("inspect", ctr), "status", "state"); state == "CONTAINER_CREATED" {
			n.mustCrictl("start", ctr)
		}
		if out := n.mustCrictl("exec", ctr, "hostname"); out != name {
			t.Fatalf("%s: the container runs with hostname %q, want its pod's", point, out)
		}
		// A pool VM no container took is the pool's, also one its refill began after the listing.
		n.checkConsistentBeside(point, isPoolVM)
		n.mustCrictl("stopp", podID)
		n.mustCrictl("rmp", podID)
		n.checkOnlyPoolLeft(point)
	}

	n.Extra = nil
	n.Restart()
	if vms := n.vms(); len(vms) != 0 {
		t.Fatalf("VMs left after a restart without the pool: %+v", vms)
	}
	if left := n.leftovers(); len(left) != 0 {
		t.Fatalf("left behind after a restart without the pool: %v", left)
	}
	// The primed shells of the daemons killed above end once their input closes with the daemon.
	for deadline := time.Now().Add(time.Minute); ; time.Sleep(200 * time.Millisecond) {
		execs := stale.ProcessesWhose(func(cmdline string) bool {
			return strings.Contains(cmdline, n.RootDir) && strings.Contains(cmdline, "vm\x00exec")
		})
		if len(execs) == 0 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("cocoon vm exec processes %v outlived the daemons that started them", execs)
		}
	}
}
