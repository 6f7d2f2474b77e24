package e2e

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"

	"github.com/cocoonstack/cocoon-cri/test/cocoonsim"
	"github.com/cocoonstack/cocoon-cri/test/harness"
)

// statsJSON runs crictl stats or statsp with -o json and returns the "stats" list.
func (n *node) statsJSON(args ...string) []map[string]any {
	n.t.Helper()
	var out struct {
		Stats []map[string]any `json:"stats"`
	}
	full := append([]string{args[0], "-o", "json"}, args[1:]...)
	if err := json.Unmarshal([]byte(n.mustCrictl(full...)), &out); err != nil {
		n.t.Fatal(err)
	}
	return out.Stats
}

// u64 reads a UInt64Value ({"value": "123"}: protojson writes 64-bit integers as strings).
func u64(m map[string]any, keys ...string) uint64 {
	switch v := field(m, append(keys, "value")...).(type) {
	case string:
		n, _ := strconv.ParseUint(v, 10, 64)
		return n
	case float64:
		return uint64(v)
	}
	return 0
}

// waitStats polls crictl until ok accepts the one stats entry it lists: the hypervisor's usage
// grows as the guest runs, and a CPU rate needs two samples some time apart.
func (n *node) waitStats(ok func(map[string]any) bool, args ...string) map[string]any {
	n.t.Helper()
	deadline := time.Now().Add(60 * time.Second)
	var last []map[string]any
	for {
		last = n.statsJSON(args...)
		if len(last) == 1 && ok(last[0]) {
			return last[0]
		}
		if time.Now().After(deadline) {
			n.t.Fatalf("crictl %s never showed what the test waits for; last answer: %v", strings.Join(args, " "), last)
		}
		time.Sleep(time.Second)
	}
}

// vmStatus reads a process's memory as the kernel reports it, in bytes.
func vmStatus(t *testing.T, pid int, key string) uint64 {
	t.Helper()
	data, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		t.Fatal(err)
	}
	for _, line := range strings.Split(string(data), "\n") {
		if v, ok := strings.CutPrefix(line, key+":"); ok {
			kb, err := strconv.ParseUint(strings.TrimSuffix(strings.TrimSpace(v), " kB"), 10, 64)
			if err != nil {
				t.Fatal(err)
			}
			return kb << 10
		}
	}
	t.Fatalf("/proc/%d/status has no %s", pid, key)
	return 0
}

