package vmruntime

import (
	"context"
	"fmt"
	"log/slog"
	"maps"
	"net"
	"slices"
	"strings"
	"time"

	"github.com/containerd/errdefs"

	"github.com/cocoonstack/cocoon-cri/pkg/cocoon"
	"github.com/cocoonstack/cocoon-cri/pkg/store"
	"github.com/cocoonstack/cocoon-cri/pkg/syncio"
	"github.com/cocoonstack/cocoon-cri/streaming"
	"github.com/cocoonstack/cocoon-cri/tapmanager"
)

// setUpGuest gives the guest what cocoon cannot at boot, through the guest exec path: a clone's
// pod address (a clone keeps its snapshot's network configuration; cocoon only swaps the NIC), the
// pod's hostname (cocoon names the guest after the VM) and the pod's resolvers with their search
// domains and options (cocoon passes servers only). Without an exec path the guest keeps what
// cocoon gave it; docs/networking.md says so.
func (s *Runtime) setUpGuest(ctx context.Context, sb *store.Sandbox, c *store.Container) {
	log := s.log.With("container", c.ID, "vm", c.VM.Name)
	// A cocoon that cannot be asked now is asked again below, within the budget: a passing failure
	// must not leave the guest unconfigured for good.
	path, _, err := s.guest.vmPath(ctx, c)
	if err == nil && path == ExecPathNone {
		log.Info("guest left as cocoon configured it: no way to run commands in it")
		return
	}
	budget := s.cfg.GuestReadyTimeout
	if (err != nil || path == ExecPathAgent) && s.cfg.GuestSSH.configured() {
		// The agent gets one guest-ready timeout; a guest found to have none, a second over SSH.
		budget *= 2
	}
	ctx, cancel := context.WithTimeout(ctx, budget)
	defer cancel()
	if err := s.configureGuest(ctx, sb, c); err != nil {
		log.Warn("the guest is left as cocoon configured it", "err", err)
		return
	}
	log.Info("guest configured for the pod")
	if c.VM.Mode == store.VMClone {
		s.reseedClone(ctx, c, log)
	}
}

// configureGuest runs the guest set-up script until the guest takes it, within ctx.
func (s *Runtime) configureGuest(ctx context.Context, sb *store.Sandbox, c *store.Container) error {
	return s.runGuestScript(ctx, sb, c, "configuring the guest for the pod", func() string { return guestSetupScript(sb, c, s.nowFunc()) })
}

// runGuestScript runs a shell script in the guest until the guest takes it, within ctx. The script
// is written anew at each try: it may carry the host's time.
func (s *Runtime) runGuestScript(ctx context.Context, sb *store.Sandbox, c *store.Container, what string, script func() string) error {
	for {
		// The guest's output is only reported, and a hostile guest may print without end: its tail.
		out := &syncio.Tail{Max: guestOutputTail}
		code, err := s.guest.run(ctx, sb, c, systemCommand("/bin/sh", "-c", script()), streaming.ExecIO{Stdout: out, Stderr: out})
		switch {
		case err == nil && code == 0:
			return nil
		case err == nil:
			return fmt.Errorf("%s failed with exit code %d: %s", what, code, strings.TrimSpace(out.String()))
		case ctx.Err() != nil:
			return fmt.Errorf("the guest did not take commands in time: %w", err)
		case errdefs.IsFailedPrecondition(err):
			return fmt.Errorf("the guest cannot take commands: %w", err)
		}
		// A guest still booting (its sshd not up yet): try again.
		select {
		case <-ctx.Done():
		case <-time.After(agentRetry):
		}
	}
}

// reseedClone gives a clone its own machine-id and fresh entropy: every clone of a snapshot wakes
// with the snapshot's. cocoon v0.5 tries that itself after vm clone, in the background and
// without reporting a failure; asked again once the agent has answered, it is made sure of.
func (s *Runtime) reseedClone(ctx context.Context, c *store.Container, log *slog.Logger) {
	if path, _, err := s.guest.vmPath(ctx, c); err != nil || path != ExecPathAgent {
		return
	}
	if caps, err := s.cocoon.Capabilities(ctx); err != nil || !caps.ReseedMachineID {
		return
	}
	if err := s.cocoon.VMReseed(ctx, c.VM.ID, true); err != nil {
		log.Warn("the clone may keep its snapshot's machine-id and entropy: vm reseed --machine-id failed", "err", err)
		return
	}
	log.Info("clone reseeded: fresh entropy and machine-id")
}

