package guest

import (
	"bufio"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"time"
)

// FixedLatencyEnv turns on the simulator's benchmark mode: `vm clone` takes the duration it
// holds (a Go duration, "100ms") however little its own work took, and the VM it starts runs no
// guest at all. The hypervisor process, its API, console and vsock socket are there; its guest
// is nullOS. It measures cocoon-cri's own concurrency with cocoon's cost fixed: no test of
// behaviour uses it.
const FixedLatencyEnv = "COCOON_SIM_FIXED_LATENCY"

// FixedLatency is the benchmark mode's latency, 0 when it is off or unreadable.
func FixedLatency() time.Duration {
	d, err := time.ParseDuration(os.Getenv(FixedLatencyEnv))
	if err != nil || d < 0 {
		return 0
	}
	return d
}

// nullOS is the guest of the benchmark mode: nothing runs in it, and its agent answers every
// command at once with exit 0, without running it. poweroff powers the VM off, as a guest's
// would.
type nullOS struct{ v *vmm }

func (nullOS) plug(*nic) error                 { return nil }
func (nullOS) unplug(string)                   {}
func (nullOS) plugDisk(Disk) (string, error)   { return "vdb", nil }
func (nullOS) unplugDisk(string, string) error { return nil }
func (nullOS) network() (guestNetwork, error)  { return guestNetwork{}, nil }
func (nullOS) stop()                           {}

func (g nullOS) connectVsock(port uint32, conn *net.UnixConn) {
	defer conn.Close() //nolint:errcheck
	if port != AgentPort {
		return
	}
	if _, err := fmt.Fprintf(conn, "OK %d\n", 1<<15+hostPortCounter.Add(1)); err != nil {
		return
	}
	in := bufio.NewReader(conn)
	out := &frameWriter{w: conn}
	kind, payload, err := readFrame(in)
	if err != nil {
		return
	}
	if kind != frameReseed {
		req, err := decodeExecRequest(kind, payload)
		if err != nil {
			_ = out.send(frameError, []byte(err.Error()))
			return
		}
		if filepath.Base(req.Argv[0]) == "poweroff" {
			_ = out.sendExit(0)
			g.v.powerOff("the guest was asked to power off")
			return
		}
	}
	_ = out.sendExit(0)
}
