package metrics

import (
	"context"
	"errors"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc/codes"

	"github.com/cocoonstack/cocoon-cri/pkg/store"
	"github.com/cocoonstack/cocoon-cri/pkg/store/storetest"
)

var discard = slog.New(slog.DiscardHandler)

// scrape serves one scrape through the promhttp handler, as Prometheus would get it, and returns
// its samples: "name{labels}" (labels sorted, as the text format writes them) to value.
func scrape(t *testing.T, m *Metrics) map[string]string {
	t.Helper()
	rec := httptest.NewRecorder()
	m.Handler(discard).ServeHTTP(rec, httptest.NewRequest(http.MethodGet, Path, nil))
	if rec.Code != http.StatusOK {
		t.Fatalf("scrape: status %d: %s", rec.Code, rec.Body)
	}
	return parseExposition(t, rec.Body.String())
}

func parseExposition(t *testing.T, text string) map[string]string {
	t.Helper()
	samples := map[string]string{}
	for line := range strings.Lines(text) {
		line = strings.TrimSpace(line)
		if line == "" || strings.HasPrefix(line, "#") {
			continue
		}
		i := strings.LastIndexByte(line, ' ')
		if i < 0 {
			t.Fatalf("malformed sample line %q", line)
		}
		samples[line[:i]] = line[i+1:]
	}
	return samples
}

func expect(t *testing.T, samples map[string]string, want map[string]string) {
	t.Helper()
	for series, value := range want {
		got, ok := samples[series]
		if !ok {
			t.Errorf("series %s missing from the exposition", series)
			continue
		}
		if got != value {
			t.Errorf("%s = %s, want %s", series, got, value)
		}
	}
}

// Every hook the daemon calls ends up as the documented series with the documented labels.
func TestHooksAppearInTheExposition(t *testing.T) {
	m := New(nil, "1.2.3")

	m.CocoonCall("vm clone", 1500*time.Millisecond, nil)
	m.CocoonCall("vm rm", 10*time.Millisecond, errors.New("exit status 1"))
	m.CocoonCall("vm rm", 10*time.Millisecond, nil)

	m.CNICall("ADD", 200*time.Millisecond, nil)
	m.CNICall("DEL", 50*time.Millisecond, errors.New("plugin gone"))

	m.ImagePulled("snapshot", 3*time.Second, 4096, false, nil)
	m.ImagePulled("snapshot", 20*time.Millisecond, 0, true, nil)
	m.ImagePulled("cloudimg", 2*time.Second, 100, false, errors.New("stalled"))
	m.ImagePulled("", time.Second, 0, false, errors.New("manifest unknown"))

	m.Orphans(3)
	m.Orphans(2) // a gauge: the last reconcile's count, not a sum
	m.WatcherRestarted()
	m.WatcherRestarted()

	expect(t, scrape(t, m), map[string]string{
		`cocoon_cri_build_info{version="1.2.3"}`: "1",

		`cocoon_cri_cocoon_call_duration_seconds_count{subcommand="vm clone"}`:           "1",
		`cocoon_cri_cocoon_call_duration_seconds_sum{subcommand="vm clone"}`:             "1.5",
		`cocoon_cri_cocoon_call_duration_seconds_bucket{subcommand="vm clone",le="1"}`:   "0",
		`cocoon_cri_cocoon_call_duration_seconds_bucket{subcommand="vm clone",le="2.5"}`: "1",
		`cocoon_cri_cocoon_call_duration_seconds_count{subcommand="vm rm"}`:              "2",
		`cocoon_cri_cocoon_call_failures_total{subcommand="vm rm"}`:                      "1",
		`cocoon_cri_cni_call_duration_seconds_count{op="ADD"}`:                           "1",
		`cocoon_cri_cni_call_duration_seconds_bucket{op="ADD",le="0.25"}`:                "1",
		`cocoon_cri_cni_call_failures_total{op="DEL"}`:                                   "1",
		`cocoon_cri_image_pull_duration_seconds_count{kind="snapshot",result="success"}`: "1",
		`cocoon_cri_image_pull_duration_seconds_count{kind="snapshot",result="present"}`: "1",
		`cocoon_cri_image_pull_duration_seconds_count{kind="cloudimg",result="failure"}`: "1",
		`cocoon_cri_image_pull_duration_seconds_count{kind="unknown",result="failure"}`:  "1",
		`cocoon_cri_image_pull_bytes_total{kind="snapshot"}`:                             "4096",
		`cocoon_cri_image_pull_bytes_total{kind="cloudimg"}`:                             "100",
		`cocoon_cri_orphan_vms`:                   "2",
		`cocoon_cri_event_watcher_restarts_total`: "2",
		`cocoon_cri_image_pull_duration_seconds_bucket{kind="snapshot",result="success",le="5"}`: "1",
	})
	samples := scrape(t, m)
	if _, ok := samples[`cocoon_cri_cocoon_call_failures_total{subcommand="vm clone"}`]; ok {
		t.Error("a cocoon call that succeeded was counted as a failure")
	}
	if _, ok := samples[`cocoon_cri_image_pull_bytes_total{kind="unknown"}`]; ok {
		t.Error("a pull that downloaded nothing added a bytes series")
	}
	// The runtime's own health comes with it, from the private registry.
	for _, name := range []string{"go_goroutines", "process_start_time_seconds", "process_resident_memory_bytes"} {
		if _, ok := samples[name]; !ok {
			t.Errorf("%s missing: the Go or process collector is not registered", name)
		}
	}
}

