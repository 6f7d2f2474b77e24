package vmruntime

import (
	"context"
	"encoding/json"
	"io"
	"net"
	"time"

	"github.com/containernetworking/cni/libcni"
	current "github.com/containernetworking/cni/pkg/types/100"

	"github.com/cocoonstack/cocoon-cri/pkg/cocoon"
	"github.com/cocoonstack/cocoon-cri/pkg/vmstats"
	"github.com/cocoonstack/cocoon-cri/tapmanager"
)

// The runtime's seams: what it asks of cocoon and of the pod network, as small interfaces of its
// own. The daemon gives it pkg/cocoon's client (through CocoonClient) and tapmanager's Manager;
// the package's tests give it in-process fakes (fake_cocoon_test.go, fake_network_test.go), so
// that every lifecycle RPC runs without a cocoon binary, network namespaces or CNI plugins.

// Cocoon is what the VM runtime runs of cocoon: *cocoon.Client's methods of the same names, with
// their contract (docs/cocoon-contract.md). Failures are *cocoon.CommandError values, told apart
// with errors.Is (cocoon.ErrNotFound, cocoon.ErrAlreadyExists, ...).
type Cocoon interface {
	// Binary is the cocoon executable, for the verbose Status.
	Binary() string
	// Version runs cocoon version: the cheapest call that proves cocoon answers.
	Version(ctx context.Context) (*cocoon.VersionInfo, error)
	// Capabilities is what this cocoon offers (its version and the flags that differ between
	// releases), probed once and cached.
	Capabilities(ctx context.Context) (cocoon.Capabilities, error)
	// WithNetwork is the client for a sandbox's VMs: every call sees that CNI configuration and
	// those guest DNS servers.
	WithNetwork(cniConfDir, cniBinDir string, dns []string) Cocoon

	VMClone(ctx context.Context, snapshot string, o cocoon.CloneOptions) (*cocoon.VM, error)
	VMCreate(ctx context.Context, image string, o cocoon.CreateOptions) (*cocoon.VM, error)
	VMStart(ctx context.Context, id string) error
	VMStop(ctx context.Context, id string, o cocoon.StopOptions) error
	VMRemove(ctx context.Context, id string, force bool) error
	VMInspect(ctx context.Context, ref string) (*cocoon.VM, error)
	VMList(ctx context.Context) ([]cocoon.VM, error)
	VMExec(ctx context.Context, id string, argv []string, o cocoon.ExecOptions) (int, error)
	VMReseed(ctx context.Context, id string, machineID bool) error
	VMDiskAttach(ctx context.Context, id, path, name string, readonly bool) error
	VMDeviceAttach(ctx context.Context, vm, bdf, id string) error
	VMFsAttach(ctx context.Context, vm, socket, tag string) error
	VMFsDetach(ctx context.Context, vm, tag string) error
	// WatchVMs calls fn with each VM event until ctx ends or the stream stops.
	WatchVMs(ctx context.Context, poll time.Duration, fn func(cocoon.VMEvent)) error

	VMHibernate(ctx context.Context, vm, name string) error
	VMRestore(ctx context.Context, vm, snapshot string) error

	SnapshotSave(ctx context.Context, vm, name, description string) (*cocoon.Snapshot, error)
	SnapshotInspect(ctx context.Context, ref string) (*cocoon.Snapshot, error)
	SnapshotList(ctx context.Context) ([]cocoon.Snapshot, error)
	SnapshotExport(ctx context.Context, ref string, w io.Writer) error
	SnapshotExportToDir(ctx context.Context, ref, dir string) error
	SnapshotRemove(ctx context.Context, ref string) error
}

// CocoonClient is c as the runtime's Cocoon.
func CocoonClient(c *cocoon.Client) Cocoon { return cocoonClient{c} }

// cocoonClient adapts *cocoon.Client, whose WithNetwork returns the concrete client.
type cocoonClient struct{ *cocoon.Client }

func (c cocoonClient) WithNetwork(cniConfDir, cniBinDir string, dns []string) Cocoon {
	return cocoonClient{c.Client.WithNetwork(cniConfDir, cniBinDir, dns)}
}

// PodNetwork is what the VM runtime asks of the pod network: *tapmanager.Manager's methods of the
// same names (namespaces, the cluster's CNI, the handover of the pod interface to cocoon).
type PodNetwork interface {
	// NetNSPath is where a sandbox's network namespace is pinned.
	NetNSPath(sandboxID string) string
	CreateNetNS(path string) error
	// RemoveNetNS removes a pinned namespace; a missing one is fine.
	RemoveNetNS(path string) error

	// Load reads the named CNI network, or the node's default for "".
	Load(name string) (*libcni.NetworkConfigList, error)
	// Ready says whether the node's CNI configuration works.
	Ready(ctx context.Context) error
	Add(ctx context.Context, list *libcni.NetworkConfigList, pod tapmanager.Pod) (*current.Result, error)
	// Del is safe to repeat, and works when the namespace is gone.
	Del(ctx context.Context, confList []byte, pod tapmanager.Pod) error

	// CocoonConfDir and PluginDir are cocoon's --cni-conf-dir and --cni-bin-dir for a sandbox's
	// VMs.
	CocoonConfDir(sandboxID string) string
	PluginDir() string
	PrepareCocoon(sandboxID, podNetNS string, result json.RawMessage) error
	// RemoveCocoon deletes the sandbox's cocoon configuration; a missing one is fine.
	RemoveCocoon(sandboxID string) error
	// PreparePoolVM makes the placeholder network a warm pool VM is cloned onto (namespace
	// NetNSPath(id), cocoon configuration CocoonConfDir(id)); RemovePoolVM removes it, and a
	// missing one is fine.
	PreparePoolVM(id string) error
	RemovePoolVM(id string) error
	// HandOver wires the sandbox's pod interface to a running pool VM's TAP in place of the
	// placeholder, through a veth pair into the VM's namespace; the interface stays in the pod's.
	HandOver(sandboxID, podNetNS, vmNetNS string) error
	// ReclaimFromVM takes the pod interface back from a stopped VM's namespace.
	ReclaimFromVM(sandboxID, podNetNS, vmNetNS string, result json.RawMessage) error
	// RestorePodInterface undoes what a hand-over did to the pod interface in the pod's
	// namespace (its addresses, tc) before the cluster's CNI DEL; nothing if none did.
	RestorePodInterface(sandboxID, podNetNS string, result json.RawMessage) error

	// PodInterfaceCounters reads the pod interface while no VM runs: in the pod's namespace, or in
	// that of the stopped VM that still holds it.
	PodInterfaceCounters(sandboxID, podNetNS string) (vmstats.Interface, error)
	// WatchTraffic watches the pod interface in a VM's namespace for the pod's use.
	WatchTraffic(vmNetNS string, podIP net.IP) (tapmanager.Traffic, error)
	// RemoveLeftovers removes the network leftovers of sandboxes not in known.
	RemoveLeftovers(ctx context.Context, known map[string]bool) ([]string, error)
}

// The daemon's components fit the seams.
var (
	_ Cocoon     = cocoonClient{}
	_ PodNetwork = (*tapmanager.Manager)(nil)
)
