// Package nocloud is the cloud-init NoCloud seed cocoon writes for a cloud image VM (cidata.img):
// what cocoon puts in it (Write) and what a guest finds on it (Read).
//
// The content is cocoon's metadata.Generate: meta-data, user-data and, when the VM has NICs,
// network-config, on a FAT12 volume labelled CIDATA (package fat12). Two revisions of it:
// v0.3.8's (metadata/metadata.go at tag v0.3.8, 34c6c4a) and the v0.5 sources'
// (metadata/metadata.go@0dcdeefb), which differ in three places: network-config ends with a
// catch-all "zfallback" entry (DHCP on any e* NIC nothing else matches), user-data's networkd
// fallback units put RequiredForOnline under [Link], and a password is set by chpasswd for root
// only (a non-root user gets it from runcmd alone, and only with a user name).
package nocloud

import (
	"bytes"
	"fmt"
	"io"
	"os"
	"strings"
	"time"

	"github.com/cocoonstack/cocoon-cri/test/cocoonsim/internal/fat12"
)

// Label is the seed's volume label (cocoon's cidataLabel).
const Label = "CIDATA"

// The seed's files.
const (
	MetaDataFile      = "meta-data"
	UserDataFile      = "user-data"
	NetworkConfigFile = "network-config"
)

// Revision selects which cocoon release's seed content Write produces.
type Revision int

const (
	// V038 is cocoon v0.3.8's.
	V038 Revision = iota
	// V05 is the v0.5 sources'.
	V05
)

// Config is what cocoon's generateCidata hands metadata.Generate.
type Config struct {
	InstanceID string // the VM's ID
	Hostname   string // the VM's name
	Username   string // vm create --user
	Password   string // vm create --password
	Networks   []NIC  // the VM's NICs that have a MAC, in order
	Mounts     []Mount
	DNS        []string // the configured DNS servers
}

// NIC is one guest interface: matched by MAC, a static address when IP is set, DHCP otherwise.
type NIC struct {
	MAC     string
	IP      string
	Prefix  int
	Gateway string
}

// Mount is one cloud-init mounts: row (cocoon's buildMountSpecs: a data disk with a mount point
// and a file system, by its /dev/disk/by-id name, "defaults,nofail").
type Mount struct {
	Device, MountPoint, FSType, Options string
}

// Files renders the seed's files as cocoon does.
func Files(cfg *Config, rev Revision) map[string][]byte {
	files := map[string][]byte{
		MetaDataFile: fmt.Appendf(nil, "instance-id: %s\nlocal-hostname: %s\n", cfg.InstanceID, cfg.Hostname),
		UserDataFile: userData(cfg, rev),
	}
	if len(cfg.Networks) > 0 {
		files[NetworkConfigFile] = networkConfig(cfg, rev)
	}
	return files
}

// Write writes the seed image to w, its entries stamped with now.
func Write(w io.Writer, cfg *Config, rev Revision, now time.Time) error {
	return fat12.Write(w, Label, Files(cfg, rev), now)
}

// yamlQuote escapes a value for a single-quoted YAML scalar.
func yamlQuote(s string) string { return strings.ReplaceAll(s, "'", "''") }

