package e2e

import (
	"context"
	"maps"
	"reflect"
	"strings"
	"testing"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"

	"github.com/cocoonstack/cocoon-cri/test/testproc"
)

// nodeState is everything a refused request must leave as it was.
type nodeState struct {
	Pods, Containers, Images string
	VMs                      int
	Netns                    []string
}

func (n *node) state() nodeState {
	return nodeState{
		Pods:       n.mustCrictl("pods", "-q"),
		Containers: n.mustCrictl("ps", "-a", "-q"),
		Images:     n.mustCrictl("images", "-q"),
		VMs:        len(n.vms()),
		Netns:      n.netns(),
	}
}

func TestBadInputsAreRefusedAndChangeNothing(t *testing.T) {
	t.Parallel()
	n := newNode(t)
	n.withSnapshot()
	podID, ctrID, podFile := n.runningPod("web", snapRef)
	ctrFile := n.Dir + "/web-ctr.json"
	before := n.state()

	variant := func(name string, change func(*runtimeapi.PodSandboxConfig)) string {
		p := n.podConfig("web-"+name, "uid-"+name)
		change(p)
		return n.configFile("pod-"+name+".json", p)
	}
	nodeNS := runtimeapi.NamespaceMode_NODE
	withNS := func(set func(*runtimeapi.NamespaceOption)) func(*runtimeapi.PodSandboxConfig) {
		return func(p *runtimeapi.PodSandboxConfig) {
			opts := &runtimeapi.NamespaceOption{}
			set(opts)
			p.Linux.SecurityContext = &runtimeapi.LinuxSandboxSecurityContext{NamespaceOptions: opts}
		}
	}
	withAnnotation := func(k, v string) func(*runtimeapi.PodSandboxConfig) {
		return func(p *runtimeapi.PodSandboxConfig) { p.Annotations = map[string]string{k: v} }
	}
	ctrVariant := func(name string, change func(*runtimeapi.ContainerConfig)) string {
		c := containerConfig(name, snapRef)
		change(c)
		return n.configFile("ctr-"+name+".json", c)
	}
	unknown := strings.Repeat("0", 64)

	cases := []struct {
		name string
		code string
		args []string
		says string
	}{
		{"inspect an unknown container", "NotFound", []string{"inspect", unknown}, "not found"},
		{"inspect an unknown sandbox", "NotFound", []string{"inspectp", unknown}, "not found"},
		{"start an unknown container", "NotFound", []string{"start", unknown}, "not found"},
		{"run the same pod twice", "AlreadyExists", []string{"runp", "--runtime", "cocoon", podFile}, podID},
		{"hostNetwork", "InvalidArgument", []string{"runp", "--runtime", "cocoon",
			variant("hostnet", withNS(func(o *runtimeapi.NamespaceOption) { o.Network = nodeNS }))}, "hostNetwork is not supported"},
		{"hostPID", "InvalidArgument", []string{"runp", "--runtime", "cocoon",
			variant("hostpid", withNS(func(o *runtimeapi.NamespaceOption) { o.Pid = nodeNS }))}, "hostPID"},
		{"hostIPC", "InvalidArgument", []string{"runp", "--runtime", "cocoon",
			variant("hostipc", withNS(func(o *runtimeapi.NamespaceOption) { o.Ipc = nodeNS }))}, "hostIPC"},
		{"another runtime handler", "InvalidArgument", []string{"runp", "--runtime", "runc", variant("runc", func(*runtimeapi.PodSandboxConfig) {})}, "is not served: cocoon-cri serves"},
		{"the default handler when not served", "InvalidArgument", []string{"runp", variant("default", func(*runtimeapi.PodSandboxConfig) {})}, "runtimeClassName"},
		{"a malformed backend annotation", "InvalidArgument", []string{"runp", "--runtime", "cocoon",
			variant("badbackend", withAnnotation("vm.cocoonstack.io/backend", "qemu"))}, "vm.cocoonstack.io/backend"},
		{"a sysctl whose name leaves /proc/sys", "InvalidArgument", []string{"runp", "--runtime", "cocoon",
			variant("badsysctl", func(p *runtimeapi.PodSandboxConfig) {
				p.Linux.Sysctls = map[string]string{"net/../../../etc/motd": "x"}
			})}, "is not a kernel parameter name"},
		{"a storage annotation above --max-storage", "InvalidArgument", []string{"runp", "--runtime", "cocoon",
			variant("hugestorage", withAnnotation("cocoonset.cocoonstack.io/storage", "1Pi"))}, "--max-storage"},
		{"a malformed storage annotation", "InvalidArgument", []string{"runp", "--runtime", "cocoon",
			variant("badstorage", withAnnotation("cocoonset.cocoonstack.io/storage", "huge"))}, "cocoonset.cocoonstack.io/storage"},
		{"a malformed no-direct-io annotation", "InvalidArgument", []string{"runp", "--runtime", "cocoon",
			variant("baddio", withAnnotation("vm.cocoonstack.io/no-direct-io", "yes"))}, "no-direct-io"},
		{"a missing image", "NotFound", []string{"create", "--no-pull", podID,
			ctrVariant("noimage", func(c *runtimeapi.ContainerConfig) { c.Image.Image = "e2e/missing:v9" }), podFile}, "cocoon-cri image import"},
		{"an environment variable named with '='", "InvalidArgument", []string{"create", "--no-pull", podID,
			ctrVariant("badenv", func(c *runtimeapi.ContainerConfig) {
				c.Envs = []*runtimeapi.KeyValue{{Key: "A=B", Value: []byte("c")}}
			}), podFile}, "is not an environment variable name"},
		{"a relative working directory", "InvalidArgument", []string{"create", "--no-pull", podID,
			ctrVariant("reldir", func(c *runtimeapi.ContainerConfig) { c.WorkingDir = "srv/app" }), podFile}, "must be an absolute path"},
		{"a memory limit below the snapshot's memory", "InvalidArgument", []string{"create", "--no-pull", podID,
			ctrVariant("smallmem", func(c *runtimeapi.ContainerConfig) { c.Linux.Resources.MemoryLimitInBytes = 256 << 20 }), podFile}, "a restored VM cannot shrink"},
		{"an OOM score out of range", "InvalidArgument", []string{"create", "--no-pull", podID,
			ctrVariant("oom", func(c *runtimeapi.ContainerConfig) { c.Linux.Resources.OomScoreAdj = 1001 }), podFile}, "oom_score_adj"},
		{"a character device", "InvalidArgument", []string{"create", "--no-pull", podID,
			ctrVariant("device", func(c *runtimeapi.ContainerConfig) {
				c.Devices = []*runtimeapi.Device{{ContainerPath: "/dev/fuse", HostPath: "/dev/null", Permissions: "rwm"}}
			}), podFile}, "is neither a block device, a disk file nor a VFIO group"},
		{"a CDI device", "InvalidArgument", []string{"create", "--no-pull", podID,
			ctrVariant("cdi", func(c *runtimeapi.ContainerConfig) {
				c.CDIDevices = []*runtimeapi.CDIDevice{{Name: "vendor.com/gpu=0"}}
			}), podFile}, "does not read CDI specs"},
		{"the same container twice", "AlreadyExists", []string{"create", "--no-pull", podID, ctrFile, podFile}, ctrID},
		{"a container in an unknown sandbox", "NotFound", []string{"create", "--no-pull", unknown, ctrFile, podFile}, "not found"},
		{"a second start", "FailedPrecondition", []string{"start", ctrID}, "only a created container"},
		{"an image pull from a registry that does not answer", "Unavailable", []string{"pull", "127.0.0.1:1/e2e/elsewhere:v1"}, "registry unreachable"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			msg := n.crictlFails(tc.code, tc.args...)
			if !strings.Contains(msg, tc.says) {
				t.Errorf("the message does not say %q: %s", tc.says, msg)
			}
			if after := n.state(); !reflect.DeepEqual(after, before) {
				t.Fatalf("state changed:\nbefore %+v\nafter  %+v", before, after)
			}
		})
	}
}

