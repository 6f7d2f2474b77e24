package e2e

import (
	"bytes"
	"encoding/json"
	"maps"
	"os"
	"path/filepath"
	"testing"

	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"

	"github.com/cocoonstack/cocoon-cri/pkg/cocoon"
	"github.com/cocoonstack/cocoon-cri/test/cocoonsim"
	"github.com/cocoonstack/cocoon-cri/test/cocoonsim/guest"
	"github.com/cocoonstack/cocoon-cri/test/testimage"
)

// podConfig is a pod sandbox config as the kubelet would send it for pod name/uid.
func (n *node) podConfig(name, uid string) *runtimeapi.PodSandboxConfig {
	return &runtimeapi.PodSandboxConfig{
		Metadata:     &runtimeapi.PodSandboxMetadata{Name: name, Namespace: "default", Uid: uid},
		Hostname:     name,
		LogDirectory: filepath.Join(n.PodLogs, "default_"+name+"_"+uid),
		Labels:       map[string]string{"app": name, "io.kubernetes.pod.name": name, "io.kubernetes.pod.namespace": "default"},
		Annotations:  map[string]string{"owner": "e2e"},
		Linux:        &runtimeapi.LinuxPodSandboxConfig{CgroupParent: n.podCgroupParent},
	}
}

// containerConfig is a container config for image.
func containerConfig(name, image string) *runtimeapi.ContainerConfig {
	return &runtimeapi.ContainerConfig{
		Metadata: &runtimeapi.ContainerMetadata{Name: name},
		Image:    &runtimeapi.ImageSpec{Image: image},
		LogPath:  name + ".log",
		Labels:   map[string]string{"tier": "vm"},
		Linux: &runtimeapi.LinuxContainerConfig{Resources: &runtimeapi.LinuxContainerResources{
			CpuPeriod: 100000, CpuQuota: 100000, MemoryLimitInBytes: 1 << 30,
		}},
	}
}

// configFile writes a CRI message as the JSON crictl reads.
func (n *node) configFile(name string, msg any) string {
	n.t.Helper()
	data, err := json.Marshal(msg)
	if err == nil {
		data, err = envValuesAsText(msg, data)
	}
	if err != nil {
		n.t.Fatal(err)
	}
	return n.WriteFile(name, data)
}

// envValuesAsText rewrites a container config's environment values as the text crictl reads: its
// cri-api (v0.36) has them as strings, where v0.37's Go type is bytes, which JSON writes in base64.
// The protobuf wire format is the same for both.
func envValuesAsText(msg any, data []byte) ([]byte, error) {
	cfg, ok := msg.(*runtimeapi.ContainerConfig)
	if !ok || len(cfg.GetEnvs()) == 0 {
		return data, nil
	}
	var fields map[string]any
	if err := json.Unmarshal(data, &fields); err != nil {
		return nil, err
	}
	envs := make([]map[string]string, 0, len(cfg.GetEnvs()))
	for _, kv := range cfg.GetEnvs() {
		envs = append(envs, map[string]string{"key": kv.GetKey(), "value": string(kv.GetValue())})
	}
	fields["envs"] = envs
	return json.Marshal(fields)
}

// cloudImage writes a qcow2 cloud image and installs the UEFI firmware cocoon boots it with.
func (n *node) cloudImage(name string) string {
	n.t.Helper()
	return n.cloudImageWithGuest(name, guest.Spec{})
}

// cloudImageWithGuest is cloudImage whose simulated guest behaves as spec says.
func (n *node) cloudImageWithGuest(name string, spec guest.Spec) string {
	n.t.Helper()
	firmware := filepath.Join(n.RootDir, "firmware", "CLOUDHV.fd")
	if err := os.MkdirAll(filepath.Dir(firmware), 0o755); err != nil {
		n.t.Fatal(err)
	}
	if err := os.WriteFile(firmware, []byte("firmware"), 0o644); err != nil {
		n.t.Fatal(err)
	}
	var buf bytes.Buffer
	if err := testimage.WriteQCOW2WithGuest(&buf, 1<<30, spec); err != nil {
		n.t.Fatal(err)
	}
	return n.WriteFile(name+".qcow2", buf.Bytes())
}

// Images most tests use.
const (
	snapRef  = "e2e/snapshot:v1"
	cloudRef = "e2e/cloud:v1"
)

// withSnapshot imports a default snapshot image (OCI guest, 1 vCPU, 512 MiB) under snapRef.
func (n *node) withSnapshot() string {
	return n.ImportImage(snapRef, n.SnapshotImage("snap", testimage.SnapshotOptions{}))
}

// stubbornSnapshot is a UEFI guest that ignores the ACPI power button.
func stubbornSnapshot() testimage.SnapshotOptions {
	return testimage.SnapshotOptions{ImageType: cocoon.ImageTypeCloudImg, Guest: guest.Spec{IgnorePowerButton: true}}
}

// runningPod runs a pod named name with one container of image, started, and returns the IDs and
// the pod config file (for more containers).
func (n *node) runningPod(name, image string) (podID, ctrID, podFile string) {
	n.t.Helper()
	return n.runningPodWith(name, image, func(*runtimeapi.ContainerConfig) {})
}

// runningPodWith is runningPod with the container's config changed first.
func (n *node) runningPodWith(name, image string, change func(*runtimeapi.ContainerConfig)) (podID, ctrID, podFile string) {
	n.t.Helper()
	return n.runningPodAnnotated(name, image, nil, change)
}

// runningPodAnnotated is runningPodWith for a pod with more annotations.
func (n *node) runningPodAnnotated(name, image string, annotations map[string]string, change func(*runtimeapi.ContainerConfig)) (podID, ctrID, podFile string) {
	n.t.Helper()
	pod := n.podConfig(name, "uid-"+name)
	maps.Copy(pod.Annotations, annotations)
	podFile = n.configFile(name+"-pod.json", pod)
	podID = n.mustCrictl("runp", "--runtime", "cocoon", podFile)
	cfg := containerConfig("app", image)
	change(cfg)
	ctrID = n.mustCrictl("create", "--no-pull", podID, n.configFile(name+"-ctr.json", cfg), podFile)
	n.mustCrictl("start", ctrID)
	return podID, ctrID, podFile
}

// vmPID is the hypervisor PID cocoon-cri records for a container.
func (n *node) vmPID(ctrID string) int {
	n.t.Helper()
	pid, ok := field(n.inspect("inspect", ctrID), "info", "vm", "pid").(float64)
	if !ok {
		n.t.Fatalf("container %s has no VM PID", ctrID)
	}
	return int(pid)
}

// oldCocoonNode is a node on cocoon v0.3.8, which has no vm exec and no vm disk attach, with no
// guest login configured and snapRef imported.
func oldCocoonNode(t *testing.T) *node {
	t.Helper()
	n := newNodeWithEnv(t, []string{cocoonsim.VersionEnv + "=0.3.8"})
	n.withSnapshot()
	return n
}

// createRefused creates cfg in a new pod named name and returns the InvalidArgument the create
// must fail with.
func (n *node) createRefused(name string, cfg *runtimeapi.ContainerConfig) string {
	n.t.Helper()
	podFile := n.configFile(name+"-pod.json", n.podConfig(name, "uid-"+name))
	podID := n.mustCrictl("runp", "--runtime", "cocoon", podFile)
	return n.crictlFails("InvalidArgument", "create", "--no-pull", podID, n.configFile(name+"-ctr.json", cfg), podFile)
}
