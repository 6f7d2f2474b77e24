package vmruntime

import (
	"context"
	"encoding/json"
	"errors"
	"io"
	"maps"
	"slices"
	"strings"
	"sync"
	"testing"

	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"

	"github.com/cocoonstack/cocoon-cri/pkg/cocoon"
	"github.com/cocoonstack/cocoon-cri/pkg/store"
)

// poolNode is a v0.5 node with a warm pool of size VMs of the app snapshot, not yet filled, whose
// guests answer as poolGuest.
func poolNode(t *testing.T, size int) (*fakeNode, *fakeObserver) {
	t.Helper()
	obs := &fakeObserver{}
	n := newFakeNode(t, Config{WarmPools: map[string]int{snapshotRef: size}, Metrics: obs})
	n.cocoon.setCaps(capsV05)
	n.cocoon.setGuest(poolGuest(nil))
	n.importSnapshot(snapshotRef, appSnapshot())
	return n, obs
}

// poolGuest is a guest with one NIC, eth0, which the pool's probe finds; every command is also
// given to also, when set. A primed shell reads its script to the end of its input, as a shell
// would, and runs it.
func poolGuest(also fakeGuest) fakeGuest {
	var guest fakeGuest
	guest = func(ctx context.Context, vm cocoon.VM, argv []string, o cocoon.ExecOptions) (int, error) {
		if slices.Equal(argv, primedCommand) && o.Stdin != nil {
			script, err := readUntilDone(ctx, o.Stdin)
			if err != nil {
				return -1, err
			}
			return guest(ctx, vm, []string{"/bin/sh", "-c", script}, cocoon.ExecOptions{Stdout: o.Stdout, Stderr: o.Stderr})
		}
		if len(argv) == 3 && strings.Contains(argv[2], "/sys/class/net") && !strings.Contains(argv[2], "ip addr") && o.Stdout != nil {
			if _, err := o.Stdout.Write([]byte("eth0\n")); err != nil {
				return -1, err
			}
		}
		if also != nil {
			return also(ctx, vm, argv, o)
		}
		return 0, nil
	}
	return guest
}

// readUntilDone reads r to its end, unless ctx ends first (cocoon killed: the session is cut).
func readUntilDone(ctx context.Context, r io.Reader) (string, error) {
	read := make(chan string, 1)
	go func() {
		data, _ := io.ReadAll(r)
		read <- string(data)
	}()
	select {
	case data := <-read:
		return data, nil
	case <-ctx.Done():
		return "", ctx.Err()
	}
}

// poolVMs are the pool VMs cocoon has, by name.
func (n *fakeNode) poolVMs() []string {
	var out []string
	for _, name := range n.cocoon.vmNames() {
		if strings.HasPrefix(name, poolVMPrefix) {
			out = append(out, name)
		}
	}
	return out
}

func (n *fakeNode) poolInfo() []WarmPoolInfo {
	n.t.Helper()
	resp, err := n.s.Status(context.Background(), &runtimeapi.StatusRequest{Verbose: true})
	if err != nil {
		n.t.Fatal(err)
	}
	var info struct {
		WarmPools []WarmPoolInfo `json:"warmPools"`
	}
	if err := json.Unmarshal([]byte(resp.GetInfo()["info"]), &info); err != nil {
		n.t.Fatal(err)
	}
	return info.WarmPools
}

