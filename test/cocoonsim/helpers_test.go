package cocoonsim_test

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/cocoonstack/cocoon-cri/pkg/cocoon"
	"github.com/cocoonstack/cocoon-cri/test/cocoonsim"
	"github.com/cocoonstack/cocoon-cri/test/hostguard"
	"github.com/cocoonstack/cocoon-cri/test/stale"
	"github.com/cocoonstack/cocoon-cri/test/testimage"
)

// simBinary is the simulator built once for the whole test run.
var simBinary string

// The prefixes of the tests' temporary directories, which stale.MkdirOwned makes, so that a run
// killed before its cleanups is swept by the next.
const (
	installPrefix = "cs"
	binPrefix     = "cocoonsim-bin"
)

func TestMain(m *testing.M) {
	for _, prefix := range []string{installPrefix, binPrefix} {
		for _, dir := range stale.Dirs(os.TempDir(), prefix) {
			if err := stale.Remove(dir, nil); err != nil {
				fmt.Fprintln(os.Stderr, "cocoonsim tests: what a killed run left:", err)
				os.Exit(1)
			}
			fmt.Fprintln(os.Stderr, "cocoonsim tests: removed what a killed run left:", dir)
		}
	}
	dir, err := stale.MkdirOwned("", binPrefix)
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	simBinary = filepath.Join(dir, "cocoon-sim")
	args := []string{"build", "-o", simBinary}
	if raceEnabled {
		args = append(args, "-race")
		// A race-enabled binary sleeps a second at exit by default; every CLI call would pay it.
		_ = os.Setenv("GORACE", "atexit_sleep_ms=0")
	}
	build := exec.Command("go", append(args, "./cmd/cocoon-sim")...)
	build.Stdout, build.Stderr = os.Stderr, os.Stderr
	if err := build.Run(); err != nil {
		fmt.Fprintln(os.Stderr, "build simulator:", err)
		os.Exit(1)
	}
	host := hostguard.Snapshot()
	code := m.Run()
	_ = os.RemoveAll(dir)
	if err := host.Check(); err != nil {
		fmt.Fprintln(os.Stderr, "cocoonsim tests:", err)
		code = 1
	}
	os.Exit(code)
}

// patience bounds every wait in these tests; generous so a loaded machine does not fail them (CI's
// ran these tests four times slower than a quiet development machine).
const patience = time.Minute

// sim is one isolated cocoon installation: its own root, run, log and CNI config dirs.
type sim struct {
	t                  *testing.T
	root, run, log, ci string
	// env is extra environment for every command; inNetns, when set, starts every command inside
	// a network namespace (see netLab).
	env     []string
	inNetns func(fn func() error) error
}

// newSim makes short temp dirs (unix socket paths must stay under 108 bytes) and registers
// cleanup that first kills every guest the test started, then removes the dirs.
func newSim(t *testing.T) *sim {
	t.Helper()
	base, err := stale.MkdirOwned("", installPrefix)
	if err != nil {
		t.Fatal(err)
	}
	s := &sim{t: t, root: filepath.Join(base, "root"), run: filepath.Join(base, "run"), log: filepath.Join(base, "log"), ci: filepath.Join(base, "cni")}
	// The VMs' namespaces are pinned here, not in the host's /var/run/netns as cocoon's are.
	netns := filepath.Join(base, "netns")
	s.env = []string{cocoonsim.NetnsDirEnv + "=" + netns}
	t.Cleanup(func() {
		if err := cocoonsim.KillGuests(s.run); err != nil {
			t.Errorf("kill guests: %v", err)
		}
		pins, _ := os.ReadDir(netns)
		for _, pin := range pins {
			_ = unix.Unmount(filepath.Join(netns, pin.Name()), unix.MNT_DETACH)
		}
		if err := os.RemoveAll(base); err != nil {
			t.Errorf("remove the installation: %v", err)
		}
	})
	return s
}

// newSimAt is newSim playing a given cocoon release.
func newSimAt(t *testing.T, version string) *sim {
	s := newSim(t)
	s.env = append(s.env, cocoonsim.VersionEnv+"="+version)
	return s
}

// in is the same installation driven from another (sub)test.
func (s *sim) in(t *testing.T) *sim {
	c := *s
	c.t = t
	return &c
}

// result is one finished CLI invocation.
type result struct {
	stdout, stderr string
	code           int
}

// cocoon runs the simulator with this installation's global flags.
func (s *sim) cocoon(args ...string) result {
	s.t.Helper()
	return s.cocoonIn(nil, nil, args...)
}

// cocoonIn runs the simulator with extra environment and stdin.
func (s *sim) cocoonIn(env []string, stdin io.Reader, args ...string) result {
	s.t.Helper()
	return runSimCmd(s.t, "", append(slices.Clone(s.env), env...), stdin, append(s.globalFlags(), args...), s.inNetns)
}

// runSim runs the simulator binary with exactly args.
func runSim(t *testing.T, env []string, stdin io.Reader, args ...string) result {
	t.Helper()
	return runSimCmd(t, "", env, stdin, args, nil)
}

// runSimIn runs the simulator in working directory dir.
func runSimIn(t *testing.T, dir string, args ...string) result {
	t.Helper()
	return runSimCmd(t, dir, nil, nil, args, nil)
}

// runSimCmd runs the simulator; inNetns, if not nil, is where the process is started.
func runSimCmd(t *testing.T, dir string, env []string, stdin io.Reader, args []string, inNetns func(func() error) error) result {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, simBinary, args...)
	cmd.Dir = dir
	cmd.Env = append(os.Environ(), env...)
	cmd.Stdin = stdin
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	var err error
	if inNetns != nil {
		err = inNetns(cmd.Start)
	} else {
		err = cmd.Start()
	}
	if err == nil {
		err = cmd.Wait()
	}
	code := 0
	if exitErr, ok := err.(*exec.ExitError); ok {
		code = exitErr.ExitCode()
	} else if err != nil {
		t.Fatalf("run %v: %v", args, err)
	}
	return result{stdout: stdout.String(), stderr: stderr.String(), code: code}
}

