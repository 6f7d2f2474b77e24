// Package guest is the process that stands in for cloud-hypervisor and the guest it runs. The cocoon
// simulator starts it detached (see Launch); it serves a Cloud-Hypervisor-like REST API on the VM's
// api.sock, exposes a console (a PTY or a serial unix socket, the way cocoon configures CH), prints a
// boot banner on it and then behaves as the image tells it to (Spec).
package guest

import (
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"time"

	"golang.org/x/crypto/ssh"
)

// SpecFile is the name of the guest behaviour file. Test images carry it (at the root of an OCI
// layer tar, or as a data file of a snapshot archive); the simulator copies it into the VM's run
// directory, where the guest reads it at boot or restore.
const SpecFile = "cocoon-sim-guest.json"

// Spec is what a simulated guest does besides booting, printing its banner and running until it
// is stopped. The zero value is a well-behaved guest.
type Spec struct {
	// IgnorePowerButton makes the guest ignore ACPI power-button presses, so a graceful stop of a
	// UEFI VM has to time out and escalate to SIGTERM.
	IgnorePowerButton bool `json:"ignore_power_button,omitempty"`
	// PoweroffAfter makes the guest power itself off this long after it started running: the
	// hypervisor process exits 0 and, as with real cocoon, nothing updates the VM record.
	PoweroffAfter Duration `json:"poweroff_after,omitempty"`
	// CrashAfter makes the hypervisor process die abruptly (SIGKILL) this long after the guest
	// started running.
	CrashAfter Duration `json:"crash_after,omitempty"`
	// FailBoot makes the hypervisor process exit 1 before its API socket appears, the way a
	// broken kernel or disk image makes a real launch fail.
	FailBoot bool `json:"fail_boot,omitempty"`
	// HTTPPort makes the guest serve HTTP on this TCP port: GET / answers 200 with a small page
	// naming the guest's hostname (what a web server image does; critest's port-forward test
	// wants an HTTP 200 on port 80 of the pod IP). Zero serves nothing.
	HTTPPort int `json:"http_port,omitempty"`
	// SSHAuthorizedKey makes the guest run the host's real sshd on port 22, letting root in with
	// this public key (one authorized_keys line) and nothing else. Empty runs no sshd.
	SSHAuthorizedKey string `json:"ssh_authorized_key,omitempty"`
	// Busybox gives the guest busybox's userland, as a busybox-based image has: busybox's applets
	// come first on the guest's PATH (bound over /usr/local/bin). Its top, unlike procps', runs
	// without a terminal, which critest's default container ("top") needs. The host must have a
	// busybox binary.
	Busybox bool `json:"busybox,omitempty"`
	// NoAgent is a guest without cocoon-agent (an image that does not bake it): the VM's vsock
	// device exists, but nothing in the guest answers on the agent's port.
	NoAgent bool `json:"no_agent,omitempty"`
}

// IsZero reports whether s asks for nothing but the default behaviour.
func (s Spec) IsZero() bool { return s == Spec{} }

// Duration is a time.Duration that reads and writes JSON as a Go duration string ("1.5s").
type Duration time.Duration

// MarshalJSON writes d as a duration string.
func (d Duration) MarshalJSON() ([]byte, error) {
	return json.Marshal(time.Duration(d).String())
}

// UnmarshalJSON reads a duration string such as "500ms" or "2s".
func (d *Duration) UnmarshalJSON(data []byte) error {
	var s string
	if err := json.Unmarshal(data, &s); err != nil {
		return fmt.Errorf("duration must be a string like \"2s\": %w", err)
	}
	parsed, err := time.ParseDuration(s)
	if err != nil {
		return err
	}
	*d = Duration(parsed)
	return nil
}

// ParseSpec decodes a behaviour file's content.
func ParseSpec(data []byte) (Spec, error) {
	var s Spec
	if err := json.Unmarshal(data, &s); err != nil {
		return Spec{}, fmt.Errorf("parse %s: %w", SpecFile, err)
	}
	if err := s.Validate(); err != nil {
		return Spec{}, fmt.Errorf("%s: %w", SpecFile, err)
	}
	return s, nil
}

// Validate rejects a behaviour the guest could not carry out, so a bad image fails when it is
// imported or created rather than at boot.
func (s Spec) Validate() error {
	if s.HTTPPort != 0 {
		switch {
		case s.HTTPPort < 0 || s.HTTPPort > 65535:
			return fmt.Errorf("http_port %d is not a TCP port", s.HTTPPort)
		case s.HTTPPort == ProbePort:
			return fmt.Errorf("http_port %d is the guest's probe port", s.HTTPPort)
		case s.HTTPPort == sshPort && s.SSHAuthorizedKey != "":
			return fmt.Errorf("http_port %d is sshd's port", s.HTTPPort)
		}
	}
	if s.SSHAuthorizedKey != "" {
		if _, _, _, _, err := ssh.ParseAuthorizedKey([]byte(s.SSHAuthorizedKey)); err != nil {
			return fmt.Errorf("ssh_authorized_key: %w", err)
		}
	}
	if s.Busybox {
		if _, err := exec.LookPath("busybox"); err != nil {
			return fmt.Errorf("busybox: the host has no busybox to give the guest (apt install busybox-static): %w", err)
		}
	}
	return nil
}

// ReadSpec reads dir/SpecFile; a missing file means the default behaviour.
func ReadSpec(dir string) (Spec, error) {
	data, err := os.ReadFile(filepath.Join(dir, SpecFile)) //nolint:gosec // dir is a VM run dir
	if errors.Is(err, fs.ErrNotExist) {
		return Spec{}, nil
	}
	if err != nil {
		return Spec{}, fmt.Errorf("read %s: %w", SpecFile, err)
	}
	return ParseSpec(data)
}
