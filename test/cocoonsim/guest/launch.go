package guest

import (
	"bufio"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"os/signal"
	"strconv"
	"strings"
	"syscall"
	"time"

	"golang.org/x/sys/unix"

	"github.com/cocoonstack/cocoon-cri/pkg/vmstats"
)

// The simulator re-executes its own binary to run the hypervisor (cocoon does the same for its
// console relay, with _COCOON_CONSOLE_RELAY=1). These variables select the role; what a real
// guest would learn from its disks travels in planEnv.
const (
	roleEnv     = "_COCOON_SIM_GUEST"
	nameEnv     = "_COCOON_SIM_VM_NAME"
	pidFileEnv  = "_COCOON_SIM_PID_FILE"
	roleShim    = "shim"
	roleVMM     = "vmm"
	roleGuestOS = "os"
	// pidWaitOf bounds only a shim that hangs: one that dies closes the pipe at once. Real
	// cocoon has the hypervisor's PID as soon as it forks it; the shim's own start (a re-exec of
	// this binary) is the simulator's, and on a loaded machine it took more than 5 s.
	pidWaitOf = 2 * time.Minute
	// guestOSArgv0 names the guest OS process in ps and /proc/PID/cmdline.
	guestOSArgv0 = "cocoon-sim-guest-os"
	shimArgv0    = "cocoon-sim-shim"
)

// LaunchOptions describes one hypervisor process.
type LaunchOptions struct {
	// Binary is argv[0] of the hypervisor process (cocoon's ch_binary, "cloud-hypervisor"), so
	// /proc/PID/cmdline looks like a real one and cocoon's PID verification works unchanged.
	Binary string
	// Args are the cloud-hypervisor arguments; --api-socket must be among them.
	Args []string
	// Log receives the hypervisor's stdout and stderr; nil discards them.
	Log *os.File
	// VMName is the name the guest announces on its console.
	VMName string
	// Serial, when set, is the hypervisor's stdin and stdout: the PTY on which Firecracker puts
	// the guest's serial port. Its stderr then goes nowhere, as cocoon leaves it.
	Serial *os.File
	// PIDFile is where cocoon records the hypervisor's PID. Under NoReapEnv the shim keeps an
	// exited hypervisor unreaped for as long as this file exists.
	PIDFile string
}

// NoReapEnv, set to any value, makes the simulator's host behave like one whose init does not reap
// orphans: a hypervisor that exits stays a zombie (kill(pid, 0) still succeeds) until cocoon
// removes its PID file at vm stop or vm rm. The shim holding the zombie lets it go on SIGTERM.
const NoReapEnv = "COCOON_SIM_NO_REAP"

// Launch starts a hypervisor process that outlives the caller and returns its PID.
//
// The hypervisor runs under a small shim in its own session. The shim exists only to reap the
// hypervisor: when the hypervisor exits, its PID disappears at once, as on a host whose init reaps
// orphans. Without it, an exited hypervisor whose parent (the short-lived cocoon command) is gone
// would stay a zombie wherever PID 1 does not reap, and kill(pid, 0) would keep calling it alive.
func Launch(opts LaunchOptions) (int, error) {
	self, err := os.Executable()
	if err != nil {
		return 0, fmt.Errorf("find own executable: %w", err)
	}
	pidR, pidW, err := os.Pipe()
	if err != nil {
		return 0, fmt.Errorf("create pid pipe: %w", err)
	}
	defer pidR.Close() //nolint:errcheck

	shim := &exec.Cmd{
		Path:        self,
		Args:        append([]string{shimArgv0, opts.Binary}, opts.Args...),
		Env:         append(os.Environ(), roleEnv+"="+roleShim, nameEnv+"="+opts.VMName, pidFileEnv+"="+opts.PIDFile),
		ExtraFiles:  []*os.File{pidW},
		SysProcAttr: &syscall.SysProcAttr{Setsid: true},
	}
	switch {
	case opts.Serial != nil:
		shim.Stdin, shim.Stdout = opts.Serial, opts.Serial
	case opts.Log != nil: // a nil *os.File must not become a non-nil io.Writer
		shim.Stdout, shim.Stderr = opts.Log, opts.Log
	}
	startErr := shim.Start()
	_ = pidW.Close()
	if startErr != nil {
		return 0, startErr
	}
	// Reap the shim if it ends while we are still around; otherwise init inherits it.
	go shim.Wait() //nolint:errcheck

	_ = pidR.SetReadDeadline(time.Now().Add(pidWaitOf))
	line, err := bufio.NewReader(pidR).ReadString('\n')
	if err != nil {
		return 0, fmt.Errorf("read hypervisor pid from shim: %w", err)
	}
	line = strings.TrimSpace(line)
	if msg, failed := strings.CutPrefix(line, "error: "); failed {
		return 0, errors.New(msg)
	}
	pid, err := strconv.Atoi(line)
	if err != nil {
		return 0, fmt.Errorf("parse hypervisor pid %q: %w", line, err)
	}
	return pid, nil
}

