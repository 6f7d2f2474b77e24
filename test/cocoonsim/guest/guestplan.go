package guest

import (
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
)

// guestFilesDir is the directory of the VM's run dir that holds the guest's own files: what a
// real guest keeps on its disk, here kept beside the VM so the host's files are never touched.
const guestFilesDir = "guest"

// planEnv carries the osPlan to the guest OS process.
const planEnv = "_COCOON_SIM_GUEST_PLAN"

// osPlan is what the hypervisor hands the guest OS process at start: what a real guest reads
// from its disks and boot arguments.
type osPlan struct {
	Hostname string `json:"hostname"`
	// RunDir is the VM's run dir, which must stay visible inside the guest (sshd reads there).
	RunDir string `json:"run_dir"`
	// Files are bind-mounted over guest paths in the guest's mount namespace; a directory over a
	// directory.
	Files []guestFile `json:"files"`
	// HTTPPort, when not zero, is where the guest serves its web page.
	HTTPPort int `json:"http_port,omitempty"`
	// SSHDConfig, when set, is the sshd_config of the guest's sshd.
	SSHDConfig string `json:"sshd_config,omitempty"`
	// NoAgent: the guest runs no cocoon-agent.
	NoAgent bool `json:"no_agent,omitempty"`
	// RestoreShm: the guest comes back from a snapshot whose memory holds a tmpfs, which it
	// reads from the memory file on shmImageFD into its /dev/shm before anything runs in it.
	RestoreShm bool `json:"restore_shm,omitempty"`
}

// guestFile is a file of the run dir that the guest sees at Path.
type guestFile struct {
	Path   string `json:"path"`
	Source string `json:"source"`
}

// planGuest writes the guest's files for this boot into the run dir and returns the plan the
// guest OS starts from. /etc/resolv.conf, /etc/hostname and /etc/hosts are written afresh from
// the network state on every boot or restore, as cloud-init or the initramfs would; sshd's host
// key is made once per VM and kept. /etc/machine-id is the one a restored snapshot had
// (restoredMachineID: every clone of a snapshot shares it until reseeded), else the one this VM's
// disk already has, else a new one, as systemd makes it on first boot.
func planGuest(runDir string, spec Spec, netState guestNetwork, restoredMachineID string) (osPlan, error) {
	hostname := netState.Hostname
	if hostname == "" {
		hostname = "localhost"
	}
	plan := osPlan{Hostname: hostname, RunDir: runDir, HTTPPort: spec.HTTPPort, NoAgent: spec.NoAgent}
	etcDir := filepath.Join(runDir, guestFilesDir, "etc")
	if err := os.MkdirAll(etcDir, 0o755); err != nil {
		return osPlan{}, fmt.Errorf("guest files: %w", err)
	}
	machineID, err := guestMachineID(runDir, restoredMachineID)
	if err != nil {
		return osPlan{}, err
	}
	for _, f := range []struct{ name, content string }{
		{"resolv.conf", resolvConf(netState.DNS)},
		{"hostname", hostname + "\n"},
		{"hosts", hostsFile(hostname)},
		{"machine-id", machineID + "\n"},
	} {
		source := filepath.Join(etcDir, f.name)
		if err := os.WriteFile(source, []byte(f.content), 0o644); err != nil { //nolint:gosec // world-readable, as in /etc
			return osPlan{}, fmt.Errorf("guest /etc/%s: %w", f.name, err)
		}
		plan.Files = append(plan.Files, guestFile{Path: "/etc/" + f.name, Source: source})
	}
	if spec.Busybox {
		dir, err := writeBusyboxApplets(filepath.Join(runDir, guestFilesDir, "busybox"))
		if err != nil {
			return osPlan{}, fmt.Errorf("guest busybox userland: %w", err)
		}
		plan.Files = append(plan.Files, guestFile{Path: busyboxBinDir, Source: dir})
	}
	if spec.SSHAuthorizedKey != "" {
		config, err := writeSSHDFiles(filepath.Join(runDir, guestFilesDir, "ssh"), spec.SSHAuthorizedKey)
		if err != nil {
			return osPlan{}, fmt.Errorf("guest sshd: %w", err)
		}
		plan.SSHDConfig = config
	}
	return plan, nil
}

// machineIDFile is the guest's /etc/machine-id in the run dir.
func machineIDFile(runDir string) string {
	return filepath.Join(runDir, guestFilesDir, "etc", "machine-id")
}

// readMachineID is the guest's machine-id, "" when it has none yet.
func readMachineID(runDir string) (string, error) {
	data, err := os.ReadFile(machineIDFile(runDir)) //nolint:gosec // the VM's run dir
	if errors.Is(err, fs.ErrNotExist) {
		return "", nil
	}
	return strings.TrimSpace(string(data)), err
}

func guestMachineID(runDir, restored string) (string, error) {
	if restored != "" {
		return restored, nil
	}
	id, err := readMachineID(runDir)
	if err != nil || id != "" {
		return id, err
	}
	return newMachineID()
}

// newMachineID is a fresh machine-id: 128 random bits in lowercase hex, as systemd writes it.
func newMachineID() (string, error) {
	b := make([]byte, 16)
	if _, err := rand.Read(b); err != nil {
		return "", fmt.Errorf("machine-id: %w", err)
	}
	return hex.EncodeToString(b), nil
}

// busyboxBinDir is where the guest's busybox applets appear: the first directory of the guest's
// PATH that holds commands on a Debian host.
const busyboxBinDir = "/usr/local/bin"

// writeBusyboxApplets fills dir with a link to the host's busybox for every applet it has.
func writeBusyboxApplets(dir string) (string, error) {
	busybox, err := exec.LookPath("busybox")
	if err != nil {
		return "", err
	}
	out, err := exec.Command(busybox, "--list").Output()
	if err != nil {
		return "", fmt.Errorf("busybox --list: %w", err)
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return "", err
	}
	for _, applet := range strings.Fields(string(out)) {
		link := filepath.Join(dir, applet)
		if err := os.Symlink(busybox, link); err != nil && !errors.Is(err, fs.ErrExist) {
			return "", err
		}
	}
	return dir, nil
}

func resolvConf(servers []string) string {
	if len(servers) == 0 {
		return "# cocoon-sim guest: the boot configuration names no DNS server\n"
	}
	var b strings.Builder
	for _, s := range servers {
		fmt.Fprintf(&b, "nameserver %s\n", s)
	}
	return b.String()
}

// hostsFile is Debian's default /etc/hosts, with the hostname on 127.0.1.1 as cloud-init puts it.
func hostsFile(hostname string) string {
	return "127.0.0.1\tlocalhost\n" +
		"127.0.1.1\t" + hostname + "\n" +
		"::1\tlocalhost ip6-localhost ip6-loopback\n" +
		"ff02::1\tip6-allnodes\n" +
		"ff02::2\tip6-allrouters\n"
}

func (p osPlan) env() (string, error) {
	data, err := json.Marshal(p)
	if err != nil {
		return "", fmt.Errorf("encode guest plan: %w", err)
	}
	return planEnv + "=" + string(data), nil
}

// readPlan is the guest OS process's side of env.
func readPlan() (osPlan, error) {
	var p osPlan
	if err := json.Unmarshal([]byte(os.Getenv(planEnv)), &p); err != nil {
		return osPlan{}, fmt.Errorf("decode guest plan: %w", err)
	}
	return p, nil
}
