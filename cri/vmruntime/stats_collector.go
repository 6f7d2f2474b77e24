package vmruntime

import (
	"errors"
	"io/fs"
	"log/slog"

	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"

	"github.com/cocoonstack/cocoon-cri/pkg/store"
	"github.com/cocoonstack/cocoon-cri/pkg/vmstats"
	"github.com/cocoonstack/cocoon-cri/tapmanager"
)

// statsCollector reads what pods and containers use: from each running VM's hypervisor process
// (its vCPU threads are the guest's CPU, its resident memory the guest's memory plus the VMM's
// own), the pod interface's counters and the VM's writable disk; never from cocoon, since the
// kubelet asks every few seconds. It keeps each running hypervisor's /proc files open, and the
// last CPU sample of each container for the rate. A container whose VM does not run reports zero
// CPU and memory, with timestamps, as containerd does for a container without a task; its
// writable disk is still reported while cocoon keeps it.
type statsCollector struct {
	log *slog.Logger
	net interface {
		PodInterfaceCounters(sandboxID, netns string) (vmstats.Interface, error)
	}
	// containersDir is the filesystem of the VMs' writable disks (ImageFsInfo's container
	// filesystem).
	containersDir func() string
	// exists says whether a container still exists, so its samples can go when it does not.
	exists   func(containerID string) bool
	cpuRate  vmstats.CPURate  // previous CPU samples, by container ID
	samplers vmstats.Samplers // running hypervisors' /proc files, by container ID
}

// sandbox adds up the sandbox's containers (at most one VM runs) and reads the pod
// interface. Cumulative CPU is the running VM's: a restarted container's VM starts from zero, as
// a restarted container's cgroup does.
func (sc *statsCollector) sandbox(sb *store.Sandbox, containers []*store.Container, now int64) *runtimeapi.PodSandboxStats {
	cfg := sb.Config.Msg
	linux := &runtimeapi.LinuxPodSandboxStats{
		Cpu:     &runtimeapi.CpuUsage{Timestamp: now, UsageCoreNanoSeconds: u64(0), UsageNanoCores: u64(0)},
		Memory:  zeroMemory(now),
		Process: &runtimeapi.ProcessUsage{Timestamp: now, ProcessCount: u64(0)},
	}
	var running *store.Container
	for _, c := range containers {
		smp := sc.container(c, now)
		linux.Containers = append(linux.Containers, smp.stats)
		if smp.proc == nil {
			continue
		}
		running = c
		addValue(&linux.Cpu.UsageCoreNanoSeconds, smp.stats.Cpu.GetUsageCoreNanoSeconds().GetValue())
		addValue(&linux.Cpu.UsageNanoCores, smp.stats.Cpu.GetUsageNanoCores().GetValue())
		m := smp.stats.Memory
		addValue(&linux.Memory.WorkingSetBytes, m.GetWorkingSetBytes().GetValue())
		addValue(&linux.Memory.UsageBytes, m.GetUsageBytes().GetValue())
		addValue(&linux.Memory.RssBytes, m.GetRssBytes().GetValue())
		addValue(&linux.Memory.PageFaults, m.GetPageFaults().GetValue())
		addValue(&linux.Memory.MajorPageFaults, m.GetMajorPageFaults().GetValue())
		// On the host a VM is one process, its hypervisor (the guest's processes are inside it).
		addValue(&linux.Process.ProcessCount, 1)
	}
	linux.Network = sc.podNetwork(sb, running, now)
	return &runtimeapi.PodSandboxStats{
		Attributes: &runtimeapi.PodSandboxAttributes{
			Id: sb.ID, Metadata: cfg.GetMetadata(), Labels: cfg.GetLabels(), Annotations: cfg.GetAnnotations(),
		},
		Linux: linux,
	}
}

// containerSample is a container's stats and the hypervisor sample behind them (nil when no VM
// runs).
type containerSample struct {
	stats *runtimeapi.ContainerStats
	proc  *vmstats.Process
}

// container samples one container.
func (sc *statsCollector) container(c *store.Container, now int64) containerSample {
	cfg := c.Config.Msg
	st := &runtimeapi.ContainerStats{
		Attributes: &runtimeapi.ContainerAttributes{
			Id: c.ID, Metadata: cfg.GetMetadata(), Labels: cfg.GetLabels(), Annotations: cfg.GetAnnotations(),
		},
		Cpu:           &runtimeapi.CpuUsage{Timestamp: now, UsageCoreNanoSeconds: u64(0), UsageNanoCores: u64(0)},
		Memory:        zeroMemory(now),
		Swap:          &runtimeapi.SwapUsage{Timestamp: now, SwapUsageBytes: u64(0)},
		WritableLayer: sc.writableLayer(c, now),
	}
	proc := sc.hypervisor(c)
	if proc == nil {
		return containerSample{stats: st}
	}
	st.Cpu.UsageCoreNanoSeconds = u64(proc.CPUNanos)
	if rate, ok := sc.cpuRate.Observe(c.ID, proc.StartTicks, now, proc.CPUNanos, c.StartedAt); ok {
		st.Cpu.UsageNanoCores = u64(rate)
	}
	// Nothing a hypervisor holds is cache the kernel could take back the way a container's
	// inactive file pages are: all of its resident memory is working set. The guest's RAM is
	// anonymous memory, or shared memory when a vhost-user device needs it; both are its RSS.
	st.Memory.WorkingSetBytes = u64(proc.RSS)
	st.Memory.UsageBytes = u64(proc.RSS)
	st.Memory.RssBytes = u64(proc.RSSAnon + proc.RSSShmem)
	st.Memory.PageFaults = u64(proc.MinorFaults)
	st.Memory.MajorPageFaults = u64(proc.MajorFaults)
	st.Swap.SwapUsageBytes = u64(proc.Swap)
	return containerSample{stats: st, proc: proc}
}

