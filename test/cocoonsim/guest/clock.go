package guest

import (
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"math"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"syscall"
	"time"

	"golang.org/x/sys/unix"
)

// The guest's wall clock. A simulated guest's processes run on the host and read the host's
// clock, but a real guest's clock is its own: a VM restored from a snapshot resumes with the
// clock it had when the snapshot was taken (cloud-hypervisor before v53 restores kvmclock as
// saved, and no release steps a guest whose clocksource is the TSC), so it lags by however long
// the snapshot sat until something in the guest steps it (docs/cocoon-contract.md, "The guest's
// clock"). The simulator keeps that clock as an offset from the host's, in the guest's files, and
// the guest's date(1) and hwclock(8) are shims that read and set the offset; nothing in a guest
// may set the host's clock.

const (
	// clockFileName, in the VM's guest files, holds the guest clock (guestClock as JSON).
	clockFileName = "clock"
	// clockShimEnv makes the simulator binary the guest's date or hwclock; its value is the
	// clock file.
	clockShimEnv = "_COCOON_SIM_GUEST_CLOCK"
	// clockShimDir is where the shims are installed in the guest: the first directory of the
	// guest's PATH (guestPATH), and of sshd's.
	clockShimDir = "/usr/local/sbin"
)

// guestClock is the guest's clock: its wall time is the host's plus Offset. RTC says whether the
// VM has a real-time clock device that reads the host's time (cloud-hypervisor's CMOS RTC does:
// devices/src/legacy/cmos.rs reads CLOCK_REALTIME at every guest read); Firecracker has none on
// x86_64.
type guestClock struct {
	OffsetNS int64 `json:"offset_ns"`
	RTC      bool  `json:"rtc"`
}

func clockFile(runDir string) string { return filepath.Join(runDir, guestFilesDir, clockFileName) }

// writeGuestClock sets the guest's clock, atomically: the guest's shims and the hypervisor's
// snapshot read it at any time.
func writeGuestClock(path string, c guestClock) error {
	data, err := json.Marshal(c)
	if err != nil {
		return err
	}
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		return fmt.Errorf("guest clock: %w", err)
	}
	tmp := path + ".new"
	if err := os.WriteFile(tmp, data, 0o644); err != nil { //nolint:gosec // the guest's own file, read by the guest
		return fmt.Errorf("guest clock: %w", err)
	}
	if err := os.Rename(tmp, path); err != nil {
		return fmt.Errorf("guest clock: %w", err)
	}
	return nil
}

// readGuestClock is the guest's clock; a VM that has none yet (no guest ran) reads the host's.
func readGuestClock(path string) (guestClock, error) {
	data, err := os.ReadFile(path) //nolint:gosec // the VM's run dir
	if errors.Is(err, fs.ErrNotExist) {
		return guestClock{}, nil
	}
	if err != nil {
		return guestClock{}, fmt.Errorf("guest clock: %w", err)
	}
	var c guestClock
	if err := json.Unmarshal(data, &c); err != nil {
		return guestClock{}, fmt.Errorf("guest clock %s: %w", path, err)
	}
	return c, nil
}

// guestWallTime is the guest's wall time now, in Unix nanoseconds: what a snapshot keeps.
func guestWallTime(runDir string) (int64, error) {
	c, err := readGuestClock(clockFile(runDir))
	if err != nil {
		return 0, err
	}
	return time.Now().UnixNano() + c.OffsetNS, nil
}

// startGuestClock sets the clock of a guest that starts now: a booted guest reads the RTC (the
// host's time, offset 0); a restored one (restoredAt, its wall time when the snapshot was taken,
// not zero) goes on from there, behind the host by the time since the capture. A snapshot that
// records no clock (one the simulator did not take) restores with the host's time.
func (v *vmm) startGuestClock(restoredAt int64) error {
	c := guestClock{RTC: !v.noRTC}
	if restoredAt != 0 {
		c.OffsetNS = restoredAt - time.Now().UnixNano()
	}
	return writeGuestClock(clockFile(v.runDir), c)
}

// writeClockShims installs the guest's date and hwclock (on the guest's own root, so the host
// never has them). It runs in the guest after its mounts are set up.
func writeClockShims(runDir string) error {
	realRunDir, err := filepath.EvalSymlinks(runDir)
	if err != nil {
		return fmt.Errorf("resolve run dir: %w", err)
	}
	if err := os.MkdirAll(clockShimDir, 0o755); err != nil {
		return fmt.Errorf("guest %s: %w", clockShimDir, err)
	}
	for _, tool := range []string{"date", "hwclock"} {
		script := fmt.Sprintf("#!/bin/sh\n"+
			"# cocoon-sim: the guest's clock is its own, not the host's.\n"+
			"%s=%s exec /proc/1/exe %s \"$@\"\n", clockShimEnv, shellQuote(clockFile(realRunDir)), tool)
		path := filepath.Join(clockShimDir, tool)
		if err := os.WriteFile(path, []byte(script), 0o755); err != nil { //nolint:gosec // an executable
			return fmt.Errorf("guest %s: %w", path, err)
		}
	}
	return nil
}