// TestStopAndRemoveAreIdempotent: stopping or removing what is missing or already done succeeds,
// as the CRI requires (critest's Idempotence group).
func TestStopAndRemoveAreIdempotent(t *testing.T) {
	t.Parallel()
	n := newNode(t)
	n.withSnapshot()
	// crictl looks a container or sandbox up before removing it, so the missing cases go to the API
	// directly, as critest's Idempotence group does.
	rt, img := n.clients()
	ctx := context.Background()
	unknown := strings.Repeat("f", 64)
	calls := map[string]func() error{
		"StopContainer": func() error {
			_, err := rt.StopContainer(ctx, &runtimeapi.StopContainerRequest{ContainerId: unknown})
			return err
		},
		"RemoveContainer": func() error {
			_, err := rt.RemoveContainer(ctx, &runtimeapi.RemoveContainerRequest{ContainerId: unknown})
			return err
		},
		"StopPodSandbox": func() error {
			_, err := rt.StopPodSandbox(ctx, &runtimeapi.StopPodSandboxRequest{PodSandboxId: unknown})
			return err
		},
		"RemovePodSandbox": func() error {
			_, err := rt.RemovePodSandbox(ctx, &runtimeapi.RemovePodSandboxRequest{PodSandboxId: unknown})
			return err
		},
		"RemoveImage": func() error {
			_, err := img.RemoveImage(ctx, &runtimeapi.RemoveImageRequest{Image: &runtimeapi.ImageSpec{Image: "e2e/never:v1"}})
			return err
		},
	}
	for name, call := range calls {
		if err := call(); err != nil {
			t.Errorf("%s of something missing: %v", name, err)
		}
	}
	podFile := n.configFile("pod.json", n.podConfig("idem", "uid-i"))
	podID := n.mustCrictl("runp", "--runtime", "cocoon", podFile)
	ctrID := n.mustCrictl("create", "--no-pull", podID, n.configFile("ctr.json", containerConfig("app", snapRef)), podFile)
	n.mustCrictl("stop", ctrID) // created, not running
	n.mustCrictl("start", ctrID)
	for range 2 {
		n.mustCrictl("stop", "--timeout", "5", ctrID)
	}
	n.mustCrictl("rm", ctrID)
	if _, err := rt.RemoveContainer(ctx, &runtimeapi.RemoveContainerRequest{ContainerId: ctrID}); err != nil {
		t.Errorf("second RemoveContainer: %v", err)
	}
	for range 2 {
		n.mustCrictl("stopp", podID)
	}
	n.mustCrictl("rmp", podID)
	if _, err := rt.RemovePodSandbox(ctx, &runtimeapi.RemovePodSandboxRequest{PodSandboxId: podID}); err != nil {
		t.Errorf("second RemovePodSandbox: %v", err)
	}
	if st := n.state(); st.Pods != "" || st.Containers != "" || st.VMs != 0 || len(st.Netns) != 0 {
		t.Fatalf("left behind: %+v", st)
	}
}