func userData(cfg *Config, rev Revision) []byte {
	var b bytes.Buffer
	b.WriteString("#cloud-config\n")
	user, pw := cfg.Username, cfg.Password
	// The password's lines. A value goes in verbatim where cocoon does not quote it (runcmd).
	switch {
	case rev == V038 && pw != "":
		fmt.Fprintf(&b, "chpasswd:\n  expire: false\n  list:\n    - '%s:%s'\nssh_pwauth: true\n", user, yamlQuote(pw))
		if user == "root" {
			b.WriteString("disable_root: false\n")
		}
	case rev == V05 && pw != "" && user != "":
		b.WriteString("ssh_pwauth: true\n")
		if user == "root" {
			fmt.Fprintf(&b, "chpasswd:\n  expire: false\n  list:\n    - 'root:%s'\ndisable_root: false\n", yamlQuote(pw))
		}
	}
	if pw != "" && user != "" && user != "root" {
		fmt.Fprintf(&b, "runcmd:\n"+
			"  - [sh, -c, 'id %[1]s >/dev/null 2>&1 || useradd -m -s /bin/bash -N %[1]s']\n"+
			"  - [usermod, -aG, sudo, '%[1]s']\n"+
			"  - [sh, -c, 'echo ''%[1]s:%[2]s'' | chpasswd']\n"+
			"  - [sh, -c, 'echo ''%[1]s ALL=(ALL) NOPASSWD:ALL'' > /etc/sudoers.d/cocoon-%[1]s']\n", user, pw)
	}
	if len(cfg.Mounts) > 0 {
		b.WriteString("mounts:\n")
		for _, m := range cfg.Mounts {
			fmt.Fprintf(&b, "  - ['%s', '%s', '%s', '%s', '0', '2']\n",
				yamlQuote(m.Device), yamlQuote(m.MountPoint), yamlQuote(m.FSType), yamlQuote(m.Options))
		}
	}
	// systemd-networkd units matching each NIC's MAC, for a clone whose netplan no longer
	// matches (cocoon's comment: "netplan PERM-MAC mismatch").
	if len(cfg.Networks) > 0 {
		b.WriteString("write_files:\n")
	}
	const indent = "      "
	for i, n := range cfg.Networks {
		fmt.Fprintf(&b, "  - path: /etc/systemd/network/15-cocoon-id%d.network\n    owner: root:root\n    permissions: '0644'\n    content: |\n", i)
		fmt.Fprintf(&b, indent+"[Match]\n"+indent+"MACAddress=%s\n\n", n.MAC)
		online := map[bool]string{true: "yes", false: "no"}[i == 0]
		if rev == V05 {
			fmt.Fprintf(&b, indent+"[Link]\n"+indent+"RequiredForOnline=%s\n\n", online)
		}
		b.WriteString(indent + "[Network]\n")
		if n.IP != "" {
			fmt.Fprintf(&b, indent+"Address=%s/%d\n", n.IP, n.Prefix)
			if n.Gateway != "" {
				fmt.Fprintf(&b, indent+"Gateway=%s\n", n.Gateway)
			}
			for _, d := range cfg.DNS {
				fmt.Fprintf(&b, indent+"DNS=%s\n", d)
			}
		} else {
			b.WriteString(indent + "DHCP=ipv4\n")
		}
		if rev == V038 {
			fmt.Fprintf(&b, indent+"RequiredForOnline=%s\n", online)
		}
	}
	return b.Bytes()
}

// networkConfig is network-config version 2 (netplan's format): one entry per NIC, matched by
// MAC, named id<i>.
func networkConfig(cfg *Config, rev Revision) []byte {
	var b bytes.Buffer
	b.WriteString("version: 2\nethernets:\n")
	for i, n := range cfg.Networks {
		fmt.Fprintf(&b, "  id%d:\n    match:\n      macaddress: \"%s\"\n", i, n.MAC)
		if n.IP == "" {
			b.WriteString("    dhcp4: true\n")
			continue
		}
		fmt.Fprintf(&b, "    addresses:\n      - %s/%d\n", n.IP, n.Prefix)
		if n.Gateway != "" {
			fmt.Fprintf(&b, "    routes:\n      - to: default\n        via: %s\n", n.Gateway)
		}
		if len(cfg.DNS) > 0 {
			b.WriteString("    nameservers:\n      addresses:\n")
			for _, d := range cfg.DNS {
				fmt.Fprintf(&b, "        - %s\n", d)
			}
		}
	}
	if rev == V05 {
		b.WriteString("  zfallback:\n    match:\n      name: \"e*\"\n    dhcp4: true\n    optional: true\n")
	}
	return b.Bytes()
}

// Seed is what a guest finds on a NoCloud seed: the files cloud-init reads, each nil when absent.
type Seed struct {
	MetaData, UserData, VendorData, NetworkConfig []byte
}

// Read reads a seed disk as a guest does: a FAT12 volume labelled cidata or CIDATA (the labels
// cloud-init looks for) with meta-data and user-data in its root directory (cloud-init's NoCloud
// requires both). Anything else is an error: not a seed cocoon would write.
func Read(path string) (*Seed, error) {
	img, err := os.ReadFile(path) //nolint:gosec // the VM's own seed
	if err != nil {
		return nil, err
	}
	vol, err := fat12.Parse(img)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	if vol.Label != "CIDATA" && vol.Label != "cidata" {
		return nil, fmt.Errorf("%s: volume label %q, not cidata", path, vol.Label)
	}
	file := func(name string) []byte {
		if f, ok := vol.Lookup(name); ok {
			return append([]byte{}, f.Data...)
		}
		return nil
	}
	s := &Seed{MetaData: file(MetaDataFile), UserData: file(UserDataFile), VendorData: file("vendor-data"), NetworkConfig: file(NetworkConfigFile)}
	for name, data := range map[string][]byte{MetaDataFile: s.MetaData, UserDataFile: s.UserData} {
		if data == nil {
			return nil, fmt.Errorf("%s: no %s", path, name)
		}
	}
	return s, nil
}
