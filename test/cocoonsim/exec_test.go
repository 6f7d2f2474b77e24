package cocoonsim_test

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/cocoonstack/cocoon-cri/test/cocoonsim"
	"github.com/cocoonstack/cocoon-cri/test/cocoonsim/guest"
	"github.com/cocoonstack/cocoon-cri/test/testimage"
	"github.com/cocoonstack/cocoon-cri/test/testproc"
)

// vmExec runs `vm exec` with stdin ("" for none) and the arguments after "exec".
func (s *sim) vmExec(stdin string, args ...string) result {
	s.t.Helper()
	var in io.Reader
	if stdin != "" {
		in = strings.NewReader(stdin)
	}
	return s.cocoonIn(nil, in, append([]string{"vm", "exec"}, args...)...)
}

// inGuest runs a command in the VM's guest that must succeed and returns its stdout.
func (s *sim) inGuest(vm string, argv ...string) string {
	s.t.Helper()
	r := s.vmExec("", append([]string{vm, "--"}, argv...)...)
	if r.code != 0 {
		s.t.Fatalf("vm exec %s -- %v: exit %d\nstdout: %s\nstderr: %s", vm, argv, r.code, r.stdout, stripANSI(r.stderr))
	}
	return r.stdout
}

func TestExecPassesStreamsAndExitCodeThrough(t *testing.T) {
	s := newSim(t)
	s.importSnapshot(testimage.SnapshotOptions{Name: "base"})
	s.clone("base", "box")

	r := s.vmExec("", "box", "--", "sh", "-c", "echo out; echo err >&2; exit 3")
	if r.code != 3 || r.stdout != "out\n" || r.stderr != "err\n" {
		t.Fatalf("exit %d, stdout %q, stderr %q; want 3, %q, %q (no Error: line)", r.code, r.stdout, r.stderr, "out\n", "err\n")
	}
	// cocoon-agent reports a command killed by a signal as -1, which cocoon exits with: 255.
	if r := s.vmExec("", "box", "--", "sh", "-c", "kill -KILL $$"); r.code != 255 || r.stderr != "" {
		t.Fatalf("a command killed by a signal: exit %d, stderr %q; want 255", r.code, r.stderr)
	}
	// Without "--" cobra would read the command's own flags; a lone "--" inside argv is the command.
	if got := s.inGuest("box", "echo", "--", "-n"); got != "-- -n\n" {
		t.Fatalf("argv after --: %q", got)
	}

	// Stdin is the caller's only with -i; otherwise the command reads EOF at once.
	if r := s.vmExec("piped\nlines\n", "-i", "box", "--", "cat"); r.code != 0 || r.stdout != "piped\nlines\n" {
		t.Fatalf("cat with -i: exit %d, stdout %q", r.code, r.stdout)
	}
	if r := s.vmExec("ignored\n", "box", "--", "cat"); r.code != 0 || r.stdout != "" {
		t.Fatalf("cat without -i: exit %d, stdout %q", r.code, r.stdout)
	}

	// A plain environment plus --env (the last value of a key wins), working directory /.
	r = s.vmExec("", "--env", "GREETING=hi", "-e", "EQ=a=b", "-e", "GREETING=hello", "box", "--", "env")
	want := []string{"EQ=a=b", "GREETING=hello", "HOME=/root", "PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"}
	if got := strings.Fields(r.stdout); r.code != 0 || !slices.Equal(got, want) {
		t.Fatalf("env: exit %d, %q, want %q", r.code, got, want)
	}
	if got := s.inGuest("box", "pwd"); got != "/\n" {
		t.Fatalf("working directory %q", got)
	}

	// The agent runs commands as children of the guest OS, the init of its PID namespace.
	if got := s.inGuest("box", "sh", "-c", "echo $PPID"); got != "1\n" {
		t.Fatalf("a guest command's parent is PID %q in the guest, want its init (1)", got)
	}
}

