package guest

import (
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"strings"
)

// cidataFile is the cloud-init seed cocoon writes for cloud images; the simulator writes it as a
// JSON document (see cocoonsim's writeCidata).
const cidataFile = "cidata.img"

// ipv4Config is the static IPv4 configuration the guest gives one interface.
type ipv4Config struct {
	Address string `json:"address"` // CIDR, "10.88.0.5/24"
	Gateway string `json:"gateway,omitempty"`
}

// guestNetwork is the guest OS's own idea of its network: its hostname, DNS servers and the
// static configuration of each interface (eth<i>), settled at boot from what the hypervisor
// handed it.
// It is guest state: a snapshot keeps it and a restored guest goes on using it, whatever NICs it
// is given afterwards (cocoon's "post-clone IP conflict window"). Interfaces without an entry
// are left unconfigured, as a guest waiting for DHCP.
type guestNetwork struct {
	Hostname   string                `json:"hostname,omitempty"`
	DNS        []string              `json:"dns,omitempty"`
	Interfaces map[string]ipv4Config `json:"interfaces,omitempty"`
}

// networkFromBootArgs is what the guest reads at a cold boot: a direct-boot kernel its command
// line (cocoon.hostname= and the kernel's ip= parameters), a cloud image its cloud-init seed.
func networkFromBootArgs(cfg *VMConfig, runDir string) (guestNetwork, error) {
	if cfg.Payload != nil && cfg.Payload.Kernel != "" {
		return parseKernelCmdline(cfg.Payload.Cmdline), nil
	}
	return readCidata(cidataPath(cfg, runDir), cfg.Nets)
}

// parseKernelCmdline reads cocoon.hostname=NAME and every
// ip=<client>::<gateway>:<netmask>:<hostname>:<device>:<autoconf>[:<dns0>[:<dns1>]].
func parseKernelCmdline(cmdline string) guestNetwork {
	gn := guestNetwork{Interfaces: map[string]ipv4Config{}}
	var ipHostname string
	for _, param := range strings.Fields(cmdline) {
		if name, ok := strings.CutPrefix(param, "cocoon.hostname="); ok {
			gn.Hostname = name
			continue
		}
		value, ok := strings.CutPrefix(param, "ip=")
		if !ok {
			continue
		}
		f := strings.Split(value, ":")
		if len(f) < 6 || f[5] == "" {
			continue
		}
		ip, mask := net.ParseIP(f[0]).To4(), net.ParseIP(f[3]).To4()
		if ip == nil || mask == nil {
			continue
		}
		prefix, _ := net.IPMask(mask).Size()
		gn.Interfaces[f[5]] = ipv4Config{Address: fmt.Sprintf("%s/%d", ip, prefix), Gateway: f[2]}
		if ipHostname == "" {
			ipHostname = f[4]
		}
		// As the kernel's ipconfig, the first ip= that names DNS servers sets them.
		if len(gn.DNS) == 0 {
			gn.DNS = dnsFields(f)
		}
	}
	if gn.Hostname == "" {
		gn.Hostname = ipHostname
	}
	return gn
}

// cidataPath is the seed disk attached to the VM or, once cocoon stops attaching it after the
// first boot, the seed in the run dir: what cloud-init applied then is what the guest keeps
// using.
func cidataPath(cfg *VMConfig, runDir string) string {
	for _, d := range cfg.Disks {
		if filepath.Base(d.Path) == cidataFile {
			return d.Path
		}
	}
	return filepath.Join(runDir, cidataFile)
}

// readCidata applies a cloud-init seed the way cloud-init matches it: each NIC takes the entry
// with its MAC; an entry without an IP means DHCP. No seed means no static configuration.
func readCidata(path string, nets []Net) (guestNetwork, error) {
	gn := guestNetwork{Interfaces: map[string]ipv4Config{}}
	data, err := os.ReadFile(path) //nolint:gosec // the VM's own seed
	if errors.Is(err, fs.ErrNotExist) {
		return gn, nil
	}
	if err != nil {
		return gn, fmt.Errorf("read cloud-init seed: %w", err)
	}
	var seed struct {
		Hostname string   `json:"hostname"`
		DNS      []string `json:"dns"`
		Networks []struct {
			Mac     string `json:"mac"`
			Network *struct {
				IP      string `json:"ip"`
				Gateway string `json:"gateway"`
				Prefix  int    `json:"prefix"`
			} `json:"network"`
		} `json:"networks"`
	}
	if err := json.Unmarshal(data, &seed); err != nil {
		return gn, fmt.Errorf("parse cloud-init seed %s: %w", path, err)
	}
	gn.Hostname, gn.DNS = seed.Hostname, seed.DNS
	for i, n := range nets {
		for _, entry := range seed.Networks {
			if entry.Network == nil || entry.Network.IP == "" || !strings.EqualFold(entry.Mac, n.Mac) {
				continue
			}
			gn.Interfaces["eth"+strconv.Itoa(i)] = ipv4Config{
				Address: fmt.Sprintf("%s/%d", entry.Network.IP, entry.Network.Prefix),
				Gateway: entry.Network.Gateway,
			}
		}
	}
	return gn, nil
}

// dnsFields are the <dns0>:<dns1> fields (the 8th and 9th) of an ip= parameter that hold an
// address.
func dnsFields(fields []string) []string {
	if len(fields) <= 7 {
		return nil
	}
	var servers []string
	for _, f := range fields[7:min(len(fields), 9)] {
		if net.ParseIP(f) != nil {
			servers = append(servers, f)
		}
	}
	return servers
}
