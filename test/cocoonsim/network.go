package cocoonsim

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"net"
	"os"
	"path/filepath"
	"slices"
	"strings"

	"github.com/cocoonstack/cocoon-cri/pkg/cocoon"
)

// Networking. cocoon gives each VM NIC either a CNI network in a netns of its own
// ("cocoon-<VMID>": libcni ADD per NIC, veth<->TAP redirect, MAC copied to the guest) or a TAP on
// an existing bridge. This version of the simulator supports --nics 0 fully; the provider
// structure below is where real CNI and bridge wiring go next. Until then a provider fails
// before touching anything: exactly as cocoon when there is no conflist or no bridge device, and
// with an explicit "not simulated" error otherwise. It never fakes a network.

var errNetworkNotConfigured = errors.New("network provider not configured")

// networkProvider is cocoon's network.Network as far as VM creation uses it.
type networkProvider interface {
	config(ctx context.Context, vmID string, nics int, spec *vmSpec) ([]*cocoon.NetworkConfig, error)
}

// initNetwork configures the NICs of a new VM; no NICs means no network at all.
func (a *app) initNetwork(ctx context.Context, vmID string, nics int, spec *vmSpec, bridgeDev string) ([]*cocoon.NetworkConfig, error) {
	if nics <= 0 {
		return nil, nil
	}
	var provider networkProvider
	var err error
	if bridgeDev != "" {
		provider, err = newBridgeNetwork(bridgeDev)
		if err != nil {
			err = fmt.Errorf("init bridge network: %w", err)
		}
	} else {
		provider, err = newCNINetwork(a.conf)
		if err != nil {
			err = fmt.Errorf("init network: %w", err)
		}
	}
	if err != nil {
		return nil, fmt.Errorf("init network: %w", err)
	}
	configs, err := provider.config(ctx, vmID, nics, spec)
	if err != nil {
		return nil, fmt.Errorf("configure network: %w", err)
	}
	return configs, nil
}

// releaseNetworks is the network cleanup of vm rm: it drops the CNI records of deleted VMs. As in
// cocoon, a CNI provider that cannot even be set up means there is nothing to clean.
func (a *app) releaseNetworks(ctx context.Context, vmIDs []string) error {
	cni, err := newCNINetwork(a.conf)
	if err != nil {
		return nil //nolint:nilerr // cocoon skips network cleanup when the provider cannot init
	}
	return cni.release(ctx, vmIDs)
}

// cniNetwork is the CNI provider: conflists from --cni-conf-dir, records in <root>/cni/db.
type cniNetwork struct {
	confDir     string
	confLists   map[string]string // conflist name -> file
	defaultName string
	db          jsonDB[networkIndex]
}

// networkRecord is one NIC in <root>/cni/db/networks.json.
type networkRecord struct {
	Network cocoon.Network `json:"network"`
	ID      string         `json:"id"`
	Type    string         `json:"type"`
	VMID    string         `json:"vm_id"`
	IfName  string         `json:"if_name"`
}

type networkIndex struct {
	Networks map[string]*networkRecord `json:"networks"`
}

func (idx *networkIndex) initMaps() {
	if idx.Networks == nil {
		idx.Networks = map[string]*networkRecord{}
	}
}

func newCNINetwork(conf *Config) (*cniNetwork, error) {
	dbDir := filepath.Join(conf.RootDir, "cni", "db")
	if err := ensureDirs(dbDir); err != nil {
		return nil, fmt.Errorf("ensure cni dirs: %w", err)
	}
	c := &cniNetwork{
		confDir: conf.CNIConfDir,
		db:      jsonDB[networkIndex]{path: filepath.Join(dbDir, "networks.json"), lockPath: filepath.Join(dbDir, "networks.lock")},
	}
	// Like cocoon, an unreadable or unparsable conf dir only makes config() fail later.
	c.confLists, c.defaultName, _ = loadConfLists(conf.CNIConfDir)
	return c, nil
}

// loadConfLists reads the name of every *.conflist in dir; the first file alphabetically is the
// default.
func loadConfLists(dir string) (map[string]string, string, error) {
	files, err := filepath.Glob(filepath.Join(dir, "*.conflist"))
	if err != nil || len(files) == 0 {
		return nil, "", fmt.Errorf("no .conflist files in %s", dir)
	}
	slices.Sort(files)
	lists := map[string]string{}
	var defaultName string
	for _, f := range files {
		data, err := os.ReadFile(f) //nolint:gosec // operator-supplied CNI config
		if err != nil {
			return nil, "", err
		}
		var cl struct {
			Name string `json:"name"`
		}
		if err := json.Unmarshal(data, &cl); err != nil {
			return nil, "", fmt.Errorf("parse %s: %w", f, err)
		}
		lists[cl.Name] = f
		if defaultName == "" {
			defaultName = cl.Name
		}
	}
	return lists, defaultName, nil
}

func (c *cniNetwork) config(_ context.Context, _ string, _ int, spec *vmSpec) ([]*cocoon.NetworkConfig, error) {
	if len(c.confLists) == 0 {
		return nil, fmt.Errorf("%w: no conflist found in %s", errNetworkNotConfigured, c.confDir)
	}
	name := spec.Network
	if name == "" {
		name = c.defaultName
	}
	if _, ok := c.confLists[name]; !ok {
		return nil, fmt.Errorf("conflist %q not found (available: %s)", name, strings.Join(slices.Sorted(maps.Keys(c.confLists)), ", "))
	}
	return nil, fmt.Errorf("cocoon-sim: CNI networking is not simulated yet (conflist %q in %s); use --nics 0", name, c.confDir)
}

func (c *cniNetwork) release(ctx context.Context, vmIDs []string) error {
	return c.db.Update(ctx, func(idx *networkIndex) error {
		for id, rec := range idx.Networks {
			if rec != nil && slices.Contains(vmIDs, rec.VMID) {
				delete(idx.Networks, id)
			}
		}
		return nil
	})
}

// bridgeNetwork is the --bridge provider: a TAP per NIC on an existing Linux bridge.
type bridgeNetwork struct {
	dev string
}

func newBridgeNetwork(dev string) (*bridgeNetwork, error) {
	if _, err := net.InterfaceByName(dev); err != nil {
		return nil, fmt.Errorf("bridge %s: Link not found", dev)
	}
	if _, err := os.Stat(filepath.Join("/sys/class/net", dev, "bridge")); err != nil {
		return nil, fmt.Errorf("%s is not a bridge (type: %s)", dev, linkType(dev))
	}
	return &bridgeNetwork{dev: dev}, nil
}

// linkType reads the kernel's device type of a non-bridge link for cocoon's error message.
func linkType(dev string) string {
	data, err := os.ReadFile(filepath.Join("/sys/class/net", dev, "uevent")) //nolint:gosec // sysfs
	if err == nil {
		for line := range strings.SplitSeq(string(data), "\n") {
			if t, ok := strings.CutPrefix(line, "DEVTYPE="); ok {
				return t
			}
		}
	}
	return "device"
}

func (b *bridgeNetwork) config(context.Context, string, int, *vmSpec) ([]*cocoon.NetworkConfig, error) {
	return nil, fmt.Errorf("cocoon-sim: bridge networking is not simulated yet (bridge %s); use --nics 0", b.dev)
}
