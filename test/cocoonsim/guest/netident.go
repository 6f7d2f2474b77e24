package guest

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"maps"
	"net"
	"path/filepath"
	"slices"
	"strconv"
	"strings"

	"sigs.k8s.io/yaml"

	"github.com/cocoonstack/cocoon-cri/test/cocoonsim/internal/nocloud"
)

// cidataFile is the cloud-init seed cocoon writes for cloud images (package nocloud).
const cidataFile = "cidata.img"

// ipv4Config is the IPv4 configuration the guest gives one interface.
type ipv4Config struct {
	Address string `json:"address"` // CIDR, "10.88.0.5/24"
	Gateway string `json:"gateway,omitempty"`
	// Extra are further addresses (CIDR) the guest gave the interface after Address.
	Extra []string `json:"extra,omitempty"`
	// Mac, when set, is the address the guest gave the interface in place of its NIC's.
	Mac string `json:"mac,omitempty"`
	// Down: the guest took the interface down.
	Down bool `json:"down,omitempty"`
}

// guestNetwork is the guest OS's own idea of its network: its hostname, DNS servers and the
// configuration of each interface (eth<i>), settled at boot from what the hypervisor handed it
// and changed since by whatever ran in the guest (ip, hostname: cocoon-cri gives a clone its pod
// address that way). A snapshot takes it from the running guest as it is then (its kernel state:
// addresses, default route, MAC, link state, hostname).
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

// readCidata applies a cloud-init NoCloud seed (a FAT12 volume labelled CIDATA, package nocloud)
// as cloud-init does for what the simulated guest models: the hostname from meta-data's
// local-hostname, and each NIC's static IPv4 address, default gateway and DNS servers from
// network-config (version 2, netplan's format). user-data (users, passwords, mounts, files) is
// not applied. No seed means no configuration; a seed that is not one cocoon would write (not
// FAT12, another label, no meta-data or user-data, YAML that does not parse) is an error.
func readCidata(path string, nets []Net) (guestNetwork, error) {
	gn := guestNetwork{Interfaces: map[string]ipv4Config{}}
	seed, err := nocloud.Read(path)
	if errors.Is(err, fs.ErrNotExist) {
		return gn, nil
	}
	if err != nil {
		return gn, fmt.Errorf("read cloud-init seed: %w", err)
	}
	if gn.Hostname, err = seedHostname(seed.MetaData); err != nil {
		return gn, fmt.Errorf("cloud-init seed %s: meta-data: %w", path, err)
	}
	if seed.NetworkConfig == nil {
		return gn, nil
	}
	ethernets, err := parseNetworkConfig(seed.NetworkConfig)
	if err != nil {
		return gn, fmt.Errorf("cloud-init seed %s: network-config: %w", path, err)
	}
	for i, n := range nets {
		ifName := "eth" + strconv.Itoa(i)
		e := firstMatch(ethernets, ifName, n.Mac)
		if e == nil {
			continue
		}
		if addr := e.staticIPv4(); addr != "" {
			gn.Interfaces[ifName] = ipv4Config{Address: addr, Gateway: e.defaultGateway()}
		}
		for _, d := range e.Nameservers.Addresses {
			if !slices.Contains(gn.DNS, d) {
				gn.DNS = append(gn.DNS, d)
			}
		}
	}
	return gn, nil
}

// seedHostname is the hostname cloud-init gives the guest from meta-data's local-hostname: the
// part before the first dot (the rest is the domain), or ip-a-b-c-d for an IPv4 address. None
// leaves the guest's own.
func seedHostname(metaData []byte) (string, error) {
	var meta map[string]json.RawMessage
	if err := yamlUnmarshal(metaData, &meta); err != nil {
		return "", err
	}
	raw, ok := meta["local-hostname"]
	if !ok || string(raw) == "null" {
		return "", nil
	}
	var host string
	if json.Unmarshal(raw, &host) != nil {
		host = string(raw) // a number, as YAML reads a name like 1234
	}
	if ip := net.ParseIP(host); ip != nil && ip.To4() != nil && strings.Count(host, ".") == 3 {
		return "ip-" + strings.ReplaceAll(host, ".", "-"), nil
	}
	host, _, _ = strings.Cut(host, ".")
	return host, nil
}

