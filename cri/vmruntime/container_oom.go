package vmruntime

import (
	"fmt"
	"os"
	"path/filepath"
	"strconv"

	"github.com/cocoonstack/cocoon-cri/pkg/store"
	"github.com/cocoonstack/cocoon-cri/pkg/vmstats"
)

// OOM score bounds of /proc/PID/oom_score_adj.
const (
	minOOMScoreAdj = -1000
	maxOOMScoreAdj = 1000
)

// setOOMScoreAdj gives the hypervisor, and what it started, the container's OOM score, as a
// container runtime gives it to the container's processes: the kubelet ranks pods by QoS class
// through it, so under memory pressure the node's kernel picks VMs in the same order as
// containers. A container config without resources leaves the score as cocoon started it.
func (s *Runtime) setOOMScoreAdj(c *store.Container, pid int) error {
	res := c.Config.Msg.GetLinux().GetResources()
	if res == nil || pid <= 0 {
		return nil
	}
	pids, err := vmstats.Tree(procRoot, pid)
	if err != nil {
		return fmt.Errorf("find the hypervisor's processes: %w", err)
	}
	adj := strconv.FormatInt(res.GetOomScoreAdj(), 10)
	for _, p := range pids {
		if err := os.WriteFile(filepath.Join(procRoot, strconv.Itoa(p), "oom_score_adj"), []byte(adj), 0); err != nil && !os.IsNotExist(err) {
			return fmt.Errorf("set the OOM score of the hypervisor's process %d to %s: %w", p, adj, err)
		}
	}
	return nil
}