func TestExecFailuresAreCocoons(t *testing.T) {
	s := newSim(t)
	s.importSnapshot(testimage.SnapshotOptions{Name: "base"})
	s.clone("base", "box")
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"box", "--", "--"}, "exec: no command given"},
		{[]string{"box", "--"}, "requires at least 2 arg(s), only received 1"},
		{[]string{"--env", "NOVALUE", "box", "--", "true"}, `--env "NOVALUE" must be KEY=VALUE`},
		{[]string{"-e", "=x", "box", "--", "true"}, `--env "=x" must be KEY=VALUE`},
		{[]string{"nosuch", "--", "true"}, "exec: vm nosuch: VM not found"},
		{[]string{"box", "--", "/no/such/command"}, `exec: agent: exec: start /no/such/command: fork/exec /no/such/command: no such file or directory`},
	} {
		s.fails(tc.want, append([]string{"vm", "exec"}, tc.args...)...)
	}

	// The hypervisor is up but its guest is not (here: shut down through the API): nothing
	// answers on the agent's vsock port, as while cocoon-agent is still starting.
	vm := s.inspect("box")
	shutdownVM(t, vm.SocketPath)
	s.fails("exec: dial agent: read CONNECT reply: EOF (cocoon-agent may still be starting; retry shortly)", "vm", "exec", "box", "--", "true")

	s.ok("vm", "stop", "box")
	s.fails("exec: vm not running", "vm", "exec", "box", "--", "true")
	// An invalid --env is only noticed once the VM is found running, as in cocoon.
	s.fails("exec: vm not running", "vm", "exec", "--env", "NOVALUE", "box", "--", "true")
}

func TestExecWorksInBootedAndRestoredGuests(t *testing.T) {
	s := newSim(t)
	s.importSnapshot(testimage.SnapshotOptions{Name: "base"})
	vm := s.clone("base", "box")
	runDir := filepath.Join(s.run, "cloudhypervisor", vm.ID)
	if raw := decode[map[string]any](t, s.ok("vm", "inspect", "box")); raw["vsock_socket"] != filepath.Join(runDir, guest.VsockSocketName) {
		t.Fatalf("vm inspect vsock_socket: %v", raw["vsock_socket"])
	}
	if got := s.inGuest("box", "echo", "restored"); got != "restored\n" {
		t.Fatalf("restored guest: %q", got)
	}
	s.ok("vm", "stop", "box")
	if raw := decode[map[string]any](t, s.ok("vm", "inspect", "box")); raw["vsock_socket"] != nil {
		t.Fatalf("a stopped VM shows vsock_socket %v", raw["vsock_socket"])
	}
	s.ok("vm", "start", "box")
	if got := s.inGuest("box", "echo", "booted"); got != "booted\n" {
		t.Fatalf("booted guest: %q", got)
	}
}

func TestExecConcurrentSessions(t *testing.T) {
	s := newSim(t)
	s.importSnapshot(testimage.SnapshotOptions{Name: "base"})
	s.clone("base", "box")
	const n = 8
	results := make([]result, n)
	var wg sync.WaitGroup
	for i := range n {
		wg.Go(func() {
			results[i] = s.vmExec("", "-e", fmt.Sprintf("N=%d", i), "box", "--", "sh", "-c", `sleep 0.2; echo "session $N"; exit $N`)
		})
	}
	wg.Wait()
	for i, r := range results {
		if r.code != i || r.stdout != fmt.Sprintf("session %d\n", i) {
			t.Errorf("session %d: exit %d, stdout %q, stderr %q", i, r.code, r.stdout, stripANSI(r.stderr))
		}
	}
}