// stepClockLine is one shell command that steps a restored guest's wall clock to the host's. A
// guest restored from a snapshot (a clone, a fork, a checkpoint, a woken hibernation) resumes
// with the clock it had when the snapshot was taken, and nothing in cocoon steps it
// (docs/cocoon-contract.md, "The guest's clock"). The guest is set to now as cocoon-cri reads it,
// rounded to the second, which is what busybox's date takes; a guest whose date cannot set the
// clock reads cloud-hypervisor's RTC, which holds the host's time, with hwclock -s (Firecracker
// has no RTC). The RTC is not tried first: util-linux's hwclock waits for the second's edge, up to
// a second, and a wake is waited for. Output is dropped: the exit status says whether either
// worked.
func stepClockLine(backend string, now time.Time) string {
	date := fmt.Sprintf("date -u -s @%d", now.Round(time.Second).Unix())
	if backend == cocoon.HypervisorFirecracker {
		return "{ " + date + "; } >/dev/null 2>&1"
	}
	return "{ " + date + " || hwclock -s -u; } >/dev/null 2>&1"
}

// stepGuestClock steps a woken guest's clock to the host's, best effort: a failure is logged and
// the guest keeps its clock. It waits for the guest within wakeClockTimeout at most.
func (s *Runtime) stepGuestClock(ctx context.Context, sb *store.Sandbox, c *store.Container) {
	if path, _, err := s.guest.vmPath(ctx, c); err == nil && path == ExecPathNone {
		return
	}
	ctx, cancel := context.WithTimeout(ctx, min(s.cfg.GuestReadyTimeout, wakeClockTimeout))
	defer cancel()
	err := s.runGuestScript(ctx, sb, c, "stepping the guest clock", func() string { return stepClockLine(c.VM.Backend, s.nowFunc()) })
	if err != nil {
		s.log.Warn("the woken guest keeps the clock it hibernated with", "container", c.ID, "vm", c.VM.ID, "err", err)
	}
}

// wakeClockTimeout bounds how long a wake waits to step the woken guest's clock: its agent ran
// before it hibernated and answers at once, so a guest that does not is not waited for long.
const wakeClockTimeout = 10 * time.Second

// writeGuestNetwork adds to a clone's set-up script the pod's address and default route on its NIC.
// A booted guest took them from cocoon at boot.
func writeGuestNetwork(b *strings.Builder, sb *store.Sandbox, c *store.Container) {
	if c.VM.Mode != store.VMClone || sb.Network == nil || len(sb.Network.Result) == 0 {
		return
	}
	result, err := tapmanager.DecodeResult(sb.Network.Result)
	if err != nil {
		return
	}
	addr, gw, ok := tapmanager.PodIPv4(result)
	if !ok {
		return
	}
	ones, _ := addr.Mask.Size()
	mac := strings.ToLower(sb.Network.MAC)
	if c.VM.GuestNIC != "" {
		writeKnownNICSetUp(b, c.VM.GuestNIC, mac, fmt.Sprintf("%s/%d", addr.IP, ones), gw)
		return
	}
	b.WriteString("(\nset -e\n")
	fmt.Fprintf(b, "mac=%s\n", streaming.ShellQuote([]string{mac}))
	b.WriteString("dev=\nfor d in /sys/class/net/*; do [ \"$(cat \"$d/address\" 2>/dev/null)\" = \"$mac\" ] && dev=${d##*/}; done\n")
	if c.VM.Backend == cocoon.HypervisorFirecracker {
		b.WriteString(adoptSoleNIC)
	}
	b.WriteString("[ -n \"$dev\" ] || { echo \"no interface with MAC $mac\" >&2; exit 1; }\n")
	b.WriteString("ip link set \"$dev\" up\nip addr flush dev \"$dev\"\n")
	fmt.Fprintf(b, "ip addr add %s/%d dev \"$dev\"\n", addr.IP, ones)
	if gw != nil {
		fmt.Fprintf(b, "ip route replace default via %s dev \"$dev\"\n", gw)
	}
	b.WriteString(") || failed=1\n")
}

// writeKnownNICSetUp sets up a NIC whose name is known (a warm pool VM's, named when the pool made
// it): its MAC, address and default route, in one ip process where the guest's ip takes a batch
// (iproute2's does; busybox's does not, and gets one process per step), since the hand-over is
// waited for.
func writeKnownNICSetUp(b *strings.Builder, dev, mac, cidr string, gw net.IP) {
	steps := []string{
		"link set dev " + dev + " down",
		"link set dev " + dev + " address " + mac + " up",
		"addr flush dev " + dev,
		"addr add " + cidr + " dev " + dev,
	}
	if gw != nil {
		steps = append(steps, "route replace default via "+gw.String()+" dev "+dev)
	}
	b.WriteString("{ ip -batch - 2>/dev/null <<'EOF'\n" + strings.Join(steps, "\n") + "\nEOF\n} || (\nset -e\n")
	for _, step := range steps {
		b.WriteString("ip " + step + "\n")
	}
	b.WriteString(") || failed=1\n")
}

