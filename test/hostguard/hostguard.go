// Package hostguard checks that a test run left the host's own files alone: simulated guests write
// their /etc files and run commands as root, so a mistake there could change the host itself.
package hostguard

import (
	"bytes"
	"fmt"
	"os"
	"syscall"
)

// guarded are the host files guests have their own copies of.
var guarded = []string{"/etc/hosts", "/etc/hostname", "/etc/resolv.conf"}

// State is what the host looked like before the run.
type State struct {
	files map[string][]byte
}

// Snapshot records the guarded files.
func Snapshot() State {
	s := State{files: map[string][]byte{}}
	for _, f := range guarded {
		data, err := os.ReadFile(f)
		if err == nil {
			s.files[f] = data
		}
	}
	return s
}

// Check reports what changed since the snapshot, and whether /dev/null is still the null device.
func (s State) Check() error {
	var info syscall.Stat_t
	if err := syscall.Stat(os.DevNull, &info); err != nil {
		return fmt.Errorf("%s: %w", os.DevNull, err)
	}
	if info.Mode&syscall.S_IFMT != syscall.S_IFCHR || info.Rdev != 0x103 {
		return fmt.Errorf("%s is no longer the null device (mode %o): something replaced it", os.DevNull, info.Mode)
	}
	for f, before := range s.files {
		after, err := os.ReadFile(f)
		if err != nil || !bytes.Equal(before, after) {
			return fmt.Errorf("the host's %s changed during the run", f)
		}
	}
	return nil
}
