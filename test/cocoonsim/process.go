package cocoonsim

import (
	"context"
	"errors"
	"fmt"
	"os"
	"strconv"
	"strings"
	"syscall"
	"time"

	"golang.org/x/sys/unix"
)

// killWaitTimeout is how long cocoon waits for a SIGKILLed process to disappear.
const killWaitTimeout = 5 * time.Second

func writePIDFile(path string, pid int) error {
	return os.WriteFile(path, []byte(strconv.Itoa(pid)+"\n"), 0o600)
}

func readPIDFile(path string) (int, error) {
	data, err := os.ReadFile(path) //nolint:gosec // VM run dir
	if err != nil {
		return 0, err
	}
	pid, err := strconv.Atoi(strings.TrimSpace(string(data)))
	if err != nil {
		return 0, fmt.Errorf("parse PID from %s: %w", path, err)
	}
	return pid, nil
}

// isProcessAlive is kill(pid, 0), as cocoon checks liveness.
func isProcessAlive(pid int) bool {
	if pid <= 0 {
		return false
	}
	err := syscall.Kill(pid, 0)
	return err == nil || errors.Is(err, syscall.EPERM)
}

// verifyProcessCmdline checks that pid's command line names the hypervisor binary and the
// expected argument (its API socket), so a recycled PID is never taken for a VM.
func verifyProcessCmdline(pid int, binaryName, expectArg string) bool {
	if pid <= 0 {
		return false
	}
	data, err := os.ReadFile(fmt.Sprintf("/proc/%d/cmdline", pid))
	if err != nil {
		return false
	}
	cmdline := string(data)
	return strings.Contains(cmdline, binaryName) && strings.Contains(cmdline, expectArg)
}

// terminateProcess is cocoon's TerminateProcess: verify the PID, SIGTERM through a pidfd, wait up
// to grace, then SIGKILL and wait for the process to go.
func terminateProcess(ctx context.Context, pid int, binaryName, expectArg string, grace time.Duration) error {
	if !verifyProcessCmdline(pid, binaryName, expectArg) {
		return nil
	}
	fd, err := unix.PidfdOpen(pid, 0)
	if err != nil {
		if !isProcessAlive(pid) {
			return nil
		}
		return fmt.Errorf("pidfd_open %d: %w", pid, err)
	}
	defer unix.Close(fd) //nolint:errcheck
	gone := func() (bool, error) { return !isProcessAlive(pid), nil }

	if err := unix.PidfdSendSignal(fd, syscall.SIGTERM, nil, 0); err != nil {
		if !isProcessAlive(pid) {
			return nil
		}
		_ = unix.PidfdSendSignal(fd, syscall.SIGKILL, nil, 0)
		return waitFor(ctx, killWaitTimeout, time.Millisecond, gone)
	}
	if waitFor(ctx, grace, time.Millisecond, gone) == nil {
		return nil
	}
	_ = unix.PidfdSendSignal(fd, syscall.SIGKILL, nil, 0)
	return waitFor(ctx, killWaitTimeout, time.Millisecond, gone)
}

// waitFor polls check every interval until it reports done, fails, or timeout passes.
func waitFor(ctx context.Context, timeout, interval time.Duration, check func() (bool, error)) error {
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	ticker := time.NewTicker(interval)
	defer ticker.Stop()
	for {
		done, err := check()
		if err != nil {
			return err
		}
		if done {
			return nil
		}
		select {
		case <-ctx.Done():
			if errors.Is(ctx.Err(), context.DeadlineExceeded) {
				return fmt.Errorf("timeout after %s", timeout)
			}
			return ctx.Err()
		case <-ticker.C:
		}
	}
}