func TestWarmPoolFillsAndHandsAVMToAPod(t *testing.T) {
	n, obs := poolNode(t, 2)
	ctx := context.Background()
	var mu sync.Mutex
	var scripts []string
	n.cocoon.setGuest(poolGuest(func(_ context.Context, vm cocoon.VM, argv []string, _ cocoon.ExecOptions) (int, error) {
		mu.Lock()
		defer mu.Unlock()
		scripts = append(scripts, vm.Config.Name+": "+strings.Join(argv, " "))
		return 0, nil
	}))

	n.s.fillPools(ctx)
	pool := n.poolVMs()
	if len(pool) != 2 {
		t.Fatalf("cocoon has pool VMs %q, want 2", pool)
	}
	for _, name := range pool {
		if dir := n.cocoon.vmConfDir(name); dir != n.net.CocoonConfDir(poolNetID(name)) {
			t.Errorf("pool VM %s was cloned with --cni-conf-dir %q, want its placeholder network's", name, dir)
		}
	}
	// Each pool VM got its own machine-id once its agent answered.
	if reseeds := n.cocoon.calls("VMReseed"); len(reseeds) != 2 {
		t.Errorf("reseeds %q, want one per pool VM", reseeds)
	}
	if got := n.poolInfo(); !slices.Equal(got, []WarmPoolInfo{{Image: snapshotRef, Wanted: 2, Ready: 2}}) {
		t.Fatalf("crictl info warmPools %+v", got)
	}
	if obs.ready[snapshotRef] != 2 || obs.refills != 2 {
		t.Errorf("metrics: ready %v, refills %d", obs.ready, obs.refills)
	}
	// Pool VMs are no pod's.
	if cs, err := n.s.ListContainers(ctx, &runtimeapi.ListContainersRequest{}); err != nil || len(cs.GetContainers()) != 0 {
		t.Fatalf("ListContainers %v, %v", cs, err)
	}

	sandboxID, containerID := n.runningPod("web")
	sb, c := n.sandbox(sandboxID), n.container(containerID)
	if !slices.Contains(pool, c.VM.Name) || !c.VM.Pooled || c.State != store.ContainerRunning {
		t.Fatalf("container %+v, want one of the pool VMs %q", c.VM, pool)
	}
	// The pod names no cgroup parent, so the VM stays in its pool cgroup, now the container's.
	if want := "/cocoon-cri-pool/" + poolNetID(c.VM.Name); c.VM.Cgroup != want {
		t.Errorf("container cgroup %q, want the pool VM's %q kept", c.VM.Cgroup, want)
	}
	if got := n.net.interfaceOf(c.VM.NetNS); got != sandboxID || n.net.interfaceAt(sandboxID) != sb.NetNS || n.net.wiredTo(sandboxID) != c.VM.NetNS {
		t.Fatalf("the pool VM's namespace has %q's interface, want the pod's (which is in %q, wired to %q)",
			got, n.net.interfaceAt(sandboxID), n.net.wiredTo(sandboxID))
	}
	if clones := n.cocoon.calls("VMClone"); len(clones) != 2 {
		t.Errorf("clones %q: the pod must not clone", clones)
	}
	// The guest had the pod's identity before StartContainer returned: MAC, address, hostname.
	mu.Lock()
	setUp := slices.ContainsFunc(scripts, func(s string) bool {
		return strings.HasPrefix(s, c.VM.Name+": /bin/sh -c") && strings.Contains(s, strings.ToLower(sb.Network.MAC)) &&
			strings.Contains(s, "link set dev eth0 address "+strings.ToLower(sb.Network.MAC)) &&
			strings.Contains(s, sb.Network.IPs[0]) && strings.Contains(s, "'web' > /proc/sys/kernel/hostname")
	})
	mu.Unlock()
	if !setUp {
		t.Fatalf("no guest set-up with the pod's identity in %q", scripts)
	}
	if held := n.net.held(); slices.Contains(held, "netns "+n.net.NetNSPath(poolNetID(c.VM.Name))) {
		t.Errorf("the handed-over VM's placeholder network is left: %q", held)
	}
	if obs.handOvers != 1 || obs.misses != 0 {
		t.Errorf("metrics: hand-overs %d, misses %d", obs.handOvers, obs.misses)
	}
	if got := n.poolInfo(); got[0].Ready != 1 {
		t.Fatalf("pool after a hand-over %+v", got)
	}
	n.s.fillPools(ctx)
	if got := n.poolInfo(); got[0].Ready != 2 || len(n.st.PoolVMs.List(nil)) != 2 || len(n.poolVMs()) != 3 {
		t.Fatalf("the pool did not refill: %+v, %q", got, n.poolVMs())
	}

	// The pod goes as a cloned one does, its VM with it.
	if _, err := n.s.StopPodSandbox(ctx, &runtimeapi.StopPodSandboxRequest{PodSandboxId: sandboxID}); err != nil {
		t.Fatal(err)
	}
	if _, err := n.s.RemovePodSandbox(ctx, &runtimeapi.RemovePodSandboxRequest{PodSandboxId: sandboxID}); err != nil {
		t.Fatal(err)
	}
	if _, ok := n.cocoon.vm(c.VM.Name); ok {
		t.Fatalf("the pod's VM %s is left", c.VM.Name)
	}
	// The pod's DEL found its interface with its addresses back: it released everything.
	if held := n.net.held(); slices.ContainsFunc(held, func(h string) bool { return strings.Contains(h, sandboxID) }) {
		t.Errorf("the pod's network is left: %q", held)
	}
	if cg := n.cfg.Cgroups.(*fakeCgroups).held(); slices.Contains(cg, c.VM.Cgroup) {
		t.Errorf("the pod's cgroup %s is left: %q", c.VM.Cgroup, cg)
	}
}

