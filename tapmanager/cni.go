package tapmanager

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"time"

	"github.com/containernetworking/cni/libcni"
	"github.com/containernetworking/cni/pkg/invoke"
	current "github.com/containernetworking/cni/pkg/types/100"
	"github.com/containernetworking/cni/pkg/version"
	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"

	"github.com/cocoonstack/cocoon-cri/pkg/faultpoint"
	"github.com/cocoonstack/cocoon-cri/pkg/waittime"
)

// PodIfName is the pod's interface in its namespace, as every Kubernetes runtime names it.
const PodIfName = "eth0"

// ErrNoNetwork means the node has no loadable CNI configuration.
var ErrNoNetwork = errors.New("no CNI network configured")

// UnknownNetworkError: the node has CNI networks, but none of that name.
type UnknownNetworkError struct {
	Name, Dir string
	Found     []string
}

func (e *UnknownNetworkError) Error() string {
	return fmt.Sprintf("no CNI network named %q in %s (found %v)", e.Name, e.Dir, e.Found)
}

// CNI runs the cluster's CNI plugins for pod sandboxes.
type CNI struct {
	confDir string
	binDirs []string
	cni     *libcni.CNIConfig
	observe func(op string, took time.Duration, err error)
}

// NewCNI returns a CNI runner over the configuration files in confDir and the plugins in binDirs.
// cacheDir holds libcni's record of each attachment, which DEL reads.
// observe, when set, is told how each ADD and DEL went.
func NewCNI(confDir string, binDirs []string, cacheDir string, observe func(op string, took time.Duration, err error)) *CNI {
	// An explicit exec: without one, libcni makes its default lazily on first use, and concurrent
	// first uses race (seen with 50 RunPodSandbox at once).
	pluginExec := &invoke.DefaultExec{RawExec: &invoke.RawExec{Stderr: os.Stderr}, PluginDecoder: version.PluginDecoder{}}
	return &CNI{confDir: confDir, binDirs: binDirs, cni: libcni.NewCNIConfigWithCacheDir(binDirs, cacheDir, pluginExec), observe: observe}
}

// ConfDir is where the configuration is read from.
func (c *CNI) ConfDir() string { return c.confDir }

// Load returns the network a pod is attached to: the one called name, or the first loadable
// configuration file in name order, the way the kubelet's runtimes choose. Files that do not
// parse are skipped, as they are there.
func (c *CNI) Load(name string) (*libcni.NetworkConfigList, error) {
	files, err := libcni.ConfFiles(c.confDir, []string{".conf", ".conflist", ".json"})
	if err != nil {
		return nil, fmt.Errorf("read %s: %w", c.confDir, err)
	}
	var seen []string
	for _, file := range files {
		list, err := loadConfFile(file)
		if err != nil {
			continue
		}
		if name == "" || list.Name == name {
			return list, nil
		}
		seen = append(seen, list.Name)
	}
	if name != "" && len(seen) > 0 {
		return nil, &UnknownNetworkError{Name: name, Dir: c.confDir, Found: seen}
	}
	return nil, fmt.Errorf("no loadable CNI configuration in %s: %w", c.confDir, ErrNoNetwork)
}

func loadConfFile(path string) (*libcni.NetworkConfigList, error) {
	if filepath.Ext(path) == ".conflist" {
		return libcni.ConfListFromFile(path)
	}
	conf, err := libcni.ConfFromFile(path)
	if err != nil {
		return nil, err
	}
	return libcni.ConfListFromConf(conf)
}

// Ready checks that the default network loads and that its plugins exist and speak its version.
func (c *CNI) Ready(ctx context.Context) error {
	list, err := c.Load("")
	if err != nil {
		return err
	}
	if _, err := c.cni.ValidateNetworkList(ctx, list); err != nil {
		return fmt.Errorf("CNI network %q is not usable with plugins from %v: %w", list.Name, c.binDirs, err)
	}
	return nil
}

// Pod is what CNI needs to know about a sandbox.
type Pod struct {
	SandboxID string
	NetNS     string
	Config    *runtimeapi.PodSandboxConfig
}

// runtimeConf carries the kubelet's standard CNI_ARGS and the capability arguments the cluster's
// plugins may act on (portmap's hostPorts, DNS). ADD and DEL must get the same.
func (p Pod) runtimeConf() *libcni.RuntimeConf {
	md := p.Config.GetMetadata()
	rc := &libcni.RuntimeConf{
		ContainerID: p.SandboxID,
		NetNS:       p.NetNS,
		IfName:      PodIfName,
		Args: [][2]string{
			{"IgnoreUnknown", "1"},
			{"K8S_POD_NAMESPACE", md.GetNamespace()},
			{"K8S_POD_NAME", md.GetName()},
			{"K8S_POD_INFRA_CONTAINER_ID", p.SandboxID},
			{"K8S_POD_UID", md.GetUid()},
		},
		CapabilityArgs: map[string]any{},
	}
	var mappings []portMapping
	for _, pm := range p.Config.GetPortMappings() {
		if pm.GetHostPort() <= 0 {
			continue
		}
		mappings = append(mappings, portMapping{
			HostPort: pm.GetHostPort(), ContainerPort: pm.GetContainerPort(),
			Protocol: protocolName(pm.GetProtocol()), HostIP: pm.GetHostIp(),
		})
	}
	if len(mappings) > 0 {
		rc.CapabilityArgs["portMappings"] = mappings
	}
	if dns := p.Config.GetDnsConfig(); dns != nil {
		rc.CapabilityArgs["dns"] = dnsConfig{Servers: dns.GetServers(), Searches: dns.GetSearches(), Options: dns.GetOptions()}
	}
	return rc
}

