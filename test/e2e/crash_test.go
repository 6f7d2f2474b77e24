package e2e

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/cocoonstack/cocoon-cri/pkg/cocoon"
	"github.com/cocoonstack/cocoon-cri/pkg/faultpoint"
	"github.com/cocoonstack/cocoon-cri/test/testproc"
)

// A crash scenario is a pod's life as the kubelet drives it: steps, each one CRI call. When
// cocoon-cri dies inside a step, the harness restarts it and replays what the kubelet does next:
// it relists, and retries the step or works around what the step left.
type crashRun struct {
	n       *node
	name    string
	image   string
	podFile string
	podID   string
	ctrIDs  []string // every container the run created, the current one last
}

type crashStep struct {
	name string
	// do performs the call; retry is the kubelet's next move after cocoon-cri died in it.
	do, retry func(r *crashRun) error
}

func (r *crashRun) ctrID() string { return r.ctrIDs[len(r.ctrIDs)-1] }

var (
	stepRunPod = crashStep{"runp",
		func(r *crashRun) error {
			id, err := r.n.crictl("runp", "--runtime", "cocoon", r.podFile)
			r.podID = id
			return err
		},
		func(r *crashRun) error {
			// The kubelet relists: a sandbox that became ready is used; a half-made one is removed
			// and made again.
			if id, _ := r.n.crictl("pods", "--name", r.name, "--state", "ready", "-q"); id != "" {
				r.podID = id
				return nil
			}
			if id, _ := r.n.crictl("pods", "--name", r.name, "-q"); id != "" {
				if _, err := r.n.crictl("rmp", "--force", id); err != nil {
					return err
				}
			}
			id, err := r.n.crictl("runp", "--runtime", "cocoon", r.podFile)
			r.podID = id
			return err
		}}
	stepCreate = crashStep{"create",
		func(r *crashRun) error { return r.create() },
		func(r *crashRun) error {
			// A container recorded before the crash is the kubelet's to remove; it then creates anew.
			if ids, _ := r.n.crictl("ps", "-a", "--pod", r.podID, "--name", "app", "-q"); ids != "" {
				for _, id := range strings.Fields(ids) {
					if !r.known(id) {
						if _, err := r.n.crictl("rm", id); err != nil {
							return err
						}
					}
				}
			}
			return r.create()
		}}
	stepStart = crashStep{"start",
		func(r *crashRun) error { _, err := r.n.crictl("start", r.ctrID()); return err },
		func(r *crashRun) error {
			switch state := r.state(); state {
			case "CONTAINER_RUNNING":
				return nil
			case "CONTAINER_CREATED":
				_, err := r.n.crictl("start", r.ctrID())
				return err
			default:
				// A failed start: the kubelet removes the container and starts a new one.
				if _, err := r.n.crictl("rm", r.ctrID()); err != nil {
					return err
				}
				if err := r.create(); err != nil {
					return err
				}
				_, err := r.n.crictl("start", r.ctrID())
				return err
			}
		}}
	stepStop   = idempotentStep("stop", func(r *crashRun) []string { return []string{"stop", r.ctrID()} })
	stepRemove = idempotentStep("rm", func(r *crashRun) []string { return []string{"rm", r.ctrID()} })
	stepStopP  = idempotentStep("stopp", func(r *crashRun) []string { return []string{"stopp", r.podID} })
	stepRmP    = idempotentStep("rmp", func(r *crashRun) []string { return []string{"rmp", r.podID} })
	stepRmPF   = idempotentStep("rmp --force", func(r *crashRun) []string { return []string{"rmp", "--force", r.podID} })
	// stepRemoveAll removes every container the run made, as the kubelet's garbage collector does.
	stepRemoveAll = crashStep{"rm all",
		func(r *crashRun) error { return r.removeAll() },
		func(r *crashRun) error { return r.removeAll() }}
)

// idempotentStep is a call the kubelet simply repeats, unless its relist shows the object gone
// (crictl asks for the status first, and stops at NotFound).
func idempotentStep(name string, args func(r *crashRun) []string) crashStep {
	do := func(r *crashRun) error { _, err := r.n.crictl(args(r)...); return err }
	retry := func(r *crashRun) error {
		if err := do(r); err != nil && !strings.Contains(err.Error(), "code = NotFound") {
			return err
		}
		return nil
	}
	return crashStep{name, do, retry}
}

// create makes the pod's next container: a restart is a new attempt, as the kubelet counts them.
func (r *crashRun) create() error {
	cfg := containerConfig("app", r.image)
	cfg.Metadata.Attempt = uint32(len(r.ctrIDs))
	ctrFile := r.n.configFile(fmt.Sprintf("%s-ctr%d.json", r.name, cfg.Metadata.Attempt), cfg)
	id, err := r.n.crictl("create", "--no-pull", r.podID, ctrFile, r.podFile)
	if err == nil {
		r.ctrIDs = append(r.ctrIDs, id)
	}
	return err
}