// startWithoutSettingTime starts a process that can never set the host's clock: the capability
// bounding set of the thread it is forked from lacks CAP_SYS_TIME, so neither it nor anything it
// runs (as root or not) can get it. The guest OS starts so: its processes are the host's, and a
// date -s or hwclock -s that bypasses the shims must fail as EPERM rather than step the host.
func startWithoutSettingTime(cmd *exec.Cmd) error {
	// The bounding set is per thread, and a child inherits that of the thread that forks it.
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	if err := unix.Prctl(unix.PR_CAPBSET_DROP, unix.CAP_SYS_TIME, 0, 0, 0); err != nil {
		return fmt.Errorf("drop CAP_SYS_TIME: %w", err)
	}
	return cmd.Start()
}

// runClockShim is the guest's date or hwclock.
func runClockShim(file string, args []string) int {
	if len(args) == 0 {
		fmt.Fprintln(os.Stderr, "cocoon-sim clock shim: no tool") //nolint:errcheck
		return 1
	}
	switch args[0] {
	case "date":
		return runDate(file, args[1:])
	case "hwclock":
		return runHwclock(file, args[1:])
	}
	fmt.Fprintf(os.Stderr, "cocoon-sim clock shim: unknown tool %q\n", args[0]) //nolint:errcheck
	return 1
}

// realTool finds the guest's own date (coreutils', or busybox's in a busybox guest): the next in
// PATH after the shims.
func realTool(name string) (string, bool, error) {
	for _, dir := range strings.Split(guestPATH, ":") {
		if dir == clockShimDir {
			continue
		}
		path := filepath.Join(dir, name)
		if st, err := os.Stat(path); err == nil && st.Mode().IsRegular() && st.Mode()&0o111 != 0 {
			resolved, err := filepath.EvalSymlinks(path)
			return path, err == nil && filepath.Base(resolved) == "busybox", nil
		}
	}
	return "", false, fmt.Errorf("%s: not found", name)
}

// execTool replaces this process with the guest's own tool, without the shim's variable.
func execTool(path string, args []string) int {
	var env []string
	for _, kv := range os.Environ() {
		if !strings.HasPrefix(kv, clockShimEnv+"=") {
			env = append(env, kv)
		}
	}
	err := syscall.Exec(path, append([]string{filepath.Base(path)}, args...), env) //nolint:gosec // the guest's own tool
	fmt.Fprintf(os.Stderr, "date: %v\n", err)                                      //nolint:errcheck
	return 1
}

// atArg is a date -d argument for a Unix time in nanoseconds; busybox's date takes whole
// seconds only.
func atArg(ns int64, busybox bool) string {
	sec, frac := ns/int64(time.Second), ns%int64(time.Second)
	if frac < 0 {
		sec, frac = sec-1, frac+int64(time.Second)
	}
	if busybox {
		return "@" + strconv.FormatInt(sec, 10)
	}
	return fmt.Sprintf("@%d.%09d", sec, frac)
}

// runDate is date(1) on the guest's clock: the guest's own date shows the guest's time (it is
// given it with -d @TIME); -s/--set moves the guest's clock (root only, as CAP_SYS_TIME is);
// -d, -r and -f, which are not about now, go to the guest's date as they are.
func runDate(file string, args []string) int {
	tool, busybox, err := realTool("date")
	if err != nil {
		fmt.Fprintf(os.Stderr, "date: %v\n", err) //nolint:errcheck
		return 127
	}
	var set string
	setting, other := false, false
	var rest []string
	for i := 0; i < len(args); i++ {
		a := args[i]
		switch {
		case a == "-s" || a == "--set":
			if i+1 >= len(args) {
				return execTool(tool, args) // the guest's date says what is missing
			}
			set, setting = args[i+1], true
			i++
		case strings.HasPrefix(a, "--set="):
			set, setting = strings.TrimPrefix(a, "--set="), true
		case strings.HasPrefix(a, "-s") && !strings.HasPrefix(a, "--"):
			set, setting = a[2:], true
		case a == "-d" || a == "-r" || a == "-f" || strings.HasPrefix(a, "--date") || strings.HasPrefix(a, "--reference") ||
			strings.HasPrefix(a, "--file") || (len(a) > 2 && (strings.HasPrefix(a, "-d") || strings.HasPrefix(a, "-r") || strings.HasPrefix(a, "-f"))):
			other = true
			rest = append(rest, a)
		default:
			rest = append(rest, a)
		}
	}
	if other && !setting {
		return execTool(tool, args)
	}
	c, err := readGuestClock(file)
	if err != nil {
		fmt.Fprintf(os.Stderr, "date: %v\n", err) //nolint:errcheck
		return 1
	}
	if !setting {
		return execTool(tool, append([]string{"-d", atArg(time.Now().UnixNano()+c.OffsetNS, busybox)}, rest...))
	}
	target, err := parseSetTime(tool, set, rest)
	if err != nil {
		fmt.Fprintf(os.Stderr, "date: invalid date %q\n", set) //nolint:errcheck
		return 1
	}
	if os.Geteuid() != 0 {
		fmt.Fprintln(os.Stderr, "date: cannot set date: Operation not permitted") //nolint:errcheck
		return 1
	}
	c.OffsetNS = target - time.Now().UnixNano()
	if err := writeGuestClock(file, c); err != nil {
		fmt.Fprintf(os.Stderr, "date: cannot set date: %v\n", err) //nolint:errcheck
		return 1
	}
	// date -s prints the time it set.
	return execTool(tool, append([]string{"-d", atArg(target, busybox)}, rest...))
}

