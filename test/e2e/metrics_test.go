package e2e

import (
	"net/http"
	"regexp"
	"strconv"
	"strings"
	"testing"

	"github.com/cocoonstack/cocoon-cri/pkg/metrics"
	"github.com/cocoonstack/cocoon-cri/test/registry"
	"github.com/cocoonstack/cocoon-cri/test/testimage"
)

// servingMetrics matches the address the daemon logs it serves metrics on ("metrics=host:port").
var servingMetrics = regexp.MustCompile(`msg="cocoon-cri serving".* metrics=(\S+)`)

// metricsAddr is the address a node started with --metrics-addr 127.0.0.1:0 got, from its log.
func (n *node) metricsAddr() string {
	n.t.Helper()
	all := servingMetrics.FindAllStringSubmatch(n.Log(), -1)
	if len(all) == 0 {
		n.t.Fatalf("the daemon logged no metrics address\n%s", n.Log())
	}
	return all[len(all)-1][1]
}

// scrapeMetrics gets /metrics from inside the node, where the daemon listens, and returns its
// samples by series ("name{labels}", labels sorted as the text format writes them).
func (n *node) scrapeMetrics() map[string]float64 {
	n.t.Helper()
	code, body, err := n.HTTPGetInNode("http://" + n.metricsAddr() + metrics.Path)
	if err != nil || code != http.StatusOK {
		n.t.Fatalf("scrape: %d, %v\n%s", code, err, body)
	}
	samples := map[string]float64{}
	for line := range strings.Lines(body) {
		line = strings.TrimSpace(line)
		if line == "" || strings.HasPrefix(line, "#") {
			continue
		}
		i := strings.LastIndexByte(line, ' ')
		v, err := strconv.ParseFloat(line[i+1:], 64)
		if i < 0 || err != nil {
			n.t.Fatalf("malformed sample %q", line)
		}
		samples[line[:i]] = v
	}
	return samples
}

// TestMetrics: a node with --metrics-addr pulls an image and runs a pod through crictl; its
// /metrics endpoint shows the RPCs by code, the cocoon calls, the pull and the VM by state, and
// the VM counts follow a stop.
func TestMetrics(t *testing.T) {
	t.Parallel()
	n := newNode(t, "--metrics-addr", "127.0.0.1:0")
	reg := n.registry(registry.Options{})
	ref := reg.Host + "/e2e/snap:v1"
	n.pushSnapshot(reg.Target(), "e2e/snap:v1", "snap", testimage.SnapshotOptions{}, registry.SnapshotPush{})
	n.pull(ref)
	_, ctrID, _ := n.runningPod("web", ref)

	const rt, is = `runtime="cocoon",service="runtime.v1.RuntimeService"`, `runtime="cocoon",service="runtime.v1.ImageService"`
	atLeastOne := []string{
		`cocoon_cri_rpc_requests_total{code="OK",method="RunPodSandbox",` + rt + `}`,
		`cocoon_cri_rpc_requests_total{code="OK",method="CreateContainer",` + rt + `}`,
		`cocoon_cri_rpc_requests_total{code="OK",method="StartContainer",` + rt + `}`,
		`cocoon_cri_rpc_requests_total{code="OK",method="PullImage",` + is + `}`,
		`cocoon_cri_rpc_duration_seconds_count{method="StartContainer",` + rt + `}`,
		`cocoon_cri_cocoon_call_duration_seconds_count{subcommand="vm clone"}`,
		`cocoon_cri_cocoon_call_duration_seconds_count{subcommand="snapshot import"}`,
		`cocoon_cri_cni_call_duration_seconds_count{op="ADD"}`,
		`cocoon_cri_image_pull_duration_seconds_count{kind="snapshot",result="success"}`,
		`cocoon_cri_image_pull_bytes_total{kind="snapshot"}`,
	}
	samples := n.scrapeMetrics()
	for _, series := range atLeastOne {
		if samples[series] < 1 {
			t.Errorf("%s = %v, want at least 1", series, samples[series])
		}
	}
	if got := samples[`cocoon_cri_vms{state="running"}`]; got != 1 {
		t.Errorf("running VMs: %v, want 1", got)
	}
	if _, ok := samples["go_goroutines"]; !ok {
		t.Error("the Go runtime's metrics are missing")
	}

	n.mustCrictl("stop", ctrID)
	samples = n.scrapeMetrics()
	if running, exited := samples[`cocoon_cri_vms{state="running"}`], samples[`cocoon_cri_vms{state="exited"}`]; running != 0 || exited != 1 {
		t.Errorf("after stop: %v running, %v exited; want 0 and 1", running, exited)
	}
	if got := samples[`cocoon_cri_rpc_requests_total{code="OK",method="StopContainer",`+rt+`}`]; got != 1 {
		t.Errorf("StopContainer counted %v times, want 1", got)
	}
}
