package main

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"google.golang.org/grpc"
	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"

	"github.com/cocoonstack/cocoon-cri/pkg/checkpoint"
)

// listOnly answers ListPodSandbox with its pods; no other RPC is called.
type listOnly struct {
	runtimeapi.RuntimeServiceClient
	pods []*runtimeapi.PodSandbox
}

func (l listOnly) ListPodSandbox(context.Context, *runtimeapi.ListPodSandboxRequest, ...grpc.CallOption) (*runtimeapi.ListPodSandboxResponse, error) {
	return &runtimeapi.ListPodSandboxResponse{Items: l.pods}, nil
}

// A pod is named as crictl names one: NAMESPACE/NAME of a ready pod, its ID, or a unique prefix.
func TestFindPodSandbox(t *testing.T) {
	pod := func(id, name string, state runtimeapi.PodSandboxState) *runtimeapi.PodSandbox {
		return &runtimeapi.PodSandbox{Id: id, State: state, Metadata: &runtimeapi.PodSandboxMetadata{Name: name, Namespace: "default"}}
	}
	rt := listOnly{pods: []*runtimeapi.PodSandbox{
		pod("abc111", "web", runtimeapi.PodSandboxState_SANDBOX_NOTREADY),
		pod("abc222", "web", runtimeapi.PodSandboxState_SANDBOX_READY),
		pod("def333", "db", runtimeapi.PodSandboxState_SANDBOX_READY),
	}}
	for _, tc := range []struct{ pod, want, err string }{
		{pod: "default/web", want: "abc222"},
		{pod: "abc1", want: "abc111"},
		{pod: "def333", want: "def333"},
		{pod: "abc", err: "2 pods match abc"},
		{pod: "other/web", err: "no pod other/web"},
		{pod: "default/gone", err: "no pod default/gone"},
		{pod: "", err: "name the pod"},
	} {
		sb, err := findPodSandbox(context.Background(), rt, tc.pod)
		switch {
		case tc.err != "" && (err == nil || !strings.Contains(err.Error(), tc.err)):
			t.Errorf("%q: %v, %v; want an error saying %q", tc.pod, sb, err, tc.err)
		case tc.err == "" && (err != nil || sb.GetId() != tc.want):
			t.Errorf("%q: %v, %v; want %s", tc.pod, sb, err, tc.want)
		}
	}
}

// Every container of the checkpoint is configured, from its file or by its name; a file that
// names another container, a container the checkpoint lacks or a key a config has not is refused.
func TestRestoreContainerConfigs(t *testing.T) {
	dir := t.TempDir()
	write := func(name, body string) string {
		t.Helper()
		path := filepath.Join(dir, name)
		if err := os.WriteFile(path, []byte(body), 0o600); err != nil {
			t.Fatal(err)
		}
		return path
	}
	write(checkpoint.PodFile, `{"version":1,"containers":[{"name":"app","snapshot":"c1"},{"name":"side","archive":"c2.tar"}]}`)
	side := write("side.json", `{"metadata":{"name":"side"},"log_path":"side.log","envs":[{"key":"A","value":"MQ=="}]}`)

	configs, err := restoreContainerConfigs(dir, []string{"side=" + side})
	if err != nil {
		t.Fatal(err)
	}
	if len(configs) != 2 || configs[0].GetMetadata().GetName() != "app" || configs[0].GetLogPath() != "app/0.log" ||
		configs[1].GetMetadata().GetName() != "side" || configs[1].GetLogPath() != "side.log" || string(configs[1].GetEnvs()[0].GetValue()) != "1" {
		t.Fatalf("configs %v", configs)
	}

	for _, tc := range []struct {
		files []string
		want  string
	}{
		{[]string{"side"}, "want NAME=FILE"},
		{[]string{"web=" + side}, `has no container "web"`},
		{[]string{"app=" + side}, `configures container "side", not "app"`},
		{[]string{"side=" + write("typo.json", `{"metadata":{"name":"side"},"logpath":"x"}`)}, `unknown field "logpath"`},
		{[]string{"side=" + filepath.Join(dir, "missing.json")}, "no such file"},
	} {
		if _, err := restoreContainerConfigs(dir, tc.files); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%v: %v, want an error saying %q", tc.files, err, tc.want)
		}
	}
	if _, err := restoreContainerConfigs(t.TempDir(), nil); err == nil {
		t.Error("a directory without pod.json was taken for a pod checkpoint")
	}
}