func TestExecEndsTheGuestCommandWhenItsCallerGoes(t *testing.T) {
	s := newSim(t)
	s.importSnapshot(testimage.SnapshotOptions{Name: "base"})
	vm := s.clone("base", "box")
	osPID, err := cocoonsim.GuestOSPID(vm.PID)
	if err != nil || osPID == 0 {
		t.Fatalf("guest OS: %d, %v", osPID, err)
	}

	// Killing `cocoon vm exec` kills the command and what it started in the background.
	killed := s.startExec(nil, nil, "box", "--", "sh", "-c", "sleep 1001 & exec sleep 1002")
	background := waitForGuestProcess(t, osPID, "sleep 1001")
	foreground := waitForGuestProcess(t, osPID, "sleep 1002")
	if err := killed.Process.Kill(); err != nil {
		t.Fatal(err)
	}
	_ = killed.Wait()
	eventually(t, "the guest command to end with its caller", func() bool { return !testproc.Running(foreground) && !testproc.Running(background) })

	// A caller that stops reading the output ends a command that prints nothing.
	outR, outW, err := os.Pipe()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = outR.Close() })
	abandoned := s.startExec(nil, outW, "box", "--", "sleep", "1003")
	_ = outW.Close()
	silent := waitForGuestProcess(t, osPID, "sleep 1003")
	_ = outR.Close()
	eventually(t, "the guest command to end when its output is closed", func() bool { return !testproc.Running(silent) })
	if err := abandoned.Wait(); err == nil {
		t.Fatal("vm exec whose output was closed exited 0")
	}

	// Even while more input waits than a command that does not read it can take.
	stuck := s.startExec(bytes.NewReader(make([]byte, 1<<20)), nil, "-i", "box", "--", "sleep", "1004")
	notReading := waitForGuestProcess(t, osPID, "sleep 1004")
	if err := stuck.Process.Kill(); err != nil {
		t.Fatal(err)
	}
	_ = stuck.Wait()
	eventually(t, "the guest command that ignores its input to end with its caller", func() bool { return !testproc.Running(notReading) })
}

// TestV038HasNoAgent: v0.3.8 has neither vm exec nor vm reseed, and its VMs have no vsock device.
func TestV038HasNoAgent(t *testing.T) {
	s := newSim(t)
	s.importSnapshot(testimage.SnapshotOptions{Name: "base"})
	noExec := []string{cocoonsim.VersionEnv + "=0.3.8"}

	usage := "Usage:\n  cocoon vm exec [flags] VM -- COMMAND [ARGS...]\n"
	if r := s.cocoon("vm", "exec", "--help"); r.code != 0 || !strings.Contains(r.stdout, usage) {
		t.Fatalf("vm exec --help: exit %d\n%s", r.code, r.stdout)
	}
	// v0.3.8 has no vm exec. Its cobra (v1.10.2) reports unknown commands only at the root: an
	// unknown "vm" subcommand prints vm's help and exits 0, and exec's flags are unknown flags.
	r := s.cocoonIn(noExec, nil, "vm", "exec", "--help")
	if r.code != 0 || !strings.HasPrefix(r.stdout, "Manage virtual machines") || strings.Contains(r.stdout, "exec") {
		t.Fatalf("vm exec --help without exec: exit %d\n%s", r.code, r.stdout)
	}
	r = s.cocoonIn(noExec, nil, "vm", "exec", "-i", "box", "--", "true")
	if r.code != 1 || r.errorLine() != "Error: unknown shorthand flag: 'i' in -i" {
		t.Fatalf("vm exec -i without exec: exit %d, %q", r.code, r.errorLine())
	}
	if r := s.cocoonIn(noExec, nil, "vm", "--help"); strings.Contains(r.stdout, "exec") || strings.Contains(r.stdout, "reseed") {
		t.Fatalf("vm --help lists agent commands:\n%s", r.stdout)
	}

	// A VM started meanwhile has no vsock device: inspect shows none, and a cocoon with exec
	// cannot reach its agent.
	if r := s.cocoonIn(noExec, nil, "vm", "clone", "--name", "old", "base"); r.code != 0 {
		t.Fatalf("clone: %s", stripANSI(r.stderr))
	}
	if r := s.cocoonIn(noExec, nil, "vm", "inspect", "old"); strings.Contains(r.stdout, "vsock_socket") {
		t.Fatalf("v0.3.8 inspect shows vsock_socket:\n%s", r.stdout)
	}
	s.fails("exec: vsock not configured for this VM (recreate the VM to enable agent exec)", "vm", "exec", "old", "--", "true")
}