// yamlUnmarshal reads YAML as cloud-init's loader does for the values used here, numbers kept as
// written.
func yamlUnmarshal(data []byte, v any) error {
	j, err := yaml.YAMLToJSON(data)
	if err != nil {
		return err
	}
	dec := json.NewDecoder(bytes.NewReader(j))
	dec.UseNumber()
	return dec.Decode(v)
}

// ethernet is one entry of network-config's ethernets, as far as the simulated guest models it.
type ethernet struct {
	id    string
	Match *struct {
		MACAddress string `json:"macaddress"`
		Name       string `json:"name"`
		Driver     string `json:"driver"`
	} `json:"match"`
	Addresses []string `json:"addresses"`
	Gateway4  string   `json:"gateway4"`
	Routes    []struct {
		To  string `json:"to"`
		Via string `json:"via"`
	} `json:"routes"`
	Nameservers struct {
		Addresses []string `json:"addresses"`
	} `json:"nameservers"`
}

// parseNetworkConfig reads network-config version 2, bare or under a top-level network: key, and
// returns its ethernets in the order systemd-networkd tries netplan's units for them: by ID.
func parseNetworkConfig(data []byte) ([]*ethernet, error) {
	type v2 struct {
		Version   json.Number          `json:"version"`
		Ethernets map[string]*ethernet `json:"ethernets"`
	}
	var doc struct {
		v2
		Network *v2 `json:"network"`
	}
	if err := yamlUnmarshal(data, &doc); err != nil {
		return nil, err
	}
	cfg := doc.v2
	if doc.Network != nil {
		cfg = *doc.Network
	}
	if cfg.Version != "2" {
		return nil, fmt.Errorf("version %q: the simulated guest reads version 2 only", cfg.Version)
	}
	var out []*ethernet
	for _, id := range slices.Sorted(maps.Keys(cfg.Ethernets)) {
		if e := cfg.Ethernets[id]; e != nil {
			e.id = id
			out = append(out, e)
		}
	}
	return out, nil
}

// firstMatch is the entry that configures an interface: the first whose match it meets (all of
// its keys; an entry without match: names its interface by its ID), as networkd applies the
// first matching unit.
func firstMatch(ethernets []*ethernet, ifName, mac string) *ethernet {
	for _, e := range ethernets {
		m := e.Match
		switch {
		case m == nil:
			if e.id == ifName {
				return e
			}
		case m.Driver != "": // the guest's NICs have no driver to match
		case m.MACAddress != "" && !strings.EqualFold(m.MACAddress, mac):
		case m.Name != "" && !globMatch(m.Name, ifName):
		case m.MACAddress == "" && m.Name == "":
		default:
			return e
		}
	}
	return nil
}

func globMatch(pattern, name string) bool {
	ok, err := filepath.Match(pattern, name)
	return err == nil && ok
}

// staticIPv4 is the entry's first IPv4 address with its prefix; "" for none (DHCP or nothing).
func (e *ethernet) staticIPv4() string {
	for _, a := range e.Addresses {
		if ip, _, err := net.ParseCIDR(a); err == nil && ip.To4() != nil {
			return a
		}
	}
	return ""
}

// defaultGateway is the via of the entry's IPv4 default route, or its gateway4.
func (e *ethernet) defaultGateway() string {
	for _, r := range e.Routes {
		if (r.To == "default" || r.To == "0.0.0.0/0") && net.ParseIP(r.Via).To4() != nil {
			return r.Via
		}
	}
	return e.Gateway4
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
