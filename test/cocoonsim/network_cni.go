package cocoonsim

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"io/fs"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"

	"github.com/containernetworking/cni/libcni"
	"github.com/containernetworking/cni/pkg/invoke"
	cnitypes "github.com/containernetworking/cni/pkg/types"
	current "github.com/containernetworking/cni/pkg/types/100"
	"github.com/containernetworking/cni/pkg/version"

	"github.com/cocoonstack/cocoon-cri/pkg/cocoon"
)

// cniNetwork is cocoon's CNI provider (network/cni): per VM a named netns, per NIC a libcni ADD
// of the chosen conflist with interface eth<i>, and a TAP wired to that interface with tc.
// Records of the NICs live in <root>/cni/db/networks.json; libcni caches results in
// <root>/cni/cache.
type cniNetwork struct {
	log         *logger
	confDir     string
	confLists   map[string]*libcni.NetworkConfigList // conflist name -> conflist
	defaultName string                               // first conflist file alphabetically
	cni         *libcni.CNIConfig                    // nil when no conflist could be loaded
	db          jsonDB[networkIndex]
}

func newCNINetwork(conf *Config, log *logger) (*cniNetwork, error) {
	dir := filepath.Join(conf.RootDir, "cni")
	dbDir := filepath.Join(dir, "db")
	if err := ensureDirs(dbDir); err != nil {
		return nil, fmt.Errorf("ensure cni dirs: %w", err)
	}
	c := &cniNetwork{
		log:     log,
		confDir: conf.CNIConfDir,
		db:      jsonDB[networkIndex]{path: filepath.Join(dbDir, "networks.json"), lockPath: filepath.Join(dbDir, "networks.lock")},
	}
	// Like cocoon, a conf dir without usable conflists only makes config() fail; deleting and
	// listing networks still work.
	if lists, defaultName, err := loadConfLists(conf.CNIConfDir); err == nil {
		c.confLists, c.defaultName = lists, defaultName
		// The executor is libcni's default, given explicitly: left nil, libcni creates it lazily
		// and unsynchronised, a data race once several VMs are deleted concurrently.
		pluginExec := &invoke.DefaultExec{RawExec: &invoke.RawExec{Stderr: os.Stderr}, PluginDecoder: version.PluginDecoder{}}
		c.cni = libcni.NewCNIConfigWithCacheDir([]string{conf.CNIBinDir}, filepath.Join(dir, "cache"), pluginExec)
	}
	return c, nil
}

// loadConfLists parses every *.conflist in dir; the first file alphabetically is the default.
func loadConfLists(dir string) (map[string]*libcni.NetworkConfigList, string, error) {
	files, err := libcni.ConfFiles(dir, []string{".conflist"})
	if err != nil {
		return nil, "", err
	}
	if len(files) == 0 {
		return nil, "", fmt.Errorf("no .conflist files in %s", dir)
	}
	lists := map[string]*libcni.NetworkConfigList{}
	var defaultName string
	for _, f := range files {
		list, err := libcni.ConfListFromFile(f)
		if err != nil {
			return nil, "", fmt.Errorf("parse %s: %w", f, err)
		}
		lists[list.Name] = list
		if defaultName == "" {
			defaultName = list.Name
		}
	}
	return lists, defaultName, nil
}

// confList resolves a conflist by name; "" is the default.
func (c *cniNetwork) confList(name string) (*libcni.NetworkConfigList, error) {
	if len(c.confLists) == 0 {
		return nil, fmt.Errorf("%w: no conflist found in %s", errNetworkNotConfigured, c.confDir)
	}
	if name == "" {
		name = c.defaultName
	}
	list, ok := c.confLists[name]
	if !ok {
		return nil, fmt.Errorf("conflist %q not found (available: %s)", name, strings.Join(slices.Sorted(maps.Keys(c.confLists)), ", "))
	}
	return list, nil
}

func (c *cniNetwork) verify(vmID string) error {
	path := netnsPath(vmID)
	if _, err := os.Stat(path); err != nil {
		return fmt.Errorf("netns %s: %w", path, err)
	}
	return nil
}