func (r *crashRun) known(id string) bool {
	for _, k := range r.ctrIDs {
		if k == id {
			return true
		}
	}
	return false
}

func (r *crashRun) state() string {
	out, err := r.n.crictl("inspect", "-o", "go-template", "--template", "{{.status.state}}", r.ctrID())
	if err != nil {
		return ""
	}
	return out
}

func (r *crashRun) removeAll() error {
	for _, id := range r.ctrIDs {
		if _, err := r.n.crictl("rm", "--force", id); err != nil && !strings.Contains(err.Error(), "code = NotFound") {
			return err
		}
	}
	return nil
}

// crashScenario names a pod life.
type crashScenario struct {
	name  string
	image string
	steps []crashStep
}

var crashScenarios = []crashScenario{
	{"clone", snapRef, []crashStep{stepRunPod, stepCreate, stepStart, stepStop, stepRemove, stepStopP, stepRmP}},
	{"boot", cloudRef, []crashStep{stepRunPod, stepCreate, stepStart, stepStop, stepRemove, stepStopP, stepRmP}},
	{"force-remove-running", snapRef, []crashStep{stepRunPod, stepCreate, stepStart, stepRmPF}},
	{"force-remove-booted", cloudRef, []crashStep{stepRunPod, stepCreate, stepStart, stepRmPF}},
	{"stop-pod-running", snapRef, []crashStep{stepRunPod, stepCreate, stepStart, stepStopP, stepRmP}},
	// The kubelet's order when a pod goes: the container stops (its VM keeps the pod interface),
	// the pod stops (the interface comes back for the CNI DEL), then garbage collection.
	{"stop-then-stop-pod", snapRef, []crashStep{stepRunPod, stepCreate, stepStart, stepStop, stepStopP, stepRemove, stepRmP}},
	// A container restarted by the kubelet: stop, a new container, start, then garbage collection.
	{"restart", snapRef, []crashStep{stepRunPod, stepCreate, stepStart, stepStop, stepCreate, stepStart, stepStop, stepRemoveAll, stepStopP, stepRmP}},
}

// backgroundPoint reports points that do not happen at the same place on every run: the startup
// probes (the capability probe's --help calls included) and the startup's look for what
// interrupted forks left (snapshot list), guest set-up through vm exec and vm reseed, the VM
// watcher and sweep.
func backgroundPoint(name string) bool {
	if strings.Contains(name, " --help/") {
		return true
	}
	for _, p := range []string{"cocoon vm exec", "cocoon vm reseed", "cocoon vm status", "cocoon vm list", "cocoon version", "cocoon vm inspect", "cocoon snapshot list"} {
		if strings.HasPrefix(name, p) {
			return true
		}
	}
	return false
}

// TestCrashSafety kills cocoon-cri with SIGKILL at every point a pod's life passes (every store
// write and cocoon call, before and after, and the named steps), in seven pod lives, each on a node
// of its own and side by side. After each kill it restarts cocoon-cri, replays the kubelet's next
// moves, and checks that the CRI view matches cocoon's records; at the end of each life nothing is
// left: no VM, network namespace, veth, IP lease, CNI cache entry, record or open log file.
// The daemon is the build without the race detector (bins.cocoonCRIPlain) after the first start:
// the other tests run the race build through the same restarts and recoveries.
func TestCrashSafety(t *testing.T) {
	t.Parallel()
	var total atomic.Int64
	t.Run("scenarios", func(t *testing.T) {
		for _, sc := range crashScenarios {
			t.Run(sc.name, func(t *testing.T) {
				t.Parallel()
				n := newNode(t)
				n.Bin = bins.CocoonCRIPlain
				n.withSnapshot()
				n.ImportImage(cloudRef, n.cloudImage("cloud"))
				points := n.tracePoints(sc)
				for _, point := range points {
					n.crashAt(sc, point)
				}
				total.Add(int64(len(points)))
				t.Logf("survived %d kill points", len(points))
			})
		}
	})
	if t.Failed() {
		return
	}
	t.Logf("survived %d kill points in %d scenarios", total.Load(), len(crashScenarios))
	if total.Load() < 200 {
		t.Fatalf("only %d kill points; the harness must cover at least 200", total.Load())
	}
}

// tracePoints runs the scenario once without a crash and returns the points it passed, as
// NAME#K (the K-th pass of NAME).
func (n *node) tracePoints(sc crashScenario) []string {
	n.t.Helper()
	trace := filepath.Join(n.Dir, "trace-"+sc.name)
	n.Stop()
	n.Env = []string{faultpoint.TraceEnvVar + "=" + trace}
	n.Start()
	n.runScenario(sc, "trace", "")
	n.Stop()
	n.Env = nil
	n.Start()
	data, err := os.ReadFile(trace)
	if err != nil {
		n.t.Fatal(err)
	}
	seen := map[string]int{}
	var points []string
	for _, name := range strings.Split(strings.TrimSpace(string(data)), "\n") {
		if name == "" || backgroundPoint(name) {
			continue
		}
		seen[name]++
		points = append(points, fmt.Sprintf("%s#%d", name, seen[name]))
	}
	return points
}