// portMapping and dnsConfig are the CNI conventions' capability argument shapes.
type portMapping struct {
	HostPort      int32  `json:"hostPort"`
	ContainerPort int32  `json:"containerPort"`
	Protocol      string `json:"protocol"`
	HostIP        string `json:"hostIP,omitempty"`
}

type dnsConfig struct {
	Servers  []string `json:"servers,omitempty"`
	Searches []string `json:"searches,omitempty"`
	Options  []string `json:"options,omitempty"`
}

func protocolName(p runtimeapi.Protocol) string {
	switch p {
	case runtimeapi.Protocol_UDP:
		return "udp"
	case runtimeapi.Protocol_SCTP:
		return "sctp"
	}
	return "tcp"
}

// Add attaches the pod to the network and returns the result in CNI's current version.
func (c *CNI) Add(ctx context.Context, list *libcni.NetworkConfigList, pod Pod) (*current.Result, error) {
	start := time.Now()
	waited := waittime.Begin(ctx)
	res, err := c.cni.AddNetworkList(ctx, list, pod.runtimeConf())
	waited()
	c.observed("ADD", start, err)
	if err != nil {
		return nil, fmt.Errorf("CNI ADD to network %q: %w", list.Name, err)
	}
	result, err := current.NewResultFromResult(res)
	if err != nil {
		return nil, fmt.Errorf("CNI ADD to network %q: read result: %w", list.Name, err)
	}
	return result, nil
}

// Del detaches the pod from the network described by confList (the configuration it was added
// with). It is safe to repeat and works when the namespace is already gone, or was never whole:
// the plugins then only release what they hold (IP leases, port mappings).
func (c *CNI) Del(ctx context.Context, confList []byte, pod Pod) error {
	list, err := libcni.ConfListFromBytes(confList)
	if err != nil {
		return fmt.Errorf("read the recorded CNI configuration: %w", err)
	}
	rc := pod.runtimeConf()
	if !IsNetNS(rc.NetNS) {
		rc.NetNS = ""
	}
	faultpoint.Hit("cni del/before")
	start := time.Now()
	waited := waittime.Begin(ctx)
	err = c.cni.DelNetworkList(ctx, list, rc)
	waited()
	c.observed("DEL", start, err)
	if err != nil {
		return fmt.Errorf("CNI DEL from network %q: %w", list.Name, err)
	}
	faultpoint.Hit("cni del/after")
	return nil
}

func (c *CNI) observed(op string, start time.Time, err error) {
	if c.observe != nil {
		c.observe(op, time.Since(start), err)
	}
}

// PodAddresses picks the pod's IPs out of a result, IPv4 first (the primary address the kubelet
// reports), and the MAC of the pod interface.
func PodAddresses(result *current.Result) (ips []string, mac string) {
	var v4, v6 []string
	for _, ip := range result.IPs {
		if ip.Address.IP.To4() != nil {
			v4 = append(v4, ip.Address.IP.String())
		} else {
			v6 = append(v6, ip.Address.IP.String())
		}
	}
	if iface := podInterface(result); iface != nil {
		mac = iface.Mac
	}
	return append(v4, v6...), mac
}

// podInterface is the result's interface inside the pod: the one with a sandbox (the others are the
// host ends and bridges plugins report).
func podInterface(result *current.Result) *current.Interface {
	for _, iface := range result.Interfaces {
		if iface.Name == PodIfName && iface.Sandbox != "" {
			return iface
		}
	}
	return nil
}

// DecodeResult reads a stored result.
func DecodeResult(data []byte) (*current.Result, error) {
	res, err := current.NewResult(data)
	if err != nil {
		return nil, err
	}
	return current.NewResultFromResult(res)
}

// ipNet parses one of the result's addresses for netlink.
func ipNet(ip current.IPConfig) *net.IPNet {
	return &net.IPNet{IP: ip.Address.IP, Mask: ip.Address.Mask}
}

// PodIPv4 is the pod's IPv4 address, prefix and gateway from a result: what a guest's NIC needs.
func PodIPv4(result *current.Result) (addr net.IPNet, gateway net.IP, ok bool) {
	for _, ip := range result.IPs {
		if ip.Address.IP.To4() != nil {
			return ip.Address, ip.Gateway, true
		}
	}
	return net.IPNet{}, nil, false
}