// config creates the VM's netns and wires numNICs NICs into it. With existing configs (recovery
// of a VM whose netns vanished) each NIC first gets a CNI DEL, then an ADD that asks IPAM for its
// old IP, and keeps its old MAC; records are not touched then. On failure everything added so far
// is deleted again and the netns removed. vmCfg.Network is set to the conflist used.
func (c *cniNetwork) config(ctx context.Context, vmID string, numNICs int, vmCfg *cocoon.VMConfig, queues int, existing ...*cocoon.NetworkConfig) (configs []*cocoon.NetworkConfig, retErr error) {
	if c.cni == nil {
		return nil, fmt.Errorf("%w: no conflist found in %s", errNetworkNotConfigured, c.confDir)
	}
	list, err := c.confList(vmCfg.Network)
	if err != nil {
		return nil, err
	}
	vmCfg.Network = list.Name
	logger := c.log.with("cni.Config")
	nsName, nsPath := netnsName(vmID), netnsPath(vmID)
	if err := createNetns(nsName); err != nil {
		return nil, fmt.Errorf("create netns %s: %w", nsName, err)
	}
	var added []string
	defer func() {
		if retErr == nil {
			return
		}
		for _, ifName := range added {
			if err := c.cni.DelNetworkList(ctx, list, &libcni.RuntimeConf{ContainerID: vmID, NetNS: nsPath, IfName: ifName}); err != nil {
				logger.Warnf("rollback CNI DEL %s/%s: %v", vmID, ifName, err)
			}
		}
		_ = deleteNetns(ctx, nsName)
	}()

	numQueues := cmp.Or(queues, netNumQueues(vmCfg.CPU))
	for i := range numNICs {
		ifName := fmt.Sprintf("eth%d", i)
		rt := &libcni.RuntimeConf{ContainerID: vmID, NetNS: nsPath, IfName: ifName}
		var old *cocoon.NetworkConfig
		if i < len(existing) {
			old = existing[i]
		}
		if old != nil {
			if err := c.cni.DelNetworkList(ctx, list, rt); err != nil {
				logger.Warnf("pre-recovery CNI DEL %s/%s: %v (continuing)", vmID, ifName, err)
			}
			if old.Network != nil && old.Network.IP != "" {
				rt.Args = [][2]string{{"IgnoreUnknown", "1"}, {"IP", old.Network.IP}}
			}
		}
		result, err := c.cni.AddNetworkList(ctx, list, rt)
		if err != nil {
			return nil, fmt.Errorf("cni add %s/%s: %w", vmID, ifName, err)
		}
		added = append(added, ifName)
		ipConf, err := firstIPv4(result)
		if err != nil {
			return nil, fmt.Errorf("parse CNI result: %w", err)
		}
		var overrideMAC string
		if old != nil {
			overrideMAC = old.Mac
		}
		tapName := fmt.Sprintf("tap%s-%d", vmIDPrefix(vmID), i)
		mac, err := setupTCRedirect(nsPath, ifName, tapName, numQueues, overrideMAC)
		if err != nil {
			return nil, fmt.Errorf("setup tc-redirect %s: %w", vmID, err)
		}
		configs = append(configs, &cocoon.NetworkConfig{
			Tap: tapName, Mac: mac, NumQueues: numQueues, QueueSize: resolveNetQueueSize(vmCfg.QueueSize),
			Backend: backendCNI, NetnsPath: nsPath, Network: ipConf,
		})
	}
	if len(existing) > 0 {
		return configs, nil
	}
	return configs, c.db.Update(ctx, func(idx *networkIndex) error {
		for i, nc := range configs {
			id := generateID()
			rec := &networkRecord{ID: id, Type: list.Name, VMID: vmID, IfName: fmt.Sprintf("eth%d", i)}
			if nc.Network != nil {
				rec.Network = *nc.Network
			}
			idx.Networks[id] = rec
		}
		return nil
	})
}

// firstIPv4 is the guest's static configuration: the first IPv4 address of a CNI result, or nil
// when IPAM gave none (the guest then uses DHCP).
func firstIPv4(result cnitypes.Result) (*cocoon.Network, error) {
	res, err := current.NewResultFromResult(result)
	if err != nil {
		return nil, fmt.Errorf("convert CNI result: %w", err)
	}
	for _, ipc := range res.IPs {
		if ipc.Address.IP.To4() == nil {
			continue
		}
		prefix, _ := ipc.Address.Mask.Size()
		n := &cocoon.Network{IP: ipc.Address.IP.String(), Prefix: prefix}
		if ipc.Gateway != nil {
			n.Gateway = ipc.Gateway.String()
		}
		return n, nil
	}
	return nil, nil
}

// remove releases the networks of deleted VMs, concurrently and best effort: per VM a CNI DEL of
// every recorded NIC (failures only logged: IPAM bookkeeping), the netns, then the records. A VM
// without records has nothing to clean.
func (c *cniNetwork) remove(ctx context.Context, vmIDs []string) error {
	errs := make([]error, len(vmIDs))
	var wg sync.WaitGroup
	for i, vmID := range vmIDs {
		wg.Go(func() {
			if err := c.removeVM(ctx, vmID); err != nil {
				errs[i] = fmt.Errorf("item %s: %w", vmID, err)
			}
		})
	}
	wg.Wait()
	return errors.Join(errs...)
}

func (c *cniNetwork) removeVM(ctx context.Context, vmID string) error {
	var records []networkRecord
	if err := c.db.With(ctx, func(idx *networkIndex) error {
		records = idx.byVMID(vmID)
		return nil
	}); err != nil {
		return fmt.Errorf("read network index: %w", err)
	}
	if len(records) == 0 {
		return nil
	}
	nsPath := netnsPath(vmID)
	c.delNICs(ctx, vmID, nsPath, records)
	if err := deleteNetns(ctx, netnsName(vmID)); err != nil && !errors.Is(err, fs.ErrNotExist) {
		return fmt.Errorf("remove netns %s: %w", nsPath, err)
	}
	return c.db.Update(ctx, func(idx *networkIndex) error {
		idx.dropVM(vmID)
		return nil
	})
}

func (c *cniNetwork) delNICs(ctx context.Context, vmID, nsPath string, records []networkRecord) {
	if c.cni == nil {
		return
	}
	logger := c.log.with("cni.delNICs")
	for _, rec := range records {
		list, err := c.confList(rec.Type)
		if err != nil {
			logger.Warnf("conflist %q not found for CNI DEL %s/%s: %v", rec.Type, vmID, rec.IfName, err)
			continue
		}
		if err := c.cni.DelNetworkList(ctx, list, &libcni.RuntimeConf{ContainerID: vmID, NetNS: nsPath, IfName: rec.IfName}); err != nil {
			logger.Warnf("CNI DEL %s/%s: %v", vmID, rec.IfName, err)
		}
	}
}
