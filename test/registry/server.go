// Package registry runs a real OCI registry for tests (Debian's docker-registry, distribution's
// registry v2) on a loopback address, optionally inside a network namespace and behind
// credentials, and pushes cocoon artifacts to any registry in epoch's exact formats: snapshots,
// cloud images, OCI VM images and multi-arch indexes. A fault proxy in front of a registry breaks
// chosen blob downloads (stall, cut, corrupt).
package registry

import (
	"bytes"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"time"

	"github.com/google/go-containerregistry/pkg/authn"
	"golang.org/x/crypto/bcrypt"

	"github.com/cocoonstack/cocoon-cri/test/testproc"
)

// Binary is the registry server Debian's docker-registry package installs.
const Binary = "docker-registry"

// Options configure a registry server.
type Options struct {
	// NetNS is the path of the network namespace to serve in; empty serves in the caller's.
	NetNS string
	// Addr is the address to listen on (ip:port), one of the namespace's; empty is 127.0.0.1
	// and a free port.
	Addr string
	// Username and Password, when set, are the only credentials the registry accepts.
	Username, Password string
}

// Server is a running registry. Everything it stores is under Dir, removed with it.
type Server struct {
	// Host is its address, ip:port, in its network namespace.
	Host string
	// Dir holds its configuration, log and storage.
	Dir  string
	opts Options
	proc *testproc.Process
}

// Available reports why no registry server can run here, or nil when one can.
func Available() error {
	if _, err := exec.LookPath(Binary); err != nil {
		return fmt.Errorf("%s is not installed (Debian package docker-registry; make setup installs it): %w", Binary, err)
	}
	return nil
}

// Start runs a registry server until the test ends; it fails the test when it cannot.
func Start(t testproc.TB, opts Options) *Server {
	t.Helper()
	if err := Available(); err != nil {
		t.Fatal(err)
	}
	s := &Server{Dir: t.TempDir(), opts: opts}
	if err := s.writeConfig(); err != nil {
		t.Fatal(err)
	}
	if err := s.start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(s.stop)
	if err := s.waitListening(30 * time.Second); err != nil {
		t.Fatalf("registry: %v\n%s", err, s.Log())
	}
	return s
}

func (s *Server) writeConfig() error {
	auth := ""
	if s.opts.Username != "" {
		entry, err := htpasswdEntry(s.opts.Username, s.opts.Password)
		if err != nil {
			return err
		}
		path := filepath.Join(s.Dir, "htpasswd")
		if err := os.WriteFile(path, entry, 0o600); err != nil {
			return err
		}
		auth = fmt.Sprintf("auth:\n  htpasswd:\n    realm: cocoon-cri-test\n    path: %s\n", path)
	}
	addr := s.opts.Addr
	if addr == "" {
		// Port 0: the server picks a free port and logs it.
		addr = "127.0.0.1:0"
	}
	// No blob descriptor cache, so a blob tampered with on disk is served as it now is.
	config := fmt.Sprintf(`version: 0.1
log:
  level: info
  accesslog:
    disabled: true
storage:
  filesystem:
    rootdirectory: %s
  delete:
    enabled: true
  maintenance:
    uploadpurging:
      enabled: false
http:
  addr: %s
  secret: cocoon-cri-test
%s`, filepath.Join(s.Dir, "storage"), addr, auth)
	return os.WriteFile(filepath.Join(s.Dir, "config.yml"), []byte(config), 0o600)
}

// htpasswdEntry is one line of an htpasswd file; the registry accepts bcrypt hashes only.
func htpasswdEntry(user, password string) ([]byte, error) {
	hash, err := bcrypt.GenerateFromPassword([]byte(password), bcrypt.DefaultCost)
	if err != nil {
		return nil, err
	}
	return []byte(user + ":" + string(hash) + "\n"), nil
}

func (s *Server) start() error {
	logFile, err := os.Create(s.logPath())
	if err != nil {
		return err
	}
	defer logFile.Close() //nolint:errcheck
	argv := []string{Binary, "serve", filepath.Join(s.Dir, "config.yml")}
	if s.opts.NetNS != "" {
		// nsenter execs the registry in the namespace: the PID is the registry's.
		argv = append([]string{"nsenter", "--net=" + s.opts.NetNS, "--"}, argv...)
	}
	cmd := exec.Command(argv[0], argv[1:]...) //nolint:gosec // test helper
	cmd.Stdout, cmd.Stderr = logFile, logFile
	if s.proc, err = testproc.Start(cmd); err != nil {
		return fmt.Errorf("start %s: %w", Binary, err)
	}
	return nil
}

var listening = regexp.MustCompile(`listening on ([0-9.]+:\d+)`)

func (s *Server) waitListening(limit time.Duration) error {
	return s.proc.WaitReady(limit, 20*time.Millisecond, func() error {
		m := listening.FindSubmatch([]byte(s.Log()))
		if m == nil {
			return errors.New("it does not listen yet")
		}
		s.Host = string(m[1])
		return nil
	})
}

// stop ends the registry by its PID.
func (s *Server) stop() { _, _ = s.proc.Stop(10 * time.Second) }

func (s *Server) logPath() string { return filepath.Join(s.Dir, "registry.log") }

// Log is what the registry has logged.
func (s *Server) Log() string {
	data, _ := os.ReadFile(s.logPath())
	return string(bytes.TrimSpace(data))
}

// BlobPath is the file holding a blob ("sha256:<hex>"), for tests that tamper with it.
func (s *Server) BlobPath(digest string) string {
	hex := digest[len("sha256:"):]
	return filepath.Join(s.Dir, "storage", "docker", "registry", "v2", "blobs", "sha256", hex[:2], hex, "data")
}

// Target pushes to this registry, with its credentials, from the caller's network namespace.
func (s *Server) Target() Target {
	t := Target{Host: s.Host, Transport: netnsTransport(s.opts.NetNS)}
	if s.opts.Username != "" {
		t.Auth = &authn.Basic{Username: s.opts.Username, Password: s.opts.Password}
	}
	return t
}