// Main runs the shim or the hypervisor when this process was started by Launch. It reports
// handled=false for any other process, which then goes on to be the cocoon CLI.
func Main() (handled bool, exitCode int) {
	if sock := os.Getenv(fsMountHelperEnv); sock != "" {
		return true, runFsMountHelper(sock, os.Args[1:])
	}
	if file := os.Getenv(clockShimEnv); file != "" {
		return true, runClockShim(file, os.Args[1:])
	}
	switch os.Getenv(roleEnv) {
	case roleShim:
		return true, runShim(os.Args[1:])
	case roleVMM:
		if isFirecrackerArgs(os.Args[1:]) {
			return true, runFirecracker(os.Getenv(nameEnv), os.Args[1:])
		}
		return true, runVMM(os.Getenv(nameEnv), os.Args[1:])
	case roleGuestOS:
		return true, runGuestOS()
	default:
		return false, 0
	}
}

// runShim starts the hypervisor as its child, reports the child's PID on fd 3 and waits for it.
// As a child subreaper it also reaps what the hypervisor leaves behind (the guest OS process,
// which ends on its own once the hypervisor is gone), and exits when nothing is left.
func runShim(argv []string) int {
	noReap := os.Getenv(NoReapEnv) != ""
	// Registered before the hypervisor starts, so a SIGTERM never finds the shim unprepared.
	release := make(chan os.Signal, 1)
	if noReap {
		signal.Notify(release, syscall.SIGTERM)
	}
	// fd 3 is the pid pipe; keep it out of the hypervisor so only the shim holds it.
	syscall.CloseOnExec(3)
	report := os.NewFile(3, "pid-pipe")
	if len(argv) == 0 {
		fmt.Fprintln(report, "error: shim started without a hypervisor command") //nolint:errcheck
		return 1
	}
	self, err := os.Executable()
	if err != nil {
		fmt.Fprintf(report, "error: find own executable: %v\n", err) //nolint:errcheck
		return 1
	}
	if err := unix.Prctl(unix.PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0); err != nil {
		fmt.Fprintf(report, "error: become child subreaper: %v\n", err) //nolint:errcheck
		return 1
	}
	vmm := &exec.Cmd{
		Path:   self,
		Args:   argv,
		Env:    append(os.Environ(), roleEnv+"="+roleVMM),
		Stdin:  os.Stdin,
		Stdout: os.Stdout,
		Stderr: os.Stderr,
	}
	if err := vmm.Start(); err != nil {
		fmt.Fprintf(report, "error: %v\n", err) //nolint:errcheck
		return 1
	}
	fmt.Fprintf(report, "%d\n", vmm.Process.Pid) //nolint:errcheck
	_ = report.Close()
	if noReap {
		holdZombie(vmm.Process.Pid, os.Getenv(pidFileEnv), release)
	}
	_ = vmm.Wait()
	reapOrphans()
	return 0
}

// holdZombie waits for the hypervisor to exit without reaping it, then keeps it a zombie until its
// PID file is gone or release fires.
func holdZombie(pid int, pidFile string, release <-chan os.Signal) {
	var info unix.Siginfo
	for {
		err := unix.Waitid(unix.P_PID, pid, &info, unix.WEXITED|unix.WNOWAIT, nil)
		if !errors.Is(err, unix.EINTR) {
			break
		}
	}
	tick := time.NewTicker(zombiePoll)
	defer tick.Stop()
	for {
		if _, err := os.Stat(pidFile); pidFile == "" || errors.Is(err, os.ErrNotExist) {
			return
		}
		select {
		case <-release:
			return
		case <-tick.C:
		}
	}
}

// zombiePoll is how often a held zombie's PID file is looked at.
const zombiePoll = 100 * time.Millisecond

// reapOrphans waits for every remaining descendant the kernel hands the subreaper.
func reapOrphans() {
	for {
		var status unix.WaitStatus
		if _, err := unix.Wait4(-1, &status, 0, nil); errors.Is(err, unix.ECHILD) {
			return
		}
	}
}

// ReleaseZombie lets go of pid if it is an exited hypervisor a shim holds under NoReapEnv: it
// signals the shim, which reaps it. It reports whether pid was such a zombie.
func ReleaseZombie(pid int) (bool, error) {
	st, err := vmstats.ReadStat("/proc", pid)
	state, ppid := st.State, st.PPID
	if err != nil || state != 'Z' {
		return false, nil //nolint:nilerr // gone or not a zombie: nothing to release
	}
	cmdline, err := os.ReadFile(fmt.Sprintf("/proc/%d/cmdline", ppid))
	if err != nil || !strings.HasPrefix(string(cmdline), shimArgv0+"\x00") {
		return false, nil //nolint:nilerr // not held by one of our shims
	}
	if err := syscall.Kill(ppid, syscall.SIGTERM); err != nil && !errors.Is(err, syscall.ESRCH) {
		return true, fmt.Errorf("release zombie %d from shim %d: %w", pid, ppid, err)
	}
	return true, nil
}