// TestStatsShowTheVMsUsage: crictl stats and statsp show the hypervisor's CPU and memory (the
// simulated guest burns a little CPU and touches its RAM inside the hypervisor process, as a real
// one does), the pod interface's traffic and the VM's writable disk; a stopped container and a
// killed hypervisor read as zero usage without failing the list.
func TestStatsShowTheVMsUsage(t *testing.T) {
	t.Parallel()
	n := newNode(t)
	n.withReachableImage()
	podID, ctrID, _ := n.runningPod("meter", cloudRef)
	pid := n.vmPID(ctrID)

	// Traffic through the pod interface: the node talks to the guest at the pod IP.
	addr := fmt.Sprintf("%s:%d", n.podIP(podID), guestPort)
	for range 3 {
		n.dialFromNode(addr)
	}

	st := n.waitStats(func(s map[string]any) bool {
		return u64(s, "cpu", "usageNanoCores") > 0 && u64(s, "memory", "workingSetBytes") >= 4<<20
	}, "stats", "--id", ctrID)
	t.Logf("crictl stats: cpu %v memory %v writable layer %v", st["cpu"], st["memory"], st["writableLayer"])
	if field(st, "attributes", "id") != ctrID || field(st, "attributes", "metadata", "name") != "app" ||
		field(st, "attributes", "labels", "tier") != "vm" {
		t.Fatalf("attributes: %v", st["attributes"])
	}
	if u64(st, "cpu", "usageCoreNanoSeconds") == 0 {
		t.Fatalf("cumulative CPU is zero: %v", st["cpu"])
	}
	ws, rss, usage := u64(st, "memory", "workingSetBytes"), u64(st, "memory", "rssBytes"), u64(st, "memory", "usageBytes")
	if rss == 0 || rss > usage || ws > usage {
		t.Fatalf("memory: working set %d, rss %d, usage %d", ws, rss, usage)
	}
	// The hypervisor's resident memory as the kernel reports it: the guest's RAM is in it.
	if kernelRSS := vmStatus(t, pid, "VmRSS"); kernelRSS < 4<<20 {
		t.Fatalf("the hypervisor holds %d bytes; the simulated guest should have touched more", kernelRSS)
	}
	for _, key := range []string{"cpu", "memory", "writableLayer"} {
		if ts, _ := field(st, key, "timestamp").(string); ts == "" || ts == "0" {
			t.Fatalf("%s has no timestamp: %v", key, st[key])
		}
	}
	// The writable layer is the VM's copy-on-write disk, on cocoon's run dir.
	if u64(st, "writableLayer", "usedBytes") == 0 || u64(st, "writableLayer", "inodesUsed") != 1 ||
		field(st, "writableLayer", "fsId", "mountpoint") != n.RunDir {
		t.Fatalf("writable layer: %v", st["writableLayer"])
	}

	// The pod: the VM's usage, and the pod interface's traffic (the hypervisor runs in the
	// namespace that holds it).
	sp := n.waitStats(func(s map[string]any) bool {
		return u64(s, "linux", "cpu", "usageNanoCores") > 0
	}, "statsp", "--id", podID)
	t.Logf("crictl statsp: %v", sp["linux"])
	if field(sp, "attributes", "id") != podID || field(sp, "attributes", "metadata", "name") != "meter" {
		t.Fatalf("pod attributes: %v", sp["attributes"])
	}
	if u64(sp, "linux", "cpu", "usageCoreNanoSeconds") == 0 || u64(sp, "linux", "memory", "workingSetBytes") < 4<<20 ||
		u64(sp, "linux", "process", "processCount") != 1 {
		t.Fatalf("pod usage: %v", sp["linux"])
	}
	if field(sp, "linux", "network", "defaultInterface", "name") != "eth0" ||
		u64(sp, "linux", "network", "defaultInterface", "rxBytes") == 0 || u64(sp, "linux", "network", "defaultInterface", "txBytes") == 0 {
		t.Fatalf("pod network: %v", field(sp, "linux", "network"))
	}
	if containers, _ := field(sp, "linux", "containers").([]any); len(containers) != 1 {
		t.Fatalf("pod containers: %v", field(sp, "linux", "containers"))
	}
	// Filters: a prefix of the ID, the pod, labels.
	if got := n.statsJSON("stats", "--id", ctrID[:12], "--pod", podID, "--label", "tier=vm"); len(got) != 1 {
		t.Fatalf("filtered stats: %v", got)
	}
	if got := n.statsJSON("stats", "-a", "--label", "tier=none"); len(got) != 0 {
		t.Fatalf("stats for a label nobody has: %v", got)
	}
	if got := n.statsJSON("statsp", "--label", "app=meter"); len(got) != 1 {
		t.Fatalf("statsp by label: %v", got)
	}

	// Stopped: listed with zero usage; its disk is still there until the VM is removed.
	n.mustCrictl("stop", ctrID)
	stopped := n.statsJSON("stats", "-a", "--id", ctrID)
	if len(stopped) != 1 || u64(stopped[0], "cpu", "usageCoreNanoSeconds") != 0 || u64(stopped[0], "memory", "workingSetBytes") != 0 ||
		u64(stopped[0], "writableLayer", "usedBytes") == 0 {
		t.Fatalf("stats of a stopped container: %v", stopped)
	}
	// With no VM, the pod interface is read in the pod's own namespace.
	sp = n.statsJSON("statsp", "--id", podID)[0]
	if u64(sp, "linux", "memory", "workingSetBytes") != 0 || u64(sp, "linux", "network", "defaultInterface", "rxBytes") == 0 {
		t.Fatalf("pod stats with no VM running: %v", sp["linux"])
	}

	// A hypervisor killed behind cocoon-cri's back does not fail the lists.
	_, ctr2, _ := n.runningPodIn(podID, "app2")
	if err := syscall.Kill(n.vmPID(ctr2), syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	for range 3 {
		n.mustCrictl("stats", "-a", "-o", "json")
		n.mustCrictl("statsp", "-o", "json")
	}
}

// runningPodIn starts one more container in a pod made by runningPod.
func (n *node) runningPodIn(podID, name string) (string, string, string) {
	n.t.Helper()
	podFile := filepath.Join(n.Dir, "meter-pod.json")
	ctrID := n.mustCrictl("create", "--no-pull", podID, n.configFile(name+"-ctr.json", containerConfig(name, cloudRef)), podFile)
	n.mustCrictl("start", ctrID)
	return podID, ctrID, podFile
}

// procCgroups reads /proc/<pid>/cgroup: the cgroup per controller (v1) or "" (v2).
func procCgroups(t *testing.T, pid int) map[string]string {
	t.Helper()
	data, err := os.ReadFile(fmt.Sprintf("/proc/%d/cgroup", pid))
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]string{}
	for _, line := range strings.Split(strings.TrimSpace(string(data)), "\n") {
		parts := strings.SplitN(line, ":", 3)
		if len(parts) != 3 {
			continue
		}
		for _, c := range strings.Split(parts[1], ",") {
			out[c] = parts[2]
		}
	}
	return out
}