// RPCs are counted by service, method, the runtime that served them and the code the client saw.
func TestRPCsCountedByRuntimeAndCode(t *testing.T) {
	m := New(nil, "test")
	m.RPCDone("/runtime.v1.RuntimeService/RunPodSandbox", "cocoon", time.Millisecond, codes.OK)
	m.RPCDone("/runtime.v1.RuntimeService/RunPodSandbox", "cocoon", time.Millisecond, codes.OK)
	m.RPCDone("/runtime.v1.RuntimeService/RunPodSandbox", "passthrough", time.Millisecond, codes.OK)
	m.RPCDone("/runtime.v1.RuntimeService/StartContainer", "cocoon", time.Millisecond, codes.FailedPrecondition)
	m.RPCDone("/runtime.v1.ImageService/PullImage", "passthrough", time.Millisecond, codes.Unavailable)
	m.RPCDone("/runtime.v1.RuntimeService/ListPodSandbox", "both", time.Millisecond, codes.OK)
	m.RPCOwnTime("/runtime.v1.RuntimeService/RunPodSandbox", "cocoon", 2*time.Millisecond)
	m.RPCOwnTime("/runtime.v1.RuntimeService/RunPodSandbox", "cocoon", 300*time.Microsecond)

	const rt = `service="runtime.v1.RuntimeService"`
	expect(t, scrape(t, m), map[string]string{
		`cocoon_cri_rpc_requests_total{code="OK",method="RunPodSandbox",runtime="cocoon",` + rt + `}`:                                  "2",
		`cocoon_cri_rpc_requests_total{code="OK",method="RunPodSandbox",runtime="passthrough",` + rt + `}`:                             "1",
		`cocoon_cri_rpc_requests_total{code="FailedPrecondition",method="StartContainer",runtime="cocoon",` + rt + `}`:                 "1",
		`cocoon_cri_rpc_requests_total{code="Unavailable",method="PullImage",runtime="passthrough",service="runtime.v1.ImageService"}`: "1",
		`cocoon_cri_rpc_requests_total{code="OK",method="ListPodSandbox",runtime="both",` + rt + `}`:                                   "1",
		`cocoon_cri_rpc_duration_seconds_count{method="RunPodSandbox",runtime="cocoon",` + rt + `}`:                                    "2",
		`cocoon_cri_rpc_own_duration_seconds_count{method="RunPodSandbox",runtime="cocoon",` + rt + `}`:                                "2",
		`cocoon_cri_rpc_own_duration_seconds_sum{method="RunPodSandbox",runtime="cocoon",` + rt + `}`:                                  "0.0023",
		`cocoon_cri_rpc_own_duration_seconds_bucket{method="RunPodSandbox",runtime="cocoon",` + rt + `,le="0.0005"}`:                   "1",
	})
}