func TestGuestFilesAreTheGuestsOwn(t *testing.T) {
	s := newSim(t)
	s.importSnapshot(testimage.SnapshotOptions{Name: "base"})
	hostBefore := snapshotHostFiles(t)
	vm := s.clone("base", "box")

	// Without NICs the boot configuration names neither hostname nor DNS servers.
	if got := s.inGuest("box", "hostname"); got != "localhost\n" {
		t.Fatalf("hostname %q", got)
	}
	s.inGuest("box", "sh", "-c", "echo 'nameserver 192.0.2.53' > /etc/resolv.conf && echo guest-box > /etc/hostname && echo '192.0.2.9 extra' >> /etc/hosts && hostname guest-box")
	if got := s.inGuest("box", "sh", "-c", "hostname; cat /etc/resolv.conf /etc/hostname; grep -c extra /etc/hosts"); got != "guest-box\nnameserver 192.0.2.53\nguest-box\n1\n" {
		t.Fatalf("the guest's view after changing its files: %q", got)
	}
	if got := snapshotHostFiles(t); got != hostBefore {
		t.Fatalf("the host's files changed:\nbefore %s\nafter  %s", hostBefore, got)
	}
	// The guest's mounts stay in the guest.
	mounts, err := os.ReadFile("/proc/self/mountinfo")
	if err != nil {
		t.Fatal(err)
	}
	if runDir := filepath.Join(s.run, "cloudhypervisor", vm.ID); strings.Contains(string(mounts), runDir) {
		t.Fatalf("a guest mount reached the host:\n%s", mounts)
	}
}

// A busybox guest's commands are busybox's: its top runs without a terminal, where the host's
// procps top fails. A default guest keeps the host's userland.
func TestBusyboxGuestUserland(t *testing.T) {
	if _, err := exec.LookPath("busybox"); err != nil {
		t.Skip("no busybox (Debian package busybox-static; hack/setup-realguest.sh installs it)")
	}
	s := newSim(t)
	s.importSnapshot(testimage.SnapshotOptions{Name: "bb", Guest: guest.Spec{Busybox: true}})
	s.importSnapshot(testimage.SnapshotOptions{Name: "plain"})
	s.clone("bb", "bb")
	s.clone("plain", "plain")
	// top without a terminal: busybox's runs until timeout ends it (143, SIGTERM), procps' fails.
	const probe = "timeout 1 top </dev/null >/dev/null 2>&1; echo top=$?"
	if got := s.inGuest("bb", "sh", "-c", probe); got != "top=143\n" {
		t.Fatalf("busybox guest: %q", got)
	}
	if got := s.inGuest("plain", "sh", "-c", probe); got != "top=1\n" {
		t.Fatalf("default guest: %q", got)
	}
}

// snapshotHostFiles describes the host's files the guest has its own copies of, and the host's
// hostname.
func snapshotHostFiles(t *testing.T) string {
	t.Helper()
	var b strings.Builder
	for _, path := range []string{"/etc/resolv.conf", "/etc/hostname", "/etc/hosts"} {
		data, err := os.ReadFile(path)
		if err != nil {
			t.Fatal(err)
		}
		info, err := os.Stat(path)
		if err != nil {
			t.Fatal(err)
		}
		fmt.Fprintf(&b, "%s %q %s; ", path, data, info.ModTime())
	}
	host, err := os.Hostname()
	if err != nil {
		t.Fatal(err)
	}
	b.WriteString("hostname " + host)
	return b.String()
}

// startExec starts `vm exec ARGS` in the background with stdin (nil: none) and its stdout to out
// (nil: discarded); the test's cleanup kills it if it is still running.
func (s *sim) startExec(stdin io.Reader, out *os.File, args ...string) *exec.Cmd {
	s.t.Helper()
	cmd := exec.Command(simBinary, append(append(s.globalFlags(), "vm", "exec"), args...)...) //nolint:gosec // the test's own binary
	cmd.Env = append(os.Environ(), s.env...)
	cmd.Stdin = stdin
	if out != nil {
		cmd.Stdout = out
	}
	start := cmd.Start
	if s.inNetns != nil {
		start = func() error { return s.inNetns(cmd.Start) }
	}
	if err := start(); err != nil {
		s.t.Fatal(err)
	}
	s.t.Cleanup(func() {
		if cmd.ProcessState == nil {
			_ = cmd.Process.Kill()
			_ = cmd.Wait()
		}
	})
	return cmd
}

// waitForGuestProcess waits for a process whose command line is cmdline to run in the guest
// whose init is osPID, and returns its PID on the host.
func waitForGuestProcess(t *testing.T, osPID int, cmdline string) int {
	t.Helper()
	var pid int
	eventually(t, "guest process "+cmdline, func() bool {
		pid = findGuestProcess(osPID, cmdline)
		return pid != 0
	})
	return pid
}

