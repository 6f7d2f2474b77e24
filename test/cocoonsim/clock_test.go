package cocoonsim_test

import (
	"fmt"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/cocoonstack/cocoon-cri/pkg/cocoon"
	"github.com/cocoonstack/cocoon-cri/test/testimage"
)

// guestLag is how far the guest's clock (its date +%s) is behind the host's, in seconds.
func (s *sim) guestLag(vm string) int64 {
	s.t.Helper()
	out := s.inGuest(vm, "date", "+%s")
	host := time.Now().Unix()
	guest, err := strconv.ParseInt(strings.TrimSpace(out), 10, 64)
	if err != nil {
		s.t.Fatalf("guest date +%%s: %q", out)
	}
	return host - guest
}

// wantLag fails unless the guest lags by about want seconds: at least want less the second date
// +%s truncates, at most a minute more (what a slow machine takes between the capture and the
// look). The margins are generous; the lags tested are hours.
func (s *sim) wantLag(vm string, want int64, what string) {
	s.t.Helper()
	if got := s.guestLag(vm); got < want-2 || got > want+60 {
		s.t.Fatalf("%s: the guest's clock lags the host's by %d s, want about %d s", what, got, want)
	}
}

// capSysTime is CAP_SYS_TIME's bit in /proc/PID/status's capability masks.
const capSysTime = 25

// TestGuestClock: a guest restored from a snapshot resumes with the clock the snapshot has, so it
// lags by the time the snapshot sat; date -s and, where the VM has an RTC (cloud-hypervisor's
// CMOS RTC reads the host's time; Firecracker has none), hwclock -s set the guest's clock, never
// the host's: nothing in the guest can set the host's clock. A snapshot of a lagging guest
// carries the lag; a cold boot reads the RTC.
func TestGuestClock(t *testing.T) {
	const day = 24 * 60 * 60
	for _, hv := range []string{cocoon.HypervisorCloudHypervisor, cocoon.HypervisorFirecracker} {
		t.Run(hv, func(t *testing.T) {
			s := newSimAt(t, "0.5.1")
			s.importSnapshot(testimage.SnapshotOptions{Name: "old", Hypervisor: hv, GuestClock: time.Now().Add(-day * time.Second)})
			s.clone("old", "box")

			// Before anything in the guest tries to set a clock: the guest can never set the host's
			// (its capability bounding set lacks CAP_SYS_TIME), and its date and hwclock are the
			// simulator's.
			status := s.inGuest("box", "grep", "^CapBnd:", "/proc/self/status")
			bnd, err := strconv.ParseUint(strings.TrimSpace(strings.TrimPrefix(status, "CapBnd:")), 16, 64)
			if err != nil || bnd&(1<<capSysTime) != 0 {
				t.Fatalf("a guest process may set the host's clock: %q", status)
			}
			for _, tool := range []string{"date", "hwclock"} {
				if got := s.inGuest("box", "sh", "-c", "command -v "+tool); got != "/usr/local/sbin/"+tool+"\n" {
					t.Fatalf("the guest's %s is %q, not the simulator's", tool, got)
				}
			}
			hostBefore := time.Now()

			s.wantLag("box", day, "a clone of a day-old snapshot")

			s.inGuest("box", "date", "-s", fmt.Sprintf("@%d", time.Now().Unix()))
			s.wantLag("box", 0, "after date -s @<host time>")
			s.inGuest("box", "sh", "-c", "date -s @$(( $(date +%s) - 3600 )) >/dev/null")
			s.wantLag("box", 3600, "after date -s an hour back")

			// The guest's own date, bypassing the shim, cannot set the clock.
			r := s.vmExec("", "box", "--", "/usr/bin/date", "-s", fmt.Sprintf("@%d", time.Now().Unix()))
			if r.code == 0 || !strings.Contains(r.stderr, "Operation not permitted") {
				t.Fatalf("/usr/bin/date -s in the guest: exit %d, %s", r.code, stripANSI(r.stderr))
			}
			s.wantLag("box", 3600, "after a refused /usr/bin/date -s")

			r = s.vmExec("", "box", "--", "hwclock", "-s", "-u")
			if hv == cocoon.HypervisorFirecracker {
				if r.code != 1 || !strings.Contains(r.stderr, "Cannot access the Hardware Clock") {
					t.Fatalf("hwclock -s without an RTC: exit %d, %s", r.code, stripANSI(r.stderr))
				}
				s.wantLag("box", 3600, "after hwclock -s without an RTC")
			} else {
				if r.code != 0 {
					t.Fatalf("hwclock -s: exit %d, %s", r.code, stripANSI(r.stderr))
				}
				s.wantLag("box", 0, "after hwclock -s")
				s.inGuest("box", "sh", "-c", "date -s @$(( $(date +%s) - 3600 )) >/dev/null")
			}

			// A snapshot keeps the guest's clock: its clone lags as the guest did.
			s.ok("snapshot", "save", "--name", "lagging", "box")
			s.clone("lagging", "copy")
			s.wantLag("copy", 3600, "a clone of a snapshot of a guest an hour behind")

			// A cold boot reads the RTC, or, without one, whatever the boot sets: the host's time.
			s.ok("vm", "stop", "copy")
			s.ok("vm", "start", "copy")
			s.wantLag("copy", 0, "after a cold boot")

			// The host's clock was not stepped: its wall time moved as its monotonic clock did.
			if jump := time.Now().Round(0).Sub(hostBefore.Round(0)) - time.Since(hostBefore); jump > time.Second || jump < -time.Second {
				t.Fatalf("the host's clock jumped by %v while the guest set its own", jump)
			}
		})
	}
}
