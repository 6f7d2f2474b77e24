package e2e

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/cocoonstack/cocoon-cri/test/cocoonsim/guest"
	containerdtest "github.com/cocoonstack/cocoon-cri/test/containerd"
	"github.com/cocoonstack/cocoon-cri/test/registry"
	"github.com/cocoonstack/cocoon-cri/test/testimage"
)

// critestSummary is ginkgo's last line: "SUCCESS! -- 9 Passed | 0 Failed | 0 Pending | 113 Skipped".
var critestSummary = regexp.MustCompile(`(\d+) Passed \| (\d+) Failed`)

// runCritest runs the CRI validation suite against the node with a focus and a skip expression and
// returns how many specs passed. It fails the test if any failed, or if fewer than minPassed ran:
// a focus that matches nothing must not pass silently.
func (n *node) runCritest(focus, skip string, minPassed int, extraArgs ...string) int {
	n.t.Helper()
	out, err := n.critest("unix://"+n.Socket, focus, skip, extraArgs...)
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

// critest runs the CRI validation suite against endpoint, in the node's namespace, where the
// streams are served and the pod IPs route.
func (n *node) critest(endpoint, focus, skip string, extraArgs ...string) ([]byte, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Minute)
	defer cancel()
	args := []string{"--net=" + n.NodeNS, "--", bins.Critest,
		"--runtime-endpoint", endpoint, "--image-endpoint", endpoint,
		"--ginkgo.focus", focus, "--ginkgo.skip", skip, "--ginkgo.no-color"}
	cmd := exec.CommandContext(ctx, "nsenter", append(args, extraArgs...)...)
	cmd.Dir = n.Dir
	return cmd.CombinedOutput()
}

// TestCritestConformance runs the CRI validation suite against cocoon-cri with --runtime-handler
// cocoon, skipping only the specs listed in testdata/critest-skips.txt (each with its reason;
// docs/conformance.md shows them with the results per group). critest's default container image is
// a snapshot whose guest has busybox's userland (its containers run "top", which needs busybox's
// to run without a terminal), its web server image one whose guest serves HTTP on port 80; both
// are pulled from a registry on the node. The node passes other pods to containerd, as deployed:
// the VM pods must not notice.
func TestCritestConformance(t *testing.T) {
	t.Parallel()
	n, _ := newPassthroughNode(t, containerdtest.Options{})
	n.Start()
	reg := n.registry(registry.Options{})
	n.pushSnapshot(reg.Target(), "critest/busybox:1", "busybox", testimage.SnapshotOptions{Guest: guest.Spec{Busybox: true}}, registry.SnapshotPush{})
	n.pushSnapshot(reg.Target(), "critest/web:1", "web", testimage.SnapshotOptions{Guest: guest.Spec{Busybox: true, HTTPPort: 80}}, registry.SnapshotPush{})
	images := n.WriteFile("test-images.yaml", []byte(fmt.Sprintf(
		"defaultTestContainerImage: %s/critest/busybox:1\nwebServerTestImage: %s/critest/web:1\n", reg.Host, reg.Host)))
	report := filepath.Join(n.Dir, "critest-report.json")
	n.runCritest("", critestSkips(t), 38, "--runtime-handler", "cocoon", "--test-images-file", images,
		"--ginkgo.json-report", report)
	for _, g := range critestGroups(t, report) {
		t.Logf("%-32s passed %3d  failed %3d  skipped %3d", g.name, g.passed, g.failed, g.skipped)
	}
	if pods := n.mustCrictl("pods", "-q"); pods != "" {
		t.Fatalf("critest left sandboxes: %q", pods)
	}
	if ns := n.netns(); len(ns) != 0 {
		t.Fatalf("critest left network namespaces: %v", ns)
	}
}

// critestSkips reads testdata/critest-skips.txt into one --ginkgo.skip expression.
func critestSkips(t *testing.T) string {
	return skipList(t, "testdata/critest-skips.txt")
}

// skipList reads a list of critest skips, one ginkgo expression and its reason per line, into one
// --ginkgo.skip expression.
func skipList(t *testing.T, file string) string {
	t.Helper()
	data, err := os.ReadFile(file)
	if err != nil {
		t.Fatal(err)
	}
	var exprs []string
	for _, line := range strings.Split(string(data), "\n") {
		if line = strings.TrimSpace(line); line == "" || strings.HasPrefix(line, "#") {
			continue
		}
		expr, reason, ok := strings.Cut(line, " # ")
		if !ok || strings.TrimSpace(reason) == "" {
			t.Fatalf("%s: %q has no reason", file, line)
		}
		exprs = append(exprs, strings.TrimSpace(expr))
	}
	return strings.Join(exprs, "|")
}

type critestGroup struct {
	name                    string
	passed, failed, skipped int
}

// critestSpec is one spec of a ginkgo JSON report.
type critestSpec struct {
	ContainerHierarchyTexts []string
	LeafNodeText            string
	State                   string
}

func (s critestSpec) name() string {
	return strings.Join(append(slices.Clone(s.ContainerHierarchyTexts), s.LeafNodeText), " ")
}

// readCritestReport reads the specs of a ginkgo JSON report.
func readCritestReport(t *testing.T, path string) []critestSpec {
	t.Helper()
	data, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	var reports []struct{ SpecReports []critestSpec }
	if err := json.Unmarshal(data, &reports); err != nil {
		t.Fatalf("critest report: %v", err)
	}
	var specs []critestSpec
	for _, r := range reports {
		specs = append(specs, r.SpecReports...)
	}
	return specs
}

// critestGroups counts a ginkgo JSON report's specs by top-level group ("Networking").
func critestGroups(t *testing.T, path string) []critestGroup {
	t.Helper()
	byName := map[string]*critestGroup{}
	var groups []critestGroup
	for _, spec := range readCritestReport(t, path) {
		if len(spec.ContainerHierarchyTexts) == 0 {
			continue
		}
		name := strings.TrimPrefix(spec.ContainerHierarchyTexts[0], "[k8s.io] ")
		g := byName[name]
		if g == nil {
			g = &critestGroup{name: name}
			byName[name] = g
		}
		switch spec.State {
		case "passed":
			g.passed++
		case "skipped", "pending":
			g.skipped++
		default:
			g.failed++
		}
	}
	for _, g := range byName {
		groups = append(groups, *g)
	}
	slices.SortFunc(groups, func(a, b critestGroup) int { return strings.Compare(a.name, b.name) })
	return groups
}