// TestRemoveRunningPodSandbox: removing a sandbox whose VM still runs stops and removes it, as the
// CRI asks.
func TestRemoveRunningPodSandbox(t *testing.T) {
	t.Parallel()
	n := newNode(t)
	n.withSnapshot()
	podID, ctrID, _ := n.runningPod("busy", snapRef)
	pid := n.vmPID(ctrID)
	n.mustCrictl("rmp", "--force", podID)
	if st := n.state(); st.Pods != "" || st.Containers != "" || st.VMs != 0 || len(st.Netns) != 0 || testproc.Running(pid) {
		t.Fatalf("left behind: %+v, hypervisor alive %v", st, testproc.Running(pid))
	}
}

// TestListFilters exercises the filters the kubelet and crictl use.
func TestListFilters(t *testing.T) {
	t.Parallel()
	n := newNode(t)
	n.withSnapshot()
	a := n.podConfig("alpha", "uid-a")
	b := n.podConfig("beta", "uid-b")
	aFile, bFile := n.configFile("a.json", a), n.configFile("b.json", b)
	podA := n.mustCrictl("runp", "--runtime", "cocoon", aFile)
	podB := n.mustCrictl("runp", "--runtime", "cocoon", bFile)
	ctrA := n.mustCrictl("create", "--no-pull", podA, n.configFile("ca.json", containerConfig("app", snapRef)), aFile)
	ctrB := n.mustCrictl("create", "--no-pull", podB, n.configFile("cb.json", containerConfig("app", snapRef)), bFile)
	n.mustCrictl("start", ctrB)
	n.mustCrictl("stopp", podA)

	checks := map[string][]string{
		"pods --label app=alpha":   {podA},
		"pods --state ready":       {podB},
		"pods --state notready":    {podA},
		"pods --id " + podB[:8]:    {podB},
		"ps -a --pod " + podA[:8]:  {ctrA},
		"ps --state running":       {ctrB},
		"ps -a --state created":    {ctrA},
		"ps -a --label tier=vm":    {ctrA, ctrB},
		"ps -a --label tier=other": {},
		"ps -a --id " + ctrB[:10]:  {ctrB},
		"pods --label app=gamma":   {},
	}
	for cmd, want := range checks {
		got := strings.Fields(n.mustCrictl(append(strings.Fields(cmd), "-q")...))
		wantSet := map[string]bool{}
		for _, w := range want {
			wantSet[w] = true
		}
		gotSet := map[string]bool{}
		for _, g := range got {
			gotSet[g] = true
		}
		if !maps.Equal(gotSet, wantSet) {
			t.Errorf("crictl %s = %v, want %v", cmd, got, want)
		}
	}
}

