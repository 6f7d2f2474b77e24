package tapmanager

import (
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"time"

	"github.com/cocoonstack/cocoon-cri/pkg/atomicfile"
	"github.com/cocoonstack/cocoon-cri/pkg/faultpoint"
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
	return atomicfile.Write(filepath.Join(dir, CocoonNetwork+".conflist"), data, 0o644)
}

// RemoveCocoon deletes the sandbox's cocoon configuration; a missing one is fine.
func (m *Manager) RemoveCocoon(sandboxID string) error {
	if err := os.RemoveAll(filepath.Join(m.stateDir, "pods", sandboxID)); err != nil && !errors.Is(err, os.ErrNotExist) {
		return fmt.Errorf("remove cocoon network configuration: %w", err)
	}
	return nil
}

// ReclaimFromVM takes the pod interface back from a stopped VM's namespace.
func (m *Manager) ReclaimFromVM(sandboxID, podNetNS, vmNetNS string, result json.RawMessage) error {
	res, err := DecodeResult(result)
	if err != nil {
		return fmt.Errorf("read the pod's CNI result: %w", err)
	}
	if err := Reclaim(podNetNS, vmNetNS, VMIfName, res); err != nil {
		return fmt.Errorf("take the pod interface back from %s: %w", vmNetNS, err)
	}
	faultpoint.Hit("interface reclaimed")
	return writeHolder(m.holderFile(sandboxID), podNetNS)
}