// findGuestProcess looks for cmdline among the processes in osPID's PID namespace.
func findGuestProcess(osPID int, cmdline string) int {
	guestNS, err := os.Readlink(fmt.Sprintf("/proc/%d/ns/pid", osPID))
	if err != nil {
		return 0
	}
	entries, _ := os.ReadDir("/proc")
	for _, e := range entries {
		var pid int
		if _, err := fmt.Sscan(e.Name(), &pid); err != nil || pid == osPID {
			continue
		}
		ns, err := os.Readlink(fmt.Sprintf("/proc/%d/ns/pid", pid))
		if err != nil || ns != guestNS {
			continue
		}
		raw, err := os.ReadFile(fmt.Sprintf("/proc/%d/cmdline", pid))
		if err == nil && strings.Join(strings.Split(strings.TrimRight(string(raw), "\x00"), "\x00"), " ") == cmdline {
			return pid
		}
	}
	return 0
}

// shutdownVM calls the hypervisor API's vm.shutdown: the guest stops, the hypervisor stays.
func shutdownVM(t *testing.T, socket string) {
	t.Helper()
	hc := &http.Client{Timeout: 5 * time.Second, Transport: &http.Transport{
		DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
			var d net.Dialer
			return d.DialContext(ctx, "unix", socket)
		},
	}}
	req, err := http.NewRequest(http.MethodPut, "http://localhost/api/v1/vm.shutdown", nil)
	if err != nil {
		t.Fatal(err)
	}
	resp, err := hc.Do(req)
	if err != nil {
		t.Fatalf("vm.shutdown: %v", err)
	}
	_ = resp.Body.Close()
	if resp.StatusCode != http.StatusNoContent {
		t.Fatalf("vm.shutdown: %s", resp.Status)
	}
}

// TestGuestHasItsOwnFilesystem: what a guest writes (a file under /etc, a device
// node's path in /dev) is the guest's own, as on a VM's disk: the host never sees it, another VM
// does not either, and the guest finds it again after a reboot. Its /root starts empty: the host
// root's dotfiles are not the guest's.
func TestGuestHasItsOwnFilesystem(t *testing.T) {
	s := newSimAt(t, "0.5.1")
	s.importSnapshot(testimage.SnapshotOptions{Name: "base"})
	s.clone("base", "a")
	s.clone("base", "b")
	if got := s.inGuest("a", "ls", "-A", "/root"); got != "" {
		t.Fatalf("a new guest's /root holds %q, want nothing", got)
	}
	dir := "/etc/cocoon-sim-guest-" + strings.ToLower(t.Name())
	s.inGuest("a", "sh", "-c", "mkdir -p "+dir+" && echo mine > "+dir+"/f && echo log > /dev/termination-log && echo home > /root/f")
	if _, err := os.Stat(dir); err == nil {
		os.RemoveAll(dir) //nolint:errcheck
		t.Fatalf("%s written in the guest appeared on the host", dir)
	}
	if _, err := os.Stat("/dev/termination-log"); err == nil {
		t.Fatal("/dev/termination-log written in the guest appeared on the host")
	}
	// Nor does a host path under /tmp reach the guest, which has a /tmp of its own.
	hostFile := filepath.Join(t.TempDir(), "host-only")
	if err := os.WriteFile(hostFile, []byte("host"), 0o600); err != nil {
		t.Fatal(err)
	}
	if r := s.vmExec("", "a", "--", "cat", hostFile); r.code == 0 {
		t.Fatalf("the guest reads the host's %s: %q", hostFile, r.stdout)
	}
	if r := s.vmExec("", "b", "--", "cat", dir+"/f"); r.code == 0 {
		t.Fatalf("another VM reads the first one's file: %q", r.stdout)
	}
	if got := s.inGuest("a", "cat", "/dev/null", dir+"/f"); got != "mine\n" {
		t.Fatalf("the guest reads back %q", got)
	}
	s.ok("vm", "stop", "a")
	s.ok("vm", "start", "a")
	eventually(t, "the guest's agent after a restart", func() bool {
		return s.vmExec("", "a", "--", "true").code == 0
	})
	if got := s.inGuest("a", "cat", dir+"/f", "/root/f"); got != "mine\nhome\n" {
		t.Fatalf("after a reboot the guest reads %q", got)
	}
}
