package e2e

import (
	"context"
	"os/exec"
	"regexp"
	"strconv"
	"testing"
	"time"
)

// critestSummary is ginkgo's last line: "SUCCESS! -- 9 Passed | 0 Failed | 0 Pending | 113 Skipped".
var critestSummary = regexp.MustCompile(`(\d+) Passed \| (\d+) Failed`)

// runCritest runs the CRI validation suite against the node with a focus and a skip expression and
// returns how many specs passed. It fails the test if any failed, or if fewer than minPassed ran:
// a focus that matches nothing must not pass silently.
func (n *node) runCritest(focus, skip string, minPassed int) int {
	n.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Minute)
	defer cancel()
	endpoint := "unix://" + n.socket
	cmd := exec.CommandContext(ctx, bins.critest,
		"--runtime-endpoint", endpoint, "--image-endpoint", endpoint,
		"--ginkgo.focus", focus, "--ginkgo.skip", skip, "--ginkgo.no-color")
	cmd.Dir = n.dir
	out, err := cmd.CombinedOutput()
	m := critestSummary.FindSubmatch(out)
	if err != nil || m == nil {
		n.t.Fatalf("critest --ginkgo.focus %q --ginkgo.skip %q: %v\n%s", focus, skip, err, out)
	}
	passed, _ := strconv.Atoi(string(m[1]))
	failed, _ := strconv.Atoi(string(m[2]))
	if failed > 0 || passed < minPassed {
		n.t.Fatalf("critest: %d passed, %d failed (want at least %d passed)\n%s", passed, failed, minPassed, out)
	}
	n.t.Logf("critest %q: %d specs passed", focus, passed)
	return passed
}

// TestCritestRuntimeInfoAndPodSandbox is the foundation's conformance gate: critest's Runtime info
// and PodSandbox groups, without sysctls (applied in a guest, not by the runtime) and host
// namespaces (refused by design). critest uses the default runtime handler.
func TestCritestRuntimeInfoAndPodSandbox(t *testing.T) {
	n := newNode(t, "--serve-default-handler")
	n.runCritest("Runtime info|PodSandbox", "sysctl|host", 6)
	if ns := n.netns(); len(ns) != 0 {
		t.Fatalf("critest left network namespaces: %v", ns)
	}
	if pods := n.mustCrictl("pods", "-q"); pods != "" {
		t.Fatalf("critest left sandboxes: %q", pods)
	}
}