// TestRawRequestsAreValidated sends what crictl never would: missing configs, empty IDs, negative
// timeouts. Each gets InvalidArgument and changes nothing.
func TestRawRequestsAreValidated(t *testing.T) {
	t.Parallel()
	n := newNode(t)
	n.withSnapshot()
	rt, img := n.clients()
	ctx := context.Background()
	before := n.state()
	pod := n.podConfig("raw", "uid-raw")
	noUID := n.podConfig("raw", "")
	noNamespace := n.podConfig("raw", "uid")
	noNamespace.Metadata.Namespace = ""

	calls := map[string]func() error{
		"RunPodSandbox without config": func() error {
			_, err := rt.RunPodSandbox(ctx, &runtimeapi.RunPodSandboxRequest{RuntimeHandler: "cocoon"})
			return err
		},
		"RunPodSandbox without uid": func() error {
			_, err := rt.RunPodSandbox(ctx, &runtimeapi.RunPodSandboxRequest{Config: noUID, RuntimeHandler: "cocoon"})
			return err
		},
		"RunPodSandbox without namespace": func() error {
			_, err := rt.RunPodSandbox(ctx, &runtimeapi.RunPodSandboxRequest{Config: noNamespace, RuntimeHandler: "cocoon"})
			return err
		},
		"PodSandboxStatus without ID": func() error {
			_, err := rt.PodSandboxStatus(ctx, &runtimeapi.PodSandboxStatusRequest{})
			return err
		},
		"CreateContainer without config": func() error {
			_, err := rt.CreateContainer(ctx, &runtimeapi.CreateContainerRequest{PodSandboxId: "x", SandboxConfig: pod})
			return err
		},
		"CreateContainer without image": func() error {
			cfg := containerConfig("app", "")
			_, err := rt.CreateContainer(ctx, &runtimeapi.CreateContainerRequest{PodSandboxId: "x", Config: cfg, SandboxConfig: pod})
			return err
		},
		"CreateContainer without sandbox ID": func() error {
			_, err := rt.CreateContainer(ctx, &runtimeapi.CreateContainerRequest{Config: containerConfig("app", snapRef), SandboxConfig: pod})
			return err
		},
		"StartContainer without ID": func() error {
			_, err := rt.StartContainer(ctx, &runtimeapi.StartContainerRequest{})
			return err
		},
		"StopContainer with a negative timeout": func() error {
			_, err := rt.StopContainer(ctx, &runtimeapi.StopContainerRequest{ContainerId: "x", Timeout: -1})
			return err
		},
		"ContainerStatus without ID": func() error {
			_, err := rt.ContainerStatus(ctx, &runtimeapi.ContainerStatusRequest{})
			return err
		},
		"ImageStatus without image": func() error {
			_, err := img.ImageStatus(ctx, &runtimeapi.ImageStatusRequest{})
			return err
		},
		"PullImage of a malformed reference": func() error {
			_, err := img.PullImage(ctx, &runtimeapi.PullImageRequest{Image: &runtimeapi.ImageSpec{Image: "Bad Ref"}})
			return err
		},
		"RemoveImage without image": func() error {
			_, err := img.RemoveImage(ctx, &runtimeapi.RemoveImageRequest{})
			return err
		},
	}
	for name, call := range calls {
		err := call()
		if status.Code(err) != codes.InvalidArgument {
			t.Errorf("%s: got %v, want InvalidArgument", name, err)
		}
	}
	if after := n.state(); !reflect.DeepEqual(after, before) {
		t.Fatalf("state changed:\nbefore %+v\nafter  %+v", before, after)
	}
}
