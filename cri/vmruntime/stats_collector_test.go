package vmruntime

import (
	"errors"
	"log/slog"
	"testing"

	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"

	"github.com/cocoonstack/cocoon-cri/pkg/store"
	"github.com/cocoonstack/cocoon-cri/pkg/vmstats"
)

// counters stands in for the pod network's interface counters.
type counters struct {
	iface vmstats.Interface
	err   error
	asked []string
}

func (c *counters) PodInterfaceCounters(sandboxID, netns string) (vmstats.Interface, error) {
	c.asked = append(c.asked, sandboxID+"@"+netns)
	return c.iface, c.err
}

func newCollector(net *counters, exists func(string) bool) *statsCollector {
	return &statsCollector{log: slog.New(slog.DiscardHandler), net: net,
		containersDir: func() string { return "/var/lib/cocoon/run" }, exists: exists}
}

// The collector alone: a running container's usage is its hypervisor's; a pod without a running
// VM reads its interface where the network finds it; a container that is gone is forgotten.
func TestStatsCollector(t *testing.T) {
	pid, start := hypervisorStandIn(t)
	net := &counters{iface: vmstats.Interface{Name: "eth0", RxBytes: 10, TxBytes: 20}}
	live := map[string]bool{"run": true, "stopped": true}
	sc := newCollector(net, func(id string) bool { return live[id] })
	cfg := store.Proto[*runtimeapi.ContainerConfig]{Msg: &runtimeapi.ContainerConfig{}}
	running := &store.Container{ID: "run", State: store.ContainerRunning, Config: cfg, VM: store.VM{PID: pid, PIDStart: start}}
	stopped := &store.Container{ID: "stopped", State: store.ContainerExited, Config: cfg}

	smp := sc.container(running, 1)
	if smp.proc == nil || smp.stats.GetMemory().GetWorkingSetBytes().GetValue() == 0 || smp.stats.GetWritableLayer().GetFsId().GetMountpoint() != "/var/lib/cocoon/run" {
		t.Fatalf("a running container: %v", smp.stats)
	}
	reused := *running
	reused.VM.PIDStart = start + 1
	if smp := sc.container(&reused, 2); smp.proc != nil || smp.stats.GetMemory().GetWorkingSetBytes().GetValue() != 0 {
		t.Fatalf("a PID another process holds now is read as the VM: %v", smp.stats)
	}

	sb := &store.Sandbox{ID: "pod", NetNS: "/run/netns/pod", Network: &store.PodNetwork{Result: []byte("{}")},
		Config: store.Proto[*runtimeapi.PodSandboxConfig]{Msg: &runtimeapi.PodSandboxConfig{}}}
	pod := sc.sandbox(sb, []*store.Container{stopped}, 3)
	if got := pod.GetLinux().GetNetwork().GetDefaultInterface(); got.GetRxBytes().GetValue() != 10 || got.GetTxBytes().GetValue() != 20 {
		t.Fatalf("a pod without a running VM: network %v", got)
	}
	if len(net.asked) != 1 || net.asked[0] != "pod@/run/netns/pod" {
		t.Fatalf("the network was asked %q", net.asked)
	}
	if pod.GetLinux().GetProcess().GetProcessCount().GetValue() != 0 || len(pod.GetLinux().GetContainers()) != 1 {
		t.Fatalf("a pod without a running VM: %v", pod.GetLinux())
	}
	net.err = errors.New("no interface")
	if pod := sc.sandbox(sb, nil, 4); pod.GetLinux().GetNetwork() != nil {
		t.Fatalf("a pod whose interface cannot be read: network %v", pod.GetLinux().GetNetwork())
	}

	sc.container(running, 5)
	if sc.samplers.Len() != 1 || sc.cpuRate.Len() != 1 {
		t.Fatalf("%d samplers and %d CPU samples for one running container", sc.samplers.Len(), sc.cpuRate.Len())
	}
	delete(live, "run")
	sc.forgetRemoved()
	if sc.samplers.Len() != 0 || sc.cpuRate.Len() != 0 {
		t.Fatalf("a removed container's samples are kept: %d samplers, %d CPU samples", sc.samplers.Len(), sc.cpuRate.Len())
	}
}
