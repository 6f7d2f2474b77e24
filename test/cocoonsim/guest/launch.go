package guest

import (
	"bufio"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"syscall"
	"time"

	"golang.org/x/sys/unix"
)

// The simulator re-executes its own binary to run the hypervisor (cocoon does the same for its
// console relay, with _COCOON_CONSOLE_RELAY=1). These variables select the role; what a real
// guest would learn from its disks travels in planEnv.
const (
	roleEnv     = "_COCOON_SIM_GUEST"
	nameEnv     = "_COCOON_SIM_VM_NAME"
	roleShim    = "shim"
	roleVMM     = "vmm"
	roleGuestOS = "os"
	pidWaitOf   = 5 * time.Second
	// guestOSArgv0 names the guest OS process in ps and /proc/PID/cmdline.
	guestOSArgv0 = "cocoon-sim-guest-os"
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
}

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
		Args:        append([]string{"cocoon-sim-shim", opts.Binary}, opts.Args...),
		Env:         append(os.Environ(), roleEnv+"="+roleShim, nameEnv+"="+opts.VMName),
		ExtraFiles:  []*os.File{pidW},
		SysProcAttr: &syscall.SysProcAttr{Setsid: true},
	}
	if opts.Log != nil { // a nil *os.File must not become a non-nil io.Writer
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
	switch os.Getenv(roleEnv) {
	case roleShim:
		return true, runShim(os.Args[1:])
	case roleVMM:
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
		Stdout: os.Stdout,
		Stderr: os.Stderr,
	}
	if err := vmm.Start(); err != nil {
		fmt.Fprintf(report, "error: %v\n", err) //nolint:errcheck
		return 1
	}
	fmt.Fprintf(report, "%d\n", vmm.Process.Pid) //nolint:errcheck
	_ = report.Close()
	_ = vmm.Wait()
	reapOrphans()
	return 0
}

// reapOrphans waits for every remaining descendant the kernel hands the subreaper.
func reapOrphans() {
	for {
		var status unix.WaitStatus
		if _, err := unix.Wait4(-1, &status, 0, nil); errors.Is(err, unix.ECHILD) {
			return
		}
	}
}