// The VM gauge is read from the records at each scrape: it follows every change without anyone
// moving it, and states with no container read zero rather than vanish.
func TestVMsByStateFollowTheStore(t *testing.T) {
	st := storetest.Open(t)
	m := New(st, "test")
	expect(t, scrape(t, m), map[string]string{
		`cocoon_cri_vms{state="created"}`: "0",
		`cocoon_cri_vms{state="running"}`: "0",
		`cocoon_cri_vms{state="exited"}`:  "0",
	})

	for id, state := range map[string]store.ContainerState{
		"a": store.ContainerRunning, "b": store.ContainerRunning, "c": store.ContainerCreated, "d": store.ContainerExited,
	} {
		if err := st.Containers.Create(&store.Container{ID: id, Name: id, State: state}); err != nil {
			t.Fatal(err)
		}
	}
	expect(t, scrape(t, m), map[string]string{
		`cocoon_cri_vms{state="created"}`: "1",
		`cocoon_cri_vms{state="running"}`: "2",
		`cocoon_cri_vms{state="exited"}`:  "1",
	})

	if _, err := st.Containers.Modify("a", func(c *store.Container) error { c.State = store.ContainerExited; return nil }); err != nil {
		t.Fatal(err)
	}
	if err := st.Containers.Delete("d"); err != nil {
		t.Fatal(err)
	}
	expect(t, scrape(t, m), map[string]string{
		`cocoon_cri_vms{state="created"}`: "1",
		`cocoon_cri_vms{state="running"}`: "1",
		`cocoon_cri_vms{state="exited"}`:  "1",
	})
}

// The endpoint serves the registry over HTTP on the port it was given (or picked), and Shutdown
// ends Serve cleanly.
func TestEndpointServesUntilShutdown(t *testing.T) {
	m := New(nil, "test")
	m.WatcherRestarted()
	ep, err := m.Listen("127.0.0.1:0", discard, false)
	if err != nil {
		t.Fatal(err)
	}
	served := make(chan error, 1)
	go func() { served <- ep.Serve() }()

	resp, err := http.Get("http://" + ep.Addr().String() + Path)
	if err != nil {
		t.Fatal(err)
	}
	body, err := io.ReadAll(resp.Body)
	resp.Body.Close()
	if err != nil {
		t.Fatal(err)
	}
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("GET %s: %s", Path, resp.Status)
	}
	expect(t, parseExposition(t, string(body)), map[string]string{`cocoon_cri_event_watcher_restarts_total`: "1"})

	if resp, err := http.Get("http://" + ep.Addr().String() + "/other"); err != nil {
		t.Fatal(err)
	} else if resp.Body.Close(); resp.StatusCode != http.StatusNotFound {
		t.Errorf("GET /other: %s, want 404: only %s is served", resp.Status, Path)
	}
	if resp, err := http.Get("http://" + ep.Addr().String() + ProfilingPath + "cmdline"); err != nil {
		t.Fatal(err)
	} else if resp.Body.Close(); resp.StatusCode != http.StatusNotFound {
		t.Errorf("GET %scmdline without profiling: %s, want 404", ProfilingPath, resp.Status)
	}

	if err := ep.Shutdown(context.Background()); err != nil {
		t.Fatal(err)
	}
	if err := <-served; err != nil {
		t.Fatalf("Serve after Shutdown: %v", err)
	}
}

// With profiling, the Go runtime's profiles are served beside the metrics.
func TestEndpointServesProfilesWhenAsked(t *testing.T) {
	ep, err := New(nil, "test").Listen("127.0.0.1:0", discard, true)
	if err != nil {
		t.Fatal(err)
	}
	go ep.Serve()
	defer ep.Shutdown(context.Background())
	for path, want := range map[string]string{ProfilingPath: "goroutine", ProfilingPath + "heap?debug=1": "heap profile", Path: "go_goroutines"} {
		resp, err := http.Get("http://" + ep.Addr().String() + path)
		if err != nil {
			t.Fatal(err)
		}
		body, err := io.ReadAll(resp.Body)
		resp.Body.Close()
		if err != nil || resp.StatusCode != http.StatusOK || !strings.Contains(string(body), want) {
			t.Errorf("GET %s: %s, %v; want 200 with %q", path, resp.Status, err, want)
		}
	}
}

// A busy address is reported when listening, so the daemon fails at start rather than run blind.
func TestListenReportsABusyAddress(t *testing.T) {
	m := New(nil, "test")
	ep, err := m.Listen("127.0.0.1:0", discard, false)
	if err != nil {
		t.Fatal(err)
	}
	defer ep.Shutdown(context.Background())
	if _, err := m.Listen(ep.Addr().String(), discard, false); err == nil || !strings.Contains(err.Error(), "metrics address") {
		t.Fatalf("second Listen on %s: %v, want an error naming the metrics address", ep.Addr(), err)
	}
}
