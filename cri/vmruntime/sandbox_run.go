package vmruntime

import (
	"context"
	"errors"
	"fmt"
	"path/filepath"
	"regexp"
	"strings"

	"github.com/containernetworking/cni/libcni"
	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"

	"github.com/cocoonstack/cocoon-cri/pkg/faultpoint"
	"github.com/cocoonstack/cocoon-cri/pkg/store"
)

// RunPodSandbox records the sandbox and creates its network namespace. No VM starts yet: the VM is
// the container, started by StartContainer.
func (s *Runtime) RunPodSandbox(ctx context.Context, req *runtimeapi.RunPodSandboxRequest) (*runtimeapi.RunPodSandboxResponse, error) {
	cfg := req.GetConfig()
	if err := s.validateSandboxConfig(cfg, req.GetRuntimeHandler()); err != nil {
		return nil, err
	}
	vmOpts, err := parseVMOptions(cfg.GetAnnotations())
	if err != nil {
		return nil, invalid("%v", err)
	}
	if namespace, _, _ := strings.Cut(vmOpts.ForkFrom, "/"); vmOpts.ForkFrom != "" && namespace != cfg.GetMetadata().GetNamespace() {
		return nil, permissionDenied("annotation %s=%q: a fork copies its source's memory, secrets included, so it may only name a pod of its own namespace %q",
			AnnotationForkFrom, vmOpts.ForkFrom, cfg.GetMetadata().GetNamespace())
	}
	if _, ok := cfg.GetAnnotations()[AnnotationHibernateAfter]; !ok {
		vmOpts.HibernateAfter = s.cfg.HibernateAfter
	}
	if s.cfg.MaxStorage > 0 && vmOpts.Storage > s.cfg.MaxStorage {
		return nil, invalid("annotation %s=%s is above the %s this node allows a VM disk (--max-storage)",
			AnnotationStorage, cfg.GetAnnotations()[AnnotationStorage], quantity(s.cfg.MaxStorage))
	}
	name := sandboxName(cfg.GetMetadata())
	if holder, ok := s.store.Sandboxes.Lookup(store.SandboxNameKey(name)); ok {
		return nil, alreadyExists("sandbox name %q is already reserved for sandbox %s", name, holder.ID)
	}
	network, err := s.loadNetwork(vmOpts.Network)
	if err != nil {
		return nil, err
	}

	id := newID()
	sb := &store.Sandbox{
		ID:             id,
		Name:           name,
		State:          store.SandboxCreating,
		Config:         store.Proto[*runtimeapi.PodSandboxConfig]{Msg: cfg},
		RuntimeHandler: req.GetRuntimeHandler(),
		NetNS:          s.net.NetNSPath(id),
		CreatedAt:      s.now(),
		VM:             vmOpts,
		Network:        &store.PodNetwork{ConfList: network.Bytes},
	}
	// The namespace is made while the record is synced, each taking about a millisecond: a crash
	// between them leaves a pinned namespace without a record, which the next start removes with
	// the other network leftovers (RemoveLeftovers). The CNI, whose leases would leak, waits for
	// the record.
	netnsMade := make(chan error, 1)
	go func() { netnsMade <- s.net.CreateNetNS(sb.NetNS) }()
	err = s.store.Sandboxes.Create(sb)
	netnsErr := <-netnsMade
	if err != nil {
		if netnsErr == nil {
			if rmErr := s.net.RemoveNetNS(sb.NetNS); rmErr != nil {
				s.log.Warn("the network namespace of a sandbox that was not recorded is left; the next start removes it", "netns", sb.NetNS, "err", rmErr)
			}
		}
		if errors.Is(err, store.ErrExists) {
			return nil, alreadyExists("sandbox name %q is already reserved: %v", name, err)
		}
		return nil, fmt.Errorf("record sandbox: %w", err)
	}
	log := s.log.With("sandbox", id, "pod", cfg.GetMetadata().GetNamespace()+"/"+cfg.GetMetadata().GetName())
	faultpoint.Hit(faultpoint.SandboxRecorded)

	if err := s.setUpSandbox(ctx, sb, network, netnsErr); err != nil {
		log.Error("RunPodSandbox failed, rolling back", "err", err)
		if rbErr := s.rollbackSandbox(context.WithoutCancel(ctx), sb); rbErr != nil {
			log.Error("rollback failed; recovery will retry it at the next start", "err", rbErr)
		}
		return nil, err
	}
	log.Info("sandbox ready", "netns", sb.NetNS, "network", network.Name, "ips", sb.Network.IPs)
	return &runtimeapi.RunPodSandboxResponse{PodSandboxId: id}, nil
}