// A pod that does not fit the pool's VMs, or finds none ready, is cloned and counted as a miss; a
// failed hand-over removes the pool VM and clones.
func TestWarmPoolMissesAndFallsBack(t *testing.T) {
	n, obs := poolNode(t, 1)

	// Empty pool: a miss.
	_, first := n.runningPod("first")
	if c := n.container(first); c.VM.Pooled || strings.HasPrefix(c.VM.Name, poolVMPrefix) || obs.misses != 1 {
		t.Fatalf("container %+v, misses %d", c.VM, obs.misses)
	}

	// A failed hand-over: the pool VM goes, the pod is cloned.
	n.s.fillPools(context.Background())
	pool := n.poolVMs()
	if len(pool) != 1 {
		t.Fatalf("pool VMs %q", pool)
	}
	n.net.failOnce("HandOver", errors.New("netlink: device busy"))
	sandboxID, second := n.runningPod("second")
	c := n.container(second)
	if c.VM.Pooled || !strings.HasPrefix(c.VM.Name, VMNamePrefix+second[:12]) || c.State != store.ContainerRunning {
		t.Fatalf("container after a failed hand-over %+v", c.VM)
	}
	if _, ok := n.cocoon.vm(pool[0]); ok {
		t.Fatalf("the pool VM of the failed hand-over %s is left: it must never be reused", pool[0])
	}
	if dir := n.cocoon.vmConfDir(c.VM.ID); dir != n.net.CocoonConfDir(sandboxID) {
		t.Errorf("the fallback clone used --cni-conf-dir %q", dir)
	}
	if at := n.net.servedBy(sandboxID); at != c.VM.NetNS {
		t.Errorf("after the fallback the pod interface serves %q, want the clone's %q", at, c.VM.NetNS)
	}
	if obs.fallbacks != 1 || obs.handOvers != 0 {
		t.Errorf("metrics: fallbacks %d, hand-overs %d", obs.fallbacks, obs.handOvers)
	}
	if _, err := n.st.PoolVMs.Get(pool[0]); !errors.Is(err, store.ErrNotFound) {
		t.Errorf("the failed pool VM's record: %v", err)
	}
	if held := n.net.held(); slices.Contains(held, "netns "+n.net.NetNSPath(poolNetID(pool[0]))) {
		t.Errorf("the failed pool VM's network is left: %q", held)
	}
}

