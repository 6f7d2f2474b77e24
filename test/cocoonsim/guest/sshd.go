package guest

import (
	"crypto/ed25519"
	"crypto/rand"
	"encoding/pem"
	"errors"
	"fmt"
	"io/fs"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"time"

	"golang.org/x/crypto/ssh"
)

const (
	// sshdBinary is Debian's sshd (package openssh-server). It must be started by its absolute
	// path: it re-executes itself for every connection.
	sshdBinary = "/usr/sbin/sshd"
	sshPort    = 22
	// sshdStartTimeout bounds how long the guest waits for sshd to listen before it is ready.
	sshdStartTimeout = 10 * time.Second
)

// writeSSHDFiles writes the guest sshd's configuration into dir: a host key made for this VM
// (kept across boots, as a real guest keeps its keys on disk), the one authorized key, and an
// sshd_config that lets root in with that key only. It returns the config's path.
func writeSSHDFiles(dir, authorizedKey string) (string, error) {
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return "", err
	}
	hostKey := filepath.Join(dir, "ssh_host_ed25519_key")
	if err := ensureHostKey(hostKey); err != nil {
		return "", err
	}
	authorizedKeys := filepath.Join(dir, "authorized_keys")
	if err := os.WriteFile(authorizedKeys, []byte(authorizedKey+"\n"), 0o600); err != nil {
		return "", err
	}
	config := filepath.Join(dir, "sshd_config")
	// No Include of /etc/ssh/sshd_config.d: the host's sshd settings are not the guest's.
	// StrictModes is off because the run dir may sit under a world-writable /tmp.
	content := fmt.Sprintf(`# cocoon-sim guest sshd: root with the image's key, nothing else
Port %d
HostKey %s
AuthorizedKeysFile %s
PidFile none
AllowUsers root
PermitRootLogin prohibit-password
AuthenticationMethods publickey
PubkeyAuthentication yes
PasswordAuthentication no
KbdInteractiveAuthentication no
PermitEmptyPasswords no
UsePAM no
StrictModes no
UseDNS no
PrintMotd no
Subsystem sftp internal-sftp
`, sshPort, hostKey, authorizedKeys)
	if err := os.WriteFile(config, []byte(content), 0o600); err != nil {
		return "", err
	}
	return config, nil
}

func ensureHostKey(path string) error {
	if _, err := os.Stat(path); err == nil {
		return nil
	} else if !errors.Is(err, fs.ErrNotExist) {
		return err
	}
	_, key, err := ed25519.GenerateKey(rand.Reader)
	if err != nil {
		return fmt.Errorf("generate host key: %w", err)
	}
	block, err := ssh.MarshalPrivateKey(key, "cocoon-sim guest")
	if err != nil {
		return fmt.Errorf("encode host key: %w", err)
	}
	return os.WriteFile(path, pem.EncodeToMemory(block), 0o600)
}

// startSSHD runs sshd in the foreground as a child of the guest OS, logging to the guest's
// stderr (the hypervisor log), and waits until it listens. A guest whose image asks for sshd
// does not come up without it.
func startSSHD(r *reaper, config string) error {
	if _, err := os.Stat(sshdBinary); err != nil {
		return fmt.Errorf("sshd: %w (install openssh-server, see hack/setup.sh)", err)
	}
	cmd := exec.Command(sshdBinary, "-D", "-e", "-f", config)
	cmd.Dir = "/"
	cmd.Env = []string{"PATH=" + guestPATH}
	cmd.Stdout, cmd.Stderr = os.Stderr, os.Stderr
	exited, err := r.start(cmd)
	if err != nil {
		return fmt.Errorf("start sshd: %w", err)
	}
	// Ready means listening. (sshd logs this probe as a connection closed before key exchange.)
	deadline := time.Now().Add(sshdStartTimeout)
	for {
		conn, err := net.DialTimeout("tcp", net.JoinHostPort("127.0.0.1", strconv.Itoa(sshPort)), time.Second)
		if err == nil {
			_ = conn.Close()
			go func() { fmt.Fprintf(os.Stderr, "guest: sshd exited: %s\n", describeExit(<-exited)) }() //nolint:errcheck
			return nil
		}
		select {
		case status := <-exited:
			return fmt.Errorf("sshd exited at start: %s", describeExit(status))
		case <-time.After(50 * time.Millisecond):
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("sshd does not listen on port %d: %w", sshPort, err)
		}
	}
}