// cgroupProcs reads a cgroup's cgroup.procs in the hierarchy mounted at /sys/fs/cgroup/<hier>.
func cgroupProcs(t *testing.T, hier, cgroup string) []int {
	t.Helper()
	data, err := os.ReadFile(filepath.Join("/sys/fs/cgroup", hier, cgroup, "cgroup.procs"))
	if err != nil {
		t.Fatal(err)
	}
	var pids []int
	for _, f := range strings.Fields(string(data)) {
		pid, err := strconv.Atoi(f)
		if err != nil {
			t.Fatal(err)
		}
		pids = append(pids, pid)
	}
	return pids
}

// cgroupV1 reports a host with v1 hierarchies (this machine: hybrid).
func cgroupV1() bool {
	_, err := os.Stat("/sys/fs/cgroup/memory/cgroup.procs")
	return err == nil
}

// TestCgroupParentHoldsTheHypervisor: a pod with a cgroup parent gets its VM's hypervisor (and
// the processes it started) into <parent>/<container ID> in the memory and cpu hierarchies, so
// the pod's limits and the kubelet's accounting cover the VM; nothing is left after removal,
// neither the container's cgroup nor a parent cocoon-cri had to make.
func TestCgroupParentHoldsTheHypervisor(t *testing.T) {
	t.Parallel()
	parent := harness.CgroupParent(t)
	n := newNode(t)
	n.withSnapshot()
	pod := n.podConfig("fenced", "uid-fenced")
	pod.Linux.CgroupParent = parent + "/pod-fenced"
	podFile := n.configFile("fenced-pod.json", pod)
	podID := n.mustCrictl("runp", "--runtime", "cocoon", podFile)
	ctrID := n.mustCrictl("create", "--no-pull", podID, n.configFile("fenced-ctr.json", containerConfig("app", snapRef)), podFile)
	n.mustCrictl("start", ctrID)

	cgroup := parent + "/pod-fenced/" + ctrID
	pid := n.vmPID(ctrID)
	guestOS, err := cocoonsim.GuestOSPID(pid)
	if err != nil {
		t.Fatal(err)
	}
	if got := field(n.inspect("inspect", ctrID), "info", "vm", "cgroup"); got != cgroup {
		t.Fatalf("recorded cgroup %v, want %s", got, cgroup)
	}
	for _, p := range []int{pid, guestOS} {
		cgs := procCgroups(t, p)
		for _, c := range []string{"memory", "cpu", "cpuacct", "pids"} {
			if cgroupV1() && cgs[c] != cgroup {
				t.Errorf("process %d is in %s cgroup %q, want %s", p, c, cgs[c], cgroup)
			}
		}
		if !cgroupV1() && cgs[""] != cgroup {
			t.Errorf("process %d is in cgroup %q, want %s", p, cgs[""], cgroup)
		}
	}
	if cgroupV1() {
		for _, hier := range []string{"memory", "cpu"} {
			if procs := cgroupProcs(t, hier, cgroup); !slices.Contains(procs, pid) || !slices.Contains(procs, guestOS) {
				t.Errorf("%s cgroup.procs of %s: %v, want the hypervisor %d and its guest %d", hier, cgroup, procs, pid, guestOS)
			}
		}
	}

	// The VM's cgroup goes as the VM stops; a parent cocoon-cri made goes with the container.
	n.mustCrictl("stop", ctrID)
	deadline := time.Now().Add(30 * time.Second)
	for left := harness.CgroupDirs(cgroup); len(left) != 0; left = harness.CgroupDirs(cgroup) {
		if time.Now().After(deadline) {
			t.Fatalf("the container's cgroup is left 30 s after stop: %v", left)
		}
		time.Sleep(100 * time.Millisecond)
	}
	n.mustCrictl("rm", ctrID)
	n.mustCrictl("stopp", podID)
	n.mustCrictl("rmp", podID)
	if left := harness.CgroupDirs(parent); len(left) != 0 {
		t.Fatalf("cgroups left after the pod was removed: %v", left)
	}

	// A systemd-style parent means a kubelet on the other cgroup driver: refused up front.
	pod = n.podConfig("slice", "uid-slice")
	pod.Linux.CgroupParent = "kubepods-besteffort.slice:cri-containerd:x"
	n.crictlFails("InvalidArgument", "runp", "--runtime", "cocoon", n.configFile("slice-pod.json", pod))

	// A VM that cannot be put in its pod's cgroup does not run outside it: the start fails and
	// the VM is removed. (A cgroup cannot be made under a file.)
	pod = n.podConfig("unfenced", "uid-unfenced")
	pod.Linux.CgroupParent = "/cgroup.procs"
	podFile = n.configFile("unfenced-pod.json", pod)
	podID = n.mustCrictl("runp", "--runtime", "cocoon", podFile)
	ctrID = n.mustCrictl("create", "--no-pull", podID, n.configFile("unfenced-ctr.json", containerConfig("app", snapRef)), podFile)
	if msg := n.crictlFails("Internal", "start", ctrID); !strings.Contains(msg, "pod's cgroup") {
		t.Fatalf("start error: %s", msg)
	}
	if st := n.inspect("inspect", ctrID); field(st, "status", "state") != "CONTAINER_EXITED" || field(st, "status", "reason") != "StartError" {
		t.Fatalf("after a start that could not place the VM: %v", st["status"])
	}
	if vms := n.vms(); len(vms) != 0 {
		t.Fatalf("VMs left after the failed start: %+v", vms)
	}
}

