package vmruntime

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/cocoonstack/cocoon-cri/pkg/cocoon"
	"github.com/cocoonstack/cocoon-cri/pkg/store"
)

// TestGuestSetupStepsAClonesClock: a clone's set-up steps its clock first (it resumed at its
// snapshot's time), to the host's time, or from the RTC where the hypervisor has one and the
// guest's date cannot; a booted VM read the RTC at boot, and a pool VM's clock was stepped when the
// pool made it.
func TestGuestSetupStepsAClonesClock(t *testing.T) {
	now := time.Unix(1_800_000_000, 600_000_000) // rounds up to ...001
	sb := &store.Sandbox{}
	for _, tc := range []struct {
		vm   store.VM
		want string
	}{
		{store.VM{Mode: store.VMClone}, "{ date -u -s @1800000001 || hwclock -s -u; } >/dev/null 2>&1 || "},
		{store.VM{Mode: store.VMClone, Backend: cocoon.HypervisorFirecracker}, "{ date -u -s @1800000001; } >/dev/null 2>&1 || "},
		{store.VM{Mode: store.VMBoot}, ""},
		{store.VM{Mode: store.VMClone, Pooled: true}, ""},
	} {
		script := guestSetupScript(sb, &store.Container{VM: tc.vm}, now)
		first := strings.SplitN(script, "\n", 3)[1]
		if tc.want == "" {
			if strings.Contains(script, "date") {
				t.Errorf("%+v: the set-up steps the clock:\n%s", tc.vm, script)
			}
			continue
		}
		if !strings.HasPrefix(first, tc.want) {
			t.Errorf("%+v: the set-up begins\n%s\nwant\n%s...", tc.vm, first, tc.want)
		}
	}
}

// TestStepClockLineFallsBack runs the clock step in a shell whose hwclock and date are stubs: the
// host's time first, the RTC when the guest's date cannot set the clock, and a failure of both
// shows in the exit status only.
func TestStepClockLineFallsBack(t *testing.T) {
	now := time.Unix(1_800_000_000, 0)
	for _, tc := range []struct {
		name            string
		hwclock, date   string // stub exit codes; "" = no such command
		wantRan         string
		wantExitNonZero bool
	}{
		{"date", "0", "0", "date -u -s @1800000000\n", false},
		{"date refused", "0", "1", "date -u -s @1800000000\nhwclock -s -u\n", false},
		{"no date", "0", "", "hwclock -s -u\n", false},
		{"neither", "1", "1", "date -u -s @1800000000\nhwclock -s -u\n", true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			dir := t.TempDir()
			log := filepath.Join(dir, "ran")
			for name, code := range map[string]string{"hwclock": tc.hwclock, "date": tc.date} {
				if code == "" {
					continue
				}
				stub := fmt.Sprintf("#!/bin/sh\necho \"%s $*\" >> %s\necho noise; echo noise >&2\nexit %s\n", name, log, code)
				if err := os.WriteFile(filepath.Join(dir, name), []byte(stub), 0o755); err != nil { //nolint:gosec // a test stub
					t.Fatal(err)
				}
			}
			cmd := exec.Command("/bin/sh", "-c", stepClockLine(cocoon.HypervisorCloudHypervisor, now))
			cmd.Env = []string{"PATH=" + dir}
			out, err := cmd.CombinedOutput()
			if (err != nil) != tc.wantExitNonZero || len(out) != 0 {
				t.Fatalf("exit %v, output %q", err, out)
			}
			ran, _ := os.ReadFile(log) //nolint:gosec // the test's own file
			if string(ran) != tc.wantRan {
				t.Fatalf("ran %q, want %q", ran, tc.wantRan)
			}
		})
	}
}
