// Package cocoonsim is a stand-in for the cocoon CLI (github.com/cocoonstack/cocoon), v0.5.1 or
// v0.3.8 (VersionEnv), for machines where cocoon and its hypervisors cannot run. It honours
// cocoon's command-line contract where cocoon-cri depends on it: the same commands and flags, JSON
// shapes, error strings, exit codes, on-disk layout, locking and quirks. Started VMs are real
// processes (package guest) that serve a Cloud-Hypervisor-like API and console.
package cocoonsim

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/signal"
	"syscall"

	"github.com/cocoonstack/cocoon-cri/test/cocoonsim/guest"
	"github.com/cocoonstack/cocoon-cri/test/cocoonsim/internal/release"
)

// Main runs one cocoon command line (args without the program name) and returns the process
// exit code: 0 on success, 1 on any error, as cocoon (vm exec: the guest command's own). When
// the process was started as a simulated hypervisor it runs that instead and never returns to
// the CLI.
func Main(args []string) int {
	if isFCRelay() {
		return runConsoleRelay()
	}
	if handled, code := guest.Main(); handled {
		return code
	}
	ctx, cancel := signal.NotifyContext(context.Background(), syscall.SIGINT, syscall.SIGTERM)
	defer cancel()
	prof, err := release.Current()
	if err != nil {
		fmt.Fprintln(os.Stderr, err) //nolint:errcheck
		return 1
	}
	lockRetryDelay = prof.LockRetry
	a := &app{stdin: os.Stdin, stdout: os.Stdout, stderr: os.Stderr, profile: prof}
	root := a.rootCommand()
	root.SetArgs(args)
	if err := root.ExecuteContext(ctx); err != nil {
		// vm exec passes the guest command's exit code on as its own, as newer cocoon does.
		if exit, ok := errors.AsType[*execExitError](err); ok {
			return exit.code
		}
		return 1
	}
	return 0
}

// app is one CLI invocation: its streams, and the config and logger set up before every command.
type app struct {
	stdin  io.Reader
	stdout io.Writer
	stderr io.Writer

	profile release.Profile
	cfgFile string
	conf    *Config
	log     *logger
}

// VersionEnv selects the cocoon release the simulator plays ("0.3.8" or "0.5.1"; default 0.5.1).
const VersionEnv = release.Env

// NoReapEnv, set to any value, plays a host whose init does not reap orphans: a hypervisor that
// exits stays a zombie until its VM is stopped or removed.
const NoReapEnv = guest.NoReapEnv

// SysfsEnv names a directory read as the host's /sys by vm device attach (test/fakesysfs lays
// one out).
const SysfsEnv = guest.SysfsEnv