// TestCgroupParentTheKubeletMadeStays: under a pod cgroup that exists (the kubelet makes it
// before RunPodSandbox), removing the container removes only the container's cgroup.
func TestCgroupParentTheKubeletMadeStays(t *testing.T) {
	t.Parallel()
	if !cgroupV1() {
		t.Skip("the test makes the parent in v1 hierarchies")
	}
	parent := harness.CgroupParent(t)
	hiers := makePodCgroup(t, parent)
	n := newNode(t)
	n.withSnapshot()
	pod := n.podConfig("kubelet", "uid-kubelet")
	pod.Linux.CgroupParent = parent
	podFile := n.configFile("kubelet-pod.json", pod)
	podID := n.mustCrictl("runp", "--runtime", "cocoon", podFile)
	ctrID := n.mustCrictl("create", "--no-pull", podID, n.configFile("kubelet-ctr.json", containerConfig("app", snapRef)), podFile)
	n.mustCrictl("start", ctrID)
	if procs := cgroupProcs(t, "memory", parent+"/"+ctrID); !slices.Contains(procs, n.vmPID(ctrID)) {
		t.Fatalf("memory cgroup.procs: %v", procs)
	}
	n.mustCrictl("rmp", "--force", podID)
	if left := harness.CgroupDirs(parent + "/" + ctrID); len(left) != 0 {
		t.Fatalf("the container's cgroup is left: %v", left)
	}
	for _, hier := range hiers {
		if _, err := os.Stat(filepath.Join("/sys/fs/cgroup", hier, parent)); err != nil {
			t.Errorf("the kubelet's pod cgroup in %s went: %v", hier, err)
		}
	}
}

// makePodCgroup makes cgroup in every v1 hierarchy, as the kubelet's cgroupfs driver makes a pod's
// cgroup (a new cpuset gets its parent's CPUs and memory nodes, without which nothing can join
// it), and returns the hierarchies.
func makePodCgroup(t *testing.T, cgroup string) []string {
	t.Helper()
	var hiers []string
	entries, _ := os.ReadDir("/sys/fs/cgroup")
	for _, e := range entries {
		root := filepath.Join("/sys/fs/cgroup", e.Name())
		if _, err := os.Stat(filepath.Join(root, "cgroup.procs")); err != nil || e.Name() == "unified" {
			continue
		}
		if err := os.Mkdir(filepath.Join(root, cgroup), 0o755); err != nil {
			t.Fatal(err)
		}
		if e.Name() == "cpuset" {
			for _, f := range []string{"cpuset.cpus", "cpuset.mems"} {
				v, err := os.ReadFile(filepath.Join(root, f))
				if err != nil {
					t.Fatal(err)
				}
				if err := os.WriteFile(filepath.Join(root, cgroup, f), v, 0o644); err != nil {
					t.Fatal(err)
				}
			}
		}
		hiers = append(hiers, e.Name())
	}
	return hiers
}

// TestVMTakesTheContainersOOMScore: the hypervisor runs with the container's OOM score, as a
// container's processes would, so the node's kernel ranks VMs by the kubelet's QoS classes too.
func TestVMTakesTheContainersOOMScore(t *testing.T) {
	t.Parallel()
	n := newNode(t)
	n.withSnapshot()
	_, ctrID, _ := n.runningPodWith("oom", snapRef, func(c *runtimeapi.ContainerConfig) { c.Linux.Resources.OomScoreAdj = 777 })
	score, err := os.ReadFile(fmt.Sprintf("/proc/%d/oom_score_adj", n.vmPID(ctrID)))
	if err != nil || strings.TrimSpace(string(score)) != "777" {
		t.Fatalf("the hypervisor's oom_score_adj: %q, %v", score, err)
	}
}
