package tapmanager

import (
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"time"

	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"

	"github.com/cocoonstack/cocoon-cri/pkg/atomicfile"
	"github.com/cocoonstack/cocoon-cri/pkg/faultpoint"
	"github.com/cocoonstack/cocoon-cri/pkg/vmstats"
)

// CocoonNetwork is the name of the network in the configuration cocoon-cri writes for each
// sandbox; its VMs are made with cocoon --network CocoonNetwork.
const CocoonNetwork = "cocoon-cri-pod"

// VMIfName is the name cocoon gives a VM's first NIC in its namespace (eth<i>): where the pod
// interface is while a VM holds it.
const VMIfName = "eth0"

// Config locates everything the pod network needs.
type Config struct {
	NetNSDir string   // pod network namespaces
	ConfDir  string   // the cluster's CNI configuration
	BinDirs  []string // the cluster's CNI plugins
	// StateDir holds libcni's cache and, per sandbox, the configuration cocoon reads.
	StateDir string
	// Plugin is the executable that serves the attach plugin (cocoon-cri itself).
	Plugin string
	// Observe, when set, is told the duration and outcome of every CNI ADD and DEL of a pod.
	Observe func(op string, took time.Duration, err error)
}

// Manager owns pod networks: namespaces, the cluster's CNI, and the handover to cocoon.
type Manager struct {
	NetNS
	*CNI
	stateDir string
	plugin   string
}

// NewManager returns a Manager; Init must run before the first sandbox is set up.
func NewManager(cfg Config) *Manager {
	return &Manager{
		NetNS:    NetNS{Dir: cfg.NetNSDir},
		CNI:      NewCNI(cfg.ConfDir, cfg.BinDirs, filepath.Join(cfg.StateDir, "cache"), cfg.Observe),
		stateDir: cfg.StateDir,
		plugin:   cfg.Plugin,
	}
}

// Init installs the attach plugin where cocoon looks for it (a link to cocoon-cri's executable,
// refreshed at every start so an upgraded binary serves it).
func (m *Manager) Init() error {
	if err := os.MkdirAll(m.PluginDir(), 0o755); err != nil {
		return fmt.Errorf("create plugin dir: %w", err)
	}
	link := filepath.Join(m.PluginDir(), AttachPluginName)
	tmp := link + ".new"
	_ = os.Remove(tmp)
	if err := os.Symlink(m.plugin, tmp); err != nil {
		return fmt.Errorf("link attach plugin: %w", err)
	}
	if err := os.Rename(tmp, link); err != nil {
		return fmt.Errorf("link attach plugin: %w", err)
	}
	return nil
}

// PluginDir is cocoon's --cni-bin-dir for pod VMs.
func (m *Manager) PluginDir() string { return filepath.Join(m.stateDir, "bin") }

// CocoonConfDir is cocoon's --cni-conf-dir for the VMs of a sandbox.
func (m *Manager) CocoonConfDir(sandboxID string) string {
	return filepath.Join(m.stateDir, "pods", sandboxID, "net.d")
}

func (m *Manager) holderFile(sandboxID string) string {
	return filepath.Join(m.stateDir, "pods", sandboxID, "holder")
}

// PrepareCocoon writes the configuration cocoon uses for the sandbox's VMs: one network,
// CocoonNetwork, whose only plugin is the attach plugin with the pod's namespace and CNI result.
func (m *Manager) PrepareCocoon(sandboxID, podNetNS string, result json.RawMessage) error {
	list := map[string]any{
		"cniVersion": "1.0.0",
		"name":       CocoonNetwork,
		"plugins": []map[string]any{{
			"type":       AttachPluginName,
			"podNetNS":   podNetNS,
			"holderFile": m.holderFile(sandboxID),
			"podResult":  result,
		}},
	}
	data, err := json.MarshalIndent(list, "", "  ")
	if err != nil {
		return err
	}
	dir := m.CocoonConfDir(sandboxID)
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return fmt.Errorf("create %s: %w", dir, err)
	}
	// Not synced: it names the pod's namespace, which no boot after a power loss has either.
	return atomicfile.Replace(filepath.Join(dir, CocoonNetwork+".conflist"), data, 0o644)
}

// RemoveCocoon deletes the sandbox's cocoon configuration; a missing one is fine.
func (m *Manager) RemoveCocoon(sandboxID string) error {
	if err := os.RemoveAll(filepath.Join(m.stateDir, "pods", sandboxID)); err != nil && !errors.Is(err, os.ErrNotExist) {
		return fmt.Errorf("remove cocoon network configuration: %w", err)
	}
	return nil
}

// ReclaimFromVM takes the pod interface back from a VM's namespace, if that namespace holds it.
// A stopped VM keeps the interface (a move between namespaces costs tens of milliseconds of RCU
// grace periods): the pod's next VM takes it from there, and the cluster's CNI DEL needs it back.
func (m *Manager) ReclaimFromVM(sandboxID, podNetNS, vmNetNS string, result json.RawMessage) error {
	res, err := DecodeResult(result)
	if err != nil {
		return fmt.Errorf("read the pod's CNI result: %w", err)
	}
	held, err := holds(vmNetNS, VMIfName)
	if err != nil || !held {
		// The record names where the interface is: another VM of the pod may have it now.
		return err
	}
	if err := Reclaim(podNetNS, vmNetNS, VMIfName, res); err != nil {
		return fmt.Errorf("take the pod interface back from %s: %w", vmNetNS, err)
	}
	faultpoint.Hit("interface reclaimed")
	return writeHolder(m.holderFile(sandboxID), podNetNS)
}

// holds reports whether the VM namespace at vmNetNS has the pod interface (as ifName). A namespace
// that no longer exists holds nothing, nor does a warm pool VM's placeholder.
func holds(vmNetNS, ifName string) (bool, error) {
	if vmNetNS == "" {
		return false, nil
	}
	if _, err := os.Stat(vmNetNS); errors.Is(err, os.ErrNotExist) {
		return false, nil
	}
	link, err := lookupLink(vmNetNS, ifName)
	return link != nil && isPodInterface(link), err
}

// PodInterfaceCounters reads the pod interface's counters while no VM runs: in the pod's
// namespace, or in the namespace of the stopped VM that still holds it.
func (m *Manager) PodInterfaceCounters(sandboxID, podNetNS string) (vmstats.Interface, error) {
	st, err := m.NetNS.PodInterfaceCounters(podNetNS)
	if !errors.Is(err, unix.ENODEV) {
		return st, err
	}
	holder := readHolder(m.holderFile(sandboxID))
	if holder == "" || holder == podNetNS {
		return st, err
	}
	return heldInterfaceCounters(holder)
}

// heldInterfaceCounters reads the pod interface in a VM's namespace through a handle opened for
// the read: a kept socket would keep the namespace alive after cocoon removes the VM.
func heldInterfaceCounters(vmNetNS string) (vmstats.Interface, error) {
	var st vmstats.Interface
	err := withHandle(vmNetNS, func(h *netlink.Handle) error {
		link, err := h.LinkByName(VMIfName)
		if err != nil {
			return err
		}
		if s := link.Attrs().Statistics; s != nil {
			st = vmstats.Interface{RxBytes: s.RxBytes, TxBytes: s.TxBytes, RxErrors: s.RxErrors, TxErrors: s.TxErrors}
		}
		return nil
	})
	if err != nil {
		return vmstats.Interface{}, fmt.Errorf("counters of the pod interface held in %s: %w", vmNetNS, err)
	}
	st.Name = PodIfName
	return st, nil
}