// hypervisor samples a running container's hypervisor; nil when the container does not run, or
// its process is gone (the VM watcher records that) or is another process that reused the PID.
func (sc *statsCollector) hypervisor(c *store.Container) *vmstats.Process {
	if c.State != store.ContainerRunning || c.VM.PID <= 0 {
		return nil
	}
	proc, err := sc.samplers.Sample(procRoot, c.ID, c.VM.PID)
	switch {
	case errors.Is(err, vmstats.ErrGone):
		sc.log.Debug("the hypervisor of a running container is gone; its stats are zero", "container", c.ID, "pid", c.VM.PID)
		return nil
	case err != nil:
		sc.log.Warn("reading the hypervisor's usage failed", "container", c.ID, "pid", c.VM.PID, "err", err)
		return nil
	case c.VM.PIDStart != 0 && proc.StartTicks != c.VM.PIDStart:
		sc.samplers.Close(c.ID)
		sc.log.Debug("the hypervisor's PID belongs to another process now; its stats are zero", "container", c.ID, "pid", c.VM.PID)
		return nil
	}
	return proc
}

// writableLayer is the VM's writable disk, as cocoon reported it at start: the blocks it has
// allocated, on the filesystem of cocoon's run dir (the container filesystem ImageFsInfo
// reports). It is there from the VM's start to its removal, so stopped containers count too.
func (sc *statsCollector) writableLayer(c *store.Container, now int64) *runtimeapi.FilesystemUsage {
	var used, inodes uint64
	if path := c.VM.COWPath; path != "" {
		b, err := vmstats.AllocatedBytes(path)
		switch {
		case err == nil:
			used, inodes = b, 1
		case !errors.Is(err, fs.ErrNotExist):
			sc.log.Warn("reading the VM's writable disk failed", "container", c.ID, "path", path, "err", err)
		}
	}
	return &runtimeapi.FilesystemUsage{
		Timestamp:  now,
		FsId:       &runtimeapi.FilesystemIdentifier{Mountpoint: sc.containersDir()},
		UsedBytes:  u64(used),
		InodesUsed: u64(inodes),
	}
}

// podNetwork reads the pod interface: in the namespace of the running container's hypervisor,
// which holds it, or, while no VM runs, where the network finds it (the pod's namespace, or a
// stopped VM's). Nil when none has it (the sandbox was detached from the network).
func (sc *statsCollector) podNetwork(sb *store.Sandbox, running *store.Container, now int64) *runtimeapi.NetworkUsage {
	var iface vmstats.Interface
	found := false
	if running != nil {
		ifaces, err := sc.samplers.NetDev(procRoot, running.ID, running.VM.PID)
		if err == nil {
			iface, found = vmstats.FindInterface(ifaces, tapmanager.VMIfName)
		}
	}
	if !found && sb.NetNS != "" && sb.Network != nil && sb.Network.Result != nil {
		var err error
		if iface, err = sc.net.PodInterfaceCounters(sb.ID, sb.NetNS); err != nil {
			sc.log.Debug("no pod interface counters", "sandbox", sb.ID, "err", err)
			return nil
		}
		found = true
	}
	if !found {
		return nil
	}
	return &runtimeapi.NetworkUsage{
		Timestamp: now,
		DefaultInterface: &runtimeapi.NetworkInterfaceUsage{
			Name:    iface.Name,
			RxBytes: u64(iface.RxBytes), RxErrors: u64(iface.RxErrors),
			TxBytes: u64(iface.TxBytes), TxErrors: u64(iface.TxErrors),
		},
	}
}

// forgetRemoved drops the CPU samples and closes the /proc files of containers that no longer
// exist.
func (sc *statsCollector) forgetRemoved() {
	sc.cpuRate.Forget(sc.exists)
	sc.samplers.Forget(sc.exists)
}

// forget closes a container's /proc files: its VM stopped, or hibernated.
func (sc *statsCollector) forget(containerID string) { sc.samplers.Close(containerID) }

func zeroMemory(now int64) *runtimeapi.MemoryUsage {
	return &runtimeapi.MemoryUsage{
		Timestamp: now, WorkingSetBytes: u64(0), UsageBytes: u64(0), RssBytes: u64(0),
		PageFaults: u64(0), MajorPageFaults: u64(0),
	}
}

func u64(v uint64) *runtimeapi.UInt64Value { return &runtimeapi.UInt64Value{Value: v} }

func addValue(dst **runtimeapi.UInt64Value, v uint64) { *dst = u64((*dst).GetValue() + v) }