// guestOutputTail is how much of the guest's output to its set-up is kept for the log.
const guestOutputTail = 4 << 10

// adoptSoleNIC, with no interface at the pod's MAC, takes the guest's only Ethernet interface
// other than loopback and gives it that MAC.
const adoptSoleNIC = `if [ -z "$dev" ]; then
n=0
for d in /sys/class/net/*; do [ "${d##*/}" != lo ] && [ "$(cat "$d/type" 2>/dev/null)" = 1 ] && { dev=${d##*/}; n=$((n+1)); }; done
[ "$n" = 1 ] || { echo "no interface with MAC $mac, and $n Ethernet interfaces to give it to" >&2; exit 1; }
ip link set "$dev" down
ip link set "$dev" address "$mac"
fi
`

// guestSetupScript is the shell script that configures the guest. Its parts are independent: one
// that fails (a hostname the guest refuses) does not keep the others from being applied, and the
// script still exits non-zero so the failure is logged. The NIC is found by the pod interface's
// MAC, which cocoon gave it: its name in the guest depends on the guest. A Firecracker clone's
// NIC keeps its snapshot's MAC (cocoon can only point it at a new TAP), so there the guest's one
// Ethernet interface is taken and given the pod's MAC, as cocoon's own clone hints advise. A warm
// pool VM's NIC has its placeholder's MAC; the pool learned its name, and it is given the pod's.
//
// A clone's wall clock is stepped first, to now: it resumed at its snapshot's time (see
// stepClockLine). A pool VM's was stepped when the pool made it, and has run since.
func guestSetupScript(sb *store.Sandbox, c *store.Container, now time.Time) string {
	cfg := sb.Config.Msg
	var b strings.Builder
	b.WriteString("failed=0\n")
	if c.VM.Mode == store.VMClone && !c.VM.Pooled {
		b.WriteString(stepClockLine(c.VM.Backend, now) + " || { echo 'the guest clock could not be stepped to the host time' >&2; failed=1; }\n")
	}
	writeGuestNetwork(&b, sb, c)
	// Without a hostname in the config (crictl, critest) the guest keeps its own, as a container
	// without one keeps the runtime's default.
	if hostname := cfg.GetHostname(); hostname != "" {
		quoted := streaming.ShellQuote([]string{hostname})
		set := "hostname " + quoted
		if c.VM.GuestNIC != "" {
			// No process for it where the hand-over is waited for.
			set = "printf '%s' " + quoted + " > /proc/sys/kernel/hostname"
		}
		fmt.Fprintf(&b, "{ %s && echo %s > /etc/hostname; } || failed=1\n", set, quoted)
	}
	if dns := cfg.GetDnsConfig(); dns != nil && (len(dns.GetServers())+len(dns.GetSearches())+len(dns.GetOptions())) > 0 {
		var conf strings.Builder
		for _, server := range dns.GetServers() {
			fmt.Fprintf(&conf, "nameserver %s\n", server)
		}
		if len(dns.GetSearches()) > 0 {
			fmt.Fprintf(&conf, "search %s\n", strings.Join(dns.GetSearches(), " "))
		}
		if len(dns.GetOptions()) > 0 {
			fmt.Fprintf(&conf, "options %s\n", strings.Join(dns.GetOptions(), " "))
		}
		fmt.Fprintf(&b, "printf '%%s' %s > /etc/resolv.conf || failed=1\n", streaming.ShellQuote([]string{conf.String()}))
	}
	// A container runtime sets the pod's sysctls in the pod's namespaces; a VM's whole kernel is the
	// pod's. Written under /proc/sys, which every Linux guest has (sysctl(8) may be missing).
	sysctls := cfg.GetLinux().GetSysctls()
	for _, name := range slices.Sorted(maps.Keys(sysctls)) {
		if path, ok := sysctlPath(name); ok {
			fmt.Fprintf(&b, "printf '%%s\\n' %s > %s || failed=1\n",
				streaming.ShellQuote([]string{sysctls[name]}), streaming.ShellQuote([]string{"/proc/sys/" + path}))
		}
	}
	b.WriteString("exit $failed\n")
	return b.String()
}