// crashAt runs the scenario with cocoon-cri set to die at point.
func (n *node) crashAt(sc crashScenario, point string) {
	n.t.Helper()
	n.Stop()
	n.Env = []string{faultpoint.EnvVar + "=" + point}
	n.Start()
	n.runScenario(sc, strings.NewReplacer(" ", "-", "/", "-", "#", "-").Replace(point), point)
	n.Env = nil
}

// runScenario drives one pod life. When point is set the daemon must die in one of the steps;
// it is restarted and the kubelet's retry replayed.
func (n *node) runScenario(sc crashScenario, tag, point string) {
	n.t.Helper()
	name := "crash-" + strings.ToLower(tag)
	if len(name) > 50 {
		name = name[:50]
	}
	name = strings.Trim(name, "-")
	r := &crashRun{n: n, name: name, image: sc.image}
	r.podFile = n.configFile(name+"-pod.json", n.podConfig(name, "uid-"+name))
	crashed := false
	for _, step := range sc.steps {
		err := step.do(r)
		if err == nil {
			continue
		}
		if point == "" || crashed || !n.Died(5*time.Second) {
			n.t.Fatalf("%s %s: step %s: %v\n%s", sc.name, point, step.name, err, n.Log())
		}
		crashed = true
		n.Env = nil
		n.Start()
		if err := step.retry(r); err != nil {
			n.t.Fatalf("%s %s: the kubelet's retry of %s after the crash: %v\n%s", sc.name, point, step.name, err, n.Log())
		}
		n.checkConsistent(fmt.Sprintf("%s %s after %s", sc.name, point, step.name))
	}
	if point != "" && !crashed {
		// The point was passed after the last step answered (a background write, as the trace
		// run saw it): the daemon still dies there, maybe late on a loaded machine, and a restart
		// must find everything in order.
		if n.Died(30 * time.Second) {
			n.Start()
		}
	}
	n.checkNothingLeft(fmt.Sprintf("%s %s", sc.name, point))
}

// checkConsistent compares the CRI view with cocoon's records: every running container's VM runs,
// and every VM named like cocoon-cri's belongs to a container.
func (n *node) checkConsistent(when string) { n.checkConsistentBeside(when, nil) }

// checkConsistentBeside is checkConsistent where the VMs also says yes to (by name), when it is not
// nil, may be no container's.
func (n *node) checkConsistentBeside(when string, also func(vmName string) bool) {
	n.t.Helper()
	claimed := map[string]bool{}
	for _, id := range strings.Fields(n.mustCrictl("ps", "-a", "-q")) {
		c := n.inspect("inspect", id)
		vmName, _ := field(c, "info", "vm", "name").(string)
		claimed[vmName] = true
		if field(c, "status", "state") != "CONTAINER_RUNNING" {
			continue
		}
		vm, err := n.vm(vmName)
		if err != nil || vm.State != cocoon.VMStateRunning || !testproc.Running(vm.PID) {
			n.t.Fatalf("%s: container %s is running but its VM is %+v (%v)", when, id, vm, err)
		}
	}
	for _, vm := range n.vms() {
		if strings.HasPrefix(vm.Config.Name, "cri-") && !claimed[vm.Config.Name] && (also == nil || !also(vm.Config.Name)) {
			n.t.Fatalf("%s: VM %s (%s) belongs to no container", when, vm.Config.Name, vm.State)
		}
	}
}

// checkNothingLeft checks that a finished pod life left nothing: records, VMs, network state, or
// log files the daemon holds open.
func (n *node) checkNothingLeft(when string) {
	n.t.Helper()
	if pods := n.mustCrictl("pods", "-q"); pods != "" {
		n.t.Fatalf("%s: sandboxes left: %s", when, pods)
	}
	if ctrs := n.mustCrictl("ps", "-a", "-q"); ctrs != "" {
		n.t.Fatalf("%s: containers left: %s", when, ctrs)
	}
	if vms := n.vms(); len(vms) != 0 {
		n.t.Fatalf("%s: VMs left: %+v", when, vms)
	}
	if left := n.leftovers(); len(left) != 0 {
		n.t.Fatalf("%s: left behind: %v", when, left)
	}
	if open := n.openLogFiles(); len(open) != 0 {
		n.t.Fatalf("%s: the daemon still holds log files: %v", when, open)
	}
}

// openLogFiles lists the container log files the daemon has open.
func (n *node) openLogFiles() []string {
	if n.Daemon == nil {
		return nil
	}
	fds, _ := os.ReadDir(fmt.Sprintf("/proc/%d/fd", n.Daemon.PID()))
	var open []string
	for _, fd := range fds {
		target, err := os.Readlink(fmt.Sprintf("/proc/%d/fd/%s", n.Daemon.PID(), fd.Name()))
		if err == nil && strings.HasPrefix(target, n.PodLogs) {
			open = append(open, target)
		}
	}
	return open
}