func (s *sim) globalFlags() []string {
	return []string{"--root-dir", s.root, "--run-dir", s.run, "--log-dir", s.log, "--cni-conf-dir", s.ci}
}

// ok runs a command that must succeed and returns its stdout.
func (s *sim) ok(args ...string) string {
	s.t.Helper()
	r := s.cocoon(args...)
	if r.code != 0 {
		s.t.Fatalf("cocoon %v: exit %d\nstdout: %s\nstderr: %s", args, r.code, r.stdout, stripANSI(r.stderr))
	}
	return r.stdout
}

// fails runs a command that must exit 1 with exactly wantErr as its "Error: " line.
func (s *sim) fails(wantErr string, args ...string) result {
	s.t.Helper()
	r := s.cocoon(args...)
	if r.code != 1 {
		s.t.Fatalf("cocoon %v: exit %d, want 1\nstdout: %s\nstderr: %s", args, r.code, r.stdout, stripANSI(r.stderr))
	}
	if got := r.errorLine(); got != "Error: "+wantErr {
		s.t.Fatalf("cocoon %v:\n got: %s\nwant: Error: %s", args, got, wantErr)
	}
	return r
}

var ansiRE = regexp.MustCompile(`\x1b\[[0-9;]*m`)

func stripANSI(s string) string { return ansiRE.ReplaceAllString(s, "") }

// errorLine is the single "Error: ..." line cobra prints on stderr.
func (r result) errorLine() string {
	for line := range strings.Lines(stripANSI(r.stderr)) {
		if strings.HasPrefix(line, "Error: ") {
			return strings.TrimRight(line, "\n")
		}
	}
	return ""
}

func decode[T any](t *testing.T, data string) T {
	t.Helper()
	var v T
	if err := json.Unmarshal([]byte(data), &v); err != nil {
		t.Fatalf("decode %T from %q: %v", v, data, err)
	}
	return v
}

// listVMs is vm list -o json, read as either release prints it ("No VMs found." on v0.3.8).
func (s *sim) listVMs() []cocoon.VM {
	s.t.Helper()
	out := s.ok("vm", "list", "-o", "json")
	if out == "No VMs found.\n" {
		return nil
	}
	return decode[[]cocoon.VM](s.t, out)
}

func (s *sim) inspect(ref string) cocoon.VM {
	s.t.Helper()
	return decode[cocoon.VM](s.t, s.ok("vm", "inspect", ref))
}

// importSnapshot writes a testimage archive for this installation, installs its base files and
// imports it; it returns the options used.
func (s *sim) importSnapshot(opts testimage.SnapshotOptions) testimage.SnapshotOptions {
	s.t.Helper()
	opts.RootDir = s.root
	if err := testimage.InstallBaseFiles(opts); err != nil {
		s.t.Fatal(err)
	}
	var archive bytes.Buffer
	if err := testimage.WriteSnapshotArchive(&archive, opts); err != nil {
		s.t.Fatal(err)
	}
	r := s.cocoonIn(nil, &archive, "snapshot", "import")
	if r.code != 0 {
		s.t.Fatalf("snapshot import: %s", stripANSI(r.stderr))
	}
	return opts
}

// clone clones snapshot into a running VM called name and returns its inspect record.
func (s *sim) clone(snapshot, name string, extra ...string) cocoon.VM {
	s.t.Helper()
	s.ok(append([]string{"vm", "clone", "--name", name, "-o", "json"}, append(extra, snapshot)...)...)
	return s.inspect(name)
}

// reaped reports whether pid is gone, a zombie's reaping included: cocoon's liveness check is
// kill(pid, 0), which a zombie passes, so a test that reads cocoon's view of a hypervisor that
// ended waits for this rather than for testproc.Running to turn false.
func reaped(pid int) bool { return syscall.Kill(pid, 0) != nil }

// eventually polls cond until it holds or patience runs out.
func eventually(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(patience)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// vmInfo asks the guest's API socket for vm.info.
func vmInfo(t *testing.T, socket string) map[string]any {
	t.Helper()
	code, body := apiGet(t, socket, "/api/v1/vm.info")
	if code != http.StatusOK {
		t.Fatalf("vm.info: %d %s", code, body)
	}
	return decode[map[string]any](t, body)
}

// apiGet GETs path from a hypervisor's API socket.
func apiGet(t *testing.T, socket, path string) (int, string) {
	t.Helper()
	hc := &http.Client{Timeout: 5 * time.Second, Transport: &http.Transport{
		DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
			var d net.Dialer
			return d.DialContext(ctx, "unix", socket)
		},
	}}
	resp, err := hc.Get("http://localhost" + path)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close() //nolint:errcheck
	body, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(body)
}

// readUntil reads r until want appears or patience runs out and returns what it read.
func readUntil(t *testing.T, r interface {
	io.Reader
	SetReadDeadline(time.Time) error
}, want string) string {
	t.Helper()
	deadline := time.Now().Add(patience)
	var got []byte
	buf := make([]byte, 4096)
	for !bytes.Contains(got, []byte(want)) {
		if time.Now().After(deadline) {
			t.Fatalf("console never showed %q; got %q", want, got)
		}
		_ = r.SetReadDeadline(time.Now().Add(200 * time.Millisecond))
		n, _ := r.Read(buf)
		got = append(got, buf[:n]...)
	}
	return string(got)
}