// A restart adopts the pool's VMs; a restart without the pool removes them; a hand-over the
// restart cut short is undone.
func TestWarmPoolAcrossRestarts(t *testing.T) {
	n, _ := poolNode(t, 2)
	ctx := context.Background()
	n.s.fillPools(ctx)
	pool := n.poolVMs()

	n.restart()
	if err := n.s.Recover(ctx); err != nil {
		t.Fatal(err)
	}
	if got := n.poolInfo(); got[0].Ready != 2 || !slices.Equal(n.poolVMs(), pool) {
		t.Fatalf("after a restart: %+v, VMs %q, want %q adopted", got, n.poolVMs(), pool)
	}

	// A hand-over cut short: the container names the pool VM, which left its pool.
	sandboxID := n.runPod("cut")
	containerID := n.createContainer(sandboxID, "app", snapshotRef)
	original := n.container(containerID).VM.Name
	if _, err := n.st.Containers.Modify(containerID, func(r *store.Container) error {
		r.VM.Name, r.VM.Pooled = pool[0], true
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	if err := n.st.PoolVMs.Delete(pool[0]); err != nil {
		t.Fatal(err)
	}
	n.restart()
	if err := n.s.Recover(ctx); err != nil {
		t.Fatal(err)
	}
	if c := n.container(containerID); c.VM.Name != original || c.VM.Pooled {
		t.Fatalf("the cut-short hand-over's container %+v, want its own VM name %s back", c.VM, original)
	}
	if _, ok := n.cocoon.vm(pool[0]); ok {
		t.Fatalf("the pool VM of the cut-short hand-over %s is left", pool[0])
	}
	n.startContainer(containerID)
	if c := n.container(containerID); c.State != store.ContainerRunning {
		t.Fatalf("the container did not start after the undo: %+v", c)
	}

	// Without the pool configured, its VMs and their networks go; a container's stays.
	taken := n.container(containerID).VM.Name
	n.cfg.WarmPools = nil
	n.restart()
	if err := n.s.Recover(ctx); err != nil {
		t.Fatal(err)
	}
	if left := slices.DeleteFunc(n.poolVMs(), func(name string) bool { return name == taken }); len(left) != 0 {
		t.Fatalf("pool VMs left after a restart without the pool: %q", left)
	}
	if c := n.container(containerID); c.VM.Name != taken {
		t.Fatalf("the container that took a pool VM lost it at a restart without the pool: %+v", c.VM)
	}
	if recs := n.st.PoolVMs.List(nil); len(recs) != 0 {
		t.Fatalf("pool records left: %d", len(recs))
	}
	for _, h := range n.net.held() {
		if strings.Contains(h, "pool") {
			t.Errorf("pool network left: %s", h)
		}
	}
	if cg := n.cfg.Cgroups.(*fakeCgroups).held(); slices.ContainsFunc(cg, func(g string) bool {
		return strings.HasPrefix(g, "/cocoon-cri-pool/") && !strings.HasSuffix(g, poolNetID(taken))
	}) {
		t.Errorf("pool cgroups left: %q", cg)
	}
}

// RemoveImage of the pool's image drains it, and the snapshot then goes; the pool does not fill
// until the image is back.
func TestRemoveImageDrainsItsPool(t *testing.T) {
	n, obs := poolNode(t, 2)
	ctx := context.Background()
	n.s.fillPools(ctx)
	img, err := n.s.images.Get(snapshotRef)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := n.s.RemoveImage(ctx, &runtimeapi.RemoveImageRequest{Image: &runtimeapi.ImageSpec{Image: snapshotRef}}); err != nil {
		t.Fatal(err)
	}
	if left := n.poolVMs(); len(left) != 0 {
		t.Fatalf("pool VMs left after RemoveImage: %q", left)
	}
	if slices.Contains(n.cocoon.snapshotNames(), img.LocalName) {
		t.Errorf("the removed image's snapshot %s is kept", img.LocalName)
	}
	n.s.fillPools(ctx)
	got := n.poolInfo()
	if got[0].Ready != 0 || !strings.Contains(got[0].Reason, "not on the node") || len(n.poolVMs()) != 0 || obs.ready[snapshotRef] != 0 {
		t.Fatalf("pool without its image: %+v, VMs %q", got, n.poolVMs())
	}
}

// A cocoon without vm exec cannot give a pool VM a pod's identity: the pool says so and stays
// empty, and pods start cold.
func TestWarmPoolNeedsTheGuestAgent(t *testing.T) {
	n, _ := poolNode(t, 1)
	n.cocoon.setCaps(capsV038)
	n.s.fillPools(context.Background())
	got := n.poolInfo()
	if len(got) != 1 || got[0].Ready != 0 || !strings.Contains(got[0].Reason, "vm exec") {
		t.Fatalf("pool on v0.3.8: %+v", got)
	}
	if clones := n.cocoon.calls("VMClone"); len(clones) != 0 {
		t.Fatalf("clones %q", clones)
	}
	_, containerID := n.runningPod("cold")
	if c := n.container(containerID); c.VM.Pooled {
		t.Fatalf("container %+v", c.VM)
	}
}

// A pool VM whose guest does not show its NIC (or whose agent never answers) is removed with
// everything it had, and the fill is tried again later.
func TestAFailedFillLeavesNothing(t *testing.T) {
	n, obs := poolNode(t, 1)
	n.cocoon.setGuest(func(context.Context, cocoon.VM, []string, cocoon.ExecOptions) (int, error) { return 0, nil })
	n.s.fillPools(context.Background())
	if left := n.poolVMs(); len(left) != 0 {
		t.Fatalf("pool VMs left by a failed fill: %q", left)
	}
	if recs := n.st.PoolVMs.List(nil); len(recs) != 0 || obs.refills != 0 {
		t.Fatalf("pool records %d, refills %d", len(recs), obs.refills)
	}
	if held := n.net.held(); len(held) != 0 {
		t.Fatalf("network left by a failed fill: %q", held)
	}
	if cg := n.cfg.Cgroups.(*fakeCgroups).held(); len(cg) != 0 {
		t.Fatalf("cgroups left by a failed fill: %q", cg)
	}
	n.cocoon.setGuest(poolGuest(nil))
	n.s.fillPools(context.Background())
	if got := n.poolInfo(); got[0].Ready != 1 {
		t.Fatalf("the next fill: %+v", got)
	}
}

// The next VMs in a pool's line hold a primed shell, which takes the hand-over's set-up: no vm
// exec is started for it. A shell that ended meanwhile leaves the set-up to a vm exec of its own,
// and a VM that leaves the pool takes its shell with it.
func TestPrimedShellsTakeTheHandOver(t *testing.T) {
	n, _ := poolNode(t, 3)
	ctx := t.Context()
	var mu sync.Mutex
	setUps := map[string]int{} // by VM name, the set-up scripts it ran
	n.cocoon.setGuest(poolGuest(func(_ context.Context, vm cocoon.VM, argv []string, _ cocoon.ExecOptions) (int, error) {
		mu.Lock()
		defer mu.Unlock()
		if len(argv) == 3 && strings.Contains(argv[2], "/proc/sys/kernel/hostname") {
			setUps[vm.Config.Name]++
		}
		return 0, nil
	}))
	n.s.fillPools(ctx)
	n.s.primePools(ctx)
	primed := func() []string {
		n.s.pools.mu.Lock()
		defer n.s.pools.mu.Unlock()
		return slices.Sorted(maps.Keys(n.s.pools.primed))
	}
	n.s.pools.mu.Lock()
	line := slices.Clone(n.s.pools.pools[snapshotRef].ready)
	n.s.pools.mu.Unlock()
	if got := primed(); len(line) != 3 || !slices.Equal(got, slices.Sorted(slices.Values(line[:2]))) {
		t.Fatalf("primed %q, want the first two of the line %q", got, line)
	}
	execsOf := func(vm string) int {
		pv, _ := n.cocoon.vm(vm)
		return len(slices.DeleteFunc(n.cocoon.calls("VMExec"), func(c string) bool { return !strings.Contains(c, " "+pv.ID+" ") }))
	}

	_, first := n.runningPod("first")
	c := n.container(first)
	mu.Lock()
	took := setUps[line[0]]
	mu.Unlock()
	if c.VM.Name != line[0] || took != 1 {
		t.Fatalf("container VM %s ran %d set-ups, want %s with one", c.VM.Name, took, line[0])
	}
	// The pool's probe, and the primed shell.
	if execs := execsOf(line[0]); execs != 2 {
		t.Errorf("VM %s had %d vm execs, want 2, the pool's probe and the primed shell, which took the set-up: %q", line[0], execs, n.cocoon.calls("VMExec"))
	}
	n.s.primePools(ctx)
	if got := primed(); !slices.Equal(got, slices.Sorted(slices.Values(line[1:]))) {
		t.Fatalf("primed after a hand-over %q, want the rest of the line %q", got, line[1:])
	}

	// A shell whose session ended: the set-up takes a vm exec.
	n.s.pools.mu.Lock()
	cut := n.s.pools.primed[line[1]]
	n.s.pools.mu.Unlock()
	cut.cancel()
	<-cut.done
	_, second := n.runningPod("second")
	mu.Lock()
	took = setUps[line[1]]
	mu.Unlock()
	if c := n.container(second); c.VM.Name != line[1] || took != 1 || c.State != store.ContainerRunning {
		t.Fatalf("container %+v ran %d set-ups, want %s running with one", c.VM, took, line[1])
	}
	if execs := execsOf(line[1]); execs != 3 {
		t.Errorf("VM %s had %d vm execs, want 3: the probe, the primed shell that ended, and the set-up's own", line[1], execs)
	}

	// A VM leaving the pool ends its shell.
	n.s.primePools(ctx)
	n.s.pools.mu.Lock()
	last := n.s.pools.primed[line[2]]
	n.s.pools.mu.Unlock()
	pv, err := n.st.PoolVMs.Get(line[2])
	if last == nil || err != nil {
		t.Fatalf("the last VM in line %s has no primed shell (%v)", line[2], err)
	}
	n.s.discardPoolVM(ctx, pv, nil)
	select {
	case <-last.done:
	default:
		t.Fatal("the primed shell of a removed pool VM still runs")
	}
	if got := primed(); slices.Contains(got, line[2]) {
		t.Fatalf("primed %q still names the removed VM", got)
	}
}

// A pooled VM leaves its pool cgroup for the pod's, as a cloned one joins it; after a failed
// hand-over the pod's cgroup holds the clone alone, and nothing is left once the pod goes.
func TestPooledVMJoinsThePodCgroup(t *testing.T) {
	driver := &fakeCgroups{}
	n := newFakeNode(t, Config{WarmPools: map[string]int{snapshotRef: 1}, Cgroups: driver})
	n.cocoon.setCaps(capsV05)
	n.cocoon.setGuest(poolGuest(nil))
	pid, _ := hypervisorStandIn(t)
	n.cocoon.setPID(func() int { return pid })
	n.importSnapshot(snapshotRef, appSnapshot())
	ctx := context.Background()
	podInCgroup := func(name string) (string, string) {
		cfg := podConfig(name)
		cfg.Linux = &runtimeapi.LinuxPodSandboxConfig{CgroupParent: "/kubepods/burstable/poduid-" + name}
		resp, err := n.s.RunPodSandbox(ctx, &runtimeapi.RunPodSandboxRequest{Config: cfg, RuntimeHandler: HandlerName})
		if err != nil {
			t.Fatal(err)
		}
		id := n.createContainer(resp.GetPodSandboxId(), "app", snapshotRef)
		n.startContainer(id)
		return resp.GetPodSandboxId(), id
	}
	isPoolCgroup := func(g string) bool { return strings.HasPrefix(g, "/cocoon-cri-pool/") }

	n.s.fillPools(ctx)
	if held := driver.held(); !slices.ContainsFunc(held, isPoolCgroup) {
		t.Fatalf("the pool VM is in no pool cgroup: %q", held)
	}
	webSandbox, web := podInCgroup("web")
	c := n.container(web)
	want := "/kubepods/burstable/poduid-web/" + web
	if !c.VM.Pooled || c.VM.Cgroup != want || c.VM.CgroupCreated != want {
		t.Fatalf("pooled container's VM %+v, want it in %s", c.VM, want)
	}
	if pids := driver.pids(want); len(pids) == 0 || pids[0] != pid {
		t.Fatalf("cgroup %s holds %v, want the hypervisor %d first", want, pids, pid)
	}
	if held := driver.held(); !slices.Equal(held, []string{want}) {
		t.Fatalf("cgroups after the hand-over %q, want the pod's alone", held)
	}

	n.s.fillPools(ctx)
	n.net.failOnce("HandOver", errors.New("netlink: device busy"))
	_, api := podInCgroup("api")
	c = n.container(api)
	want = "/kubepods/burstable/poduid-api/" + api
	if c.VM.Pooled || c.VM.Cgroup != want || c.State != store.ContainerRunning {
		t.Fatalf("container after a failed hand-over %+v, want a clone in %s", c.VM, want)
	}
	if held := driver.held(); slices.ContainsFunc(held, isPoolCgroup) || !slices.Contains(held, want) {
		t.Fatalf("cgroups after a failed hand-over %q: the pool VM's is left, or the clone's is missing", held)
	}

	for _, id := range []string{webSandbox, c.SandboxID} {
		if _, err := n.s.StopPodSandbox(ctx, &runtimeapi.StopPodSandboxRequest{PodSandboxId: id}); err != nil {
			t.Fatal(err)
		}
	}
	if held := driver.held(); len(held) != 0 {
		t.Fatalf("cgroups left once the pods stopped and the pool is empty: %q", held)
	}
}