// setUpSandbox attaches a recorded sandbox to its network, in the namespace made beside the record
// (netnsErr says how that went), and records it ready.
func (s *Runtime) setUpSandbox(ctx context.Context, sb *store.Sandbox, network *libcni.NetworkConfigList, netnsErr error) error {
	if netnsErr != nil {
		return fmt.Errorf("create network namespace: %w", netnsErr)
	}
	faultpoint.Hit(faultpoint.SandboxNetNSCreated)
	if err := s.attachSandbox(ctx, sb, network); err != nil {
		return err
	}
	faultpoint.Hit(faultpoint.SandboxCocoonReady)
	if _, err := s.store.Sandboxes.Modify(sb.ID, func(r *store.Sandbox) error {
		r.State, r.Network = store.SandboxReady, sb.Network
		return nil
	}); err != nil {
		return fmt.Errorf("record sandbox ready: %w", err)
	}
	return nil
}

// rollbackSandbox undoes a RunPodSandbox that did not finish. CNI DEL runs whether or not ADD got
// through: a crash may have cut it short after the IP was leased.
func (s *Runtime) rollbackSandbox(ctx context.Context, sb *store.Sandbox) error {
	if err := s.detachSandbox(ctx, sb); err != nil {
		return err
	}
	if err := s.net.RemoveCocoon(sb.ID); err != nil {
		return err
	}
	if sb.NetNS != "" {
		if err := s.net.RemoveNetNS(sb.NetNS); err != nil {
			return fmt.Errorf("remove network namespace: %w", err)
		}
	}
	if err := s.store.Sandboxes.Delete(sb.ID); err != nil && !errors.Is(err, store.ErrNotFound) {
		return fmt.Errorf("delete record: %w", err)
	}
	return nil
}

func (s *Runtime) validateSandboxConfig(cfg *runtimeapi.PodSandboxConfig, handler string) error {
	if cfg == nil {
		return invalid("config is required")
	}
	md := cfg.GetMetadata()
	if md.GetName() == "" || md.GetNamespace() == "" || md.GetUid() == "" {
		return invalid("metadata needs name, namespace and uid, got %v", md)
	}
	if err := s.checkHandler(handler); err != nil {
		return err
	}
	// The console log is written there: a client must not point cocoon-cri's writes elsewhere.
	if dir := cfg.GetLogDirectory(); dir != "" && (!filepath.IsAbs(dir) || filepath.Clean(dir) != dir || strings.IndexByte(dir, 0) >= 0) {
		return invalid("log_directory %q must be an absolute, clean path on the node (the kubelet's is /var/log/pods/<namespace>_<name>_<uid>)", dir)
	}
	ns := cfg.GetLinux().GetSecurityContext().GetNamespaceOptions()
	for _, host := range []struct {
		mode  runtimeapi.NamespaceMode
		field string
	}{
		{ns.GetNetwork(), "hostNetwork"},
		{ns.GetPid(), "hostPID"},
		{ns.GetIpc(), "hostIPC"},
	} {
		if host.mode == runtimeapi.NamespaceMode_NODE {
			return invalid("%s is not supported by runtime handler %q: a cocoon VM has its own kernel, so it cannot share the node's namespaces; drop %s or run this pod with a container runtime class",
				host.field, handler, host.field)
		}
	}
	if err := s.cgroups.CheckParent(cfg.GetLinux().GetCgroupParent()); err != nil {
		return invalid("%v", err)
	}
	for name, value := range cfg.GetLinux().GetSysctls() {
		if _, ok := sysctlPath(name); !ok {
			return invalid("sysctl %q is not a kernel parameter name (segments of letters, digits, '_', '-', ':', separated by '.' or '/')", name)
		}
		if strings.ContainsAny(value, "\x00\n") {
			return invalid("sysctl %s: the value holds a NUL byte or a newline", name)
		}
	}
	return nil
}

// sysctlSegment is one element of a kernel parameter's path under /proc/sys. It cannot be "." or
// "..": the path stays under /proc/sys.
var sysctlSegment = regexp.MustCompile(`^[A-Za-z0-9_][A-Za-z0-9_.:-]*$`)

// sysctlPath is the path under /proc/sys of a kernel parameter named as Kubernetes allows:
// "net.ipv4.ip_forward", or with slashes where a segment holds a dot
// ("net/ipv4/conf/eth0.100/forwarding").
func sysctlPath(name string) (string, bool) {
	if !strings.Contains(name, "/") {
		name = strings.ReplaceAll(name, ".", "/")
	}
	for _, seg := range strings.Split(name, "/") {
		if !sysctlSegment.MatchString(seg) {
			return "", false
		}
	}
	return name, true
}

func (s *Runtime) checkHandler(handler string) error {
	if s.ServesHandler(handler) {
		return nil
	}
	if handler == "" {
		return invalid("the default runtime handler is not served: set runtimeClassName to a RuntimeClass with handler %q, "+
			"or start cocoon-cri with --passthrough-endpoint to run such pods on the node's container runtime, or with --serve-default-handler to run them as VMs", HandlerName)
	}
	return invalid("runtime handler %q is not served: cocoon-cri serves %q; start it with --passthrough-endpoint to run other handlers on the node's container runtime", handler, HandlerName)
}