// parseSetTime is date -s's argument as Unix nanoseconds: @SECONDS[.FRACTION] directly, any other
// date string as the guest's date reads it (relative ones count from the host's time).
func parseSetTime(tool, set string, rest []string) (int64, error) {
	if strings.HasPrefix(set, "@") {
		f, err := strconv.ParseFloat(set[1:], 64)
		if err != nil || math.IsNaN(f) || math.IsInf(f, 0) {
			return 0, fmt.Errorf("invalid date %q", set)
		}
		whole, frac := math.Modf(f)
		return int64(whole)*int64(time.Second) + int64(math.Round(frac*1e9)), nil
	}
	args := []string{"-d", set, "+%s"}
	for _, a := range rest {
		if a == "-u" || a == "--utc" || a == "--universal" {
			args = append([]string{a}, args...)
		}
	}
	out, err := exec.Command(tool, args...).Output() //nolint:gosec // the guest's own date
	if err != nil {
		return 0, err
	}
	sec, err := strconv.ParseInt(strings.TrimSpace(string(out)), 10, 64)
	if err != nil {
		return 0, err
	}
	return sec * int64(time.Second), nil
}

// runHwclock is hwclock(8) on the VM's RTC, which is the host's time where the VM has one
// (cloud-hypervisor's CMOS RTC reads the host's clock at every read and ignores writes to the
// time): --hctosys/-s sets the guest's clock from it, --show/-r (the default) prints it,
// --systohc/-w changes nothing. Without an RTC it fails as util-linux's does.
func runHwclock(file string, args []string) int {
	c, err := readGuestClock(file)
	if err != nil {
		fmt.Fprintf(os.Stderr, "hwclock: %v\n", err) //nolint:errcheck
		return 1
	}
	if !c.RTC {
		fmt.Fprintln(os.Stderr, "hwclock: Cannot access the Hardware Clock via any known method.")                          //nolint:errcheck
		fmt.Fprintln(os.Stderr, "hwclock: Use the --verbose option to see the details of our search for an access method.") //nolint:errcheck
		return 1
	}
	op := "show"
	for i := 0; i < len(args); i++ {
		switch a := args[i]; a {
		case "-s", "--hctosys":
			op = "hctosys"
		case "-w", "--systohc":
			op = "systohc"
		case "-r", "--show", "--get":
			op = "show"
		case "-u", "--utc", "-l", "--localtime", "--noadjfile", "-v", "--verbose", "--debug", "-D":
		case "-f", "--rtc", "--adjfile":
			i++
		default:
			if !strings.HasPrefix(a, "--rtc=") && !strings.HasPrefix(a, "--adjfile=") {
				fmt.Fprintf(os.Stderr, "hwclock: unrecognized option '%s'\n", a) //nolint:errcheck
				return 1
			}
		}
	}
	switch op {
	case "hctosys":
		if os.Geteuid() != 0 {
			fmt.Fprintln(os.Stderr, "hwclock: settimeofday() failed: Operation not permitted") //nolint:errcheck
			return 1
		}
		c.OffsetNS = 0
		if err := writeGuestClock(file, c); err != nil {
			fmt.Fprintf(os.Stderr, "hwclock: settimeofday() failed: %v\n", err) //nolint:errcheck
			return 1
		}
	case "show":
		fmt.Println(time.Now().Format("2006-01-02 15:04:05.000000-07:00"))
	}
	return 0
}
