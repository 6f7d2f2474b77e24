package main

import (
	"fmt"
	"log/slog"
	"net"
	"os"
	"runtime"
	"time"

	"github.com/spf13/cobra"
	"github.com/spf13/pflag"
	"k8s.io/apimachinery/pkg/api/resource"

	"github.com/cocoonstack/cocoon-cri/cri/passthrough"
	"github.com/cocoonstack/cocoon-cri/cri/vmruntime"
	"github.com/cocoonstack/cocoon-cri/pkg/cgroups"
	"github.com/cocoonstack/cocoon-cri/pkg/config"
)

// cocoon's own defaults for its directories (docs/cocoon-contract.md section 1.2): used when
// cocoon-cri is not told otherwise, to measure image and container disk usage.
const (
	cocoonDefaultRootDir = "/var/lib/cocoon"
	cocoonDefaultRunDir  = "/var/lib/cocoon/run"
)

type options struct {
	configFile          string
	socket              string
	stateDir            string
	cocoonBinary        string
	cocoonRootDir       string
	cocoonRunDir        string
	cocoonLogDir        string
	cocoonTimeout       time.Duration
	maxCocoonCalls      int
	netnsDir            string
	sysfsDir            string
	virtiofsd           string
	cniConfDir          string
	cniBinDirs          []string
	serveDefaultHandler bool
	streamAddress       string
	guestSSHUser        string
	guestSSHKeyFile     string
	guestSSHPassword    string
	guestSSHPort        int
	guestReadyTimeout   time.Duration
	orphanPolicy        string
	logLevel            string
	logFormat           string
	shutdownTimeout     time.Duration
	registryInsecure    []string
	registryCAFile      string
	pullProgressTimeout time.Duration
	metricsAddr         string
	profiling           bool
	passthroughEndpoint string
	cgroupDriver        string
	maxStorage          string
	volumeMaxBytes      string
	allowedNetworks     []string
	hibernateAfter      time.Duration
	warmPools           map[string]int
}

func defaultOptions() *options {
	return &options{
		socket:            "/run/cocoon-cri/cocoon-cri.sock",
		stateDir:          "/var/lib/cocoon-cri",
		cocoonBinary:      "cocoon",
		maxStorage:        "200Gi",
		volumeMaxBytes:    "64Mi",
		cocoonTimeout:     2 * time.Minute,
		maxCocoonCalls:    defaultMaxCocoonCalls(),
		netnsDir:          "/var/run/netns",
		sysfsDir:          "/sys",
		virtiofsd:         "/usr/lib/qemu/virtiofsd",
		cniConfDir:        "/etc/cni/net.d",
		cniBinDirs:        []string{"/opt/cni/bin"},
		logLevel:          "info",
		logFormat:         "text",
		shutdownTimeout:   10 * time.Second,
		streamAddress:     "127.0.0.1:0",
		guestSSHUser:      "root",
		guestSSHPort:      22,
		guestReadyTimeout: 2 * time.Minute,
		orphanPolicy:      string(vmruntime.OrphanAlert),
		// containerd's default: long enough for a slow registry, short enough to free a stuck pull.
		pullProgressTimeout: 5 * time.Minute,
		cgroupDriver:        cgroups.Cgroupfs,
	}
}

func (o *options) addFlags(cmd *cobra.Command) {
	f := cmd.PersistentFlags()
	f.StringVar(&o.configFile, "config", o.configFile, "YAML file with settings (keys are flag names)")
	f.StringVar(&o.socket, "socket", o.socket, "unix socket the CRI is served on")
	f.StringVar(&o.logLevel, "log-level", o.logLevel, "log level: debug, info, warn or error")
	f.StringVar(&o.logFormat, "log-format", o.logFormat, "log format: text or json")

	d := cmd.Flags()
	d.StringVar(&o.stateDir, "state-dir", o.stateDir, "directory of cocoon-cri's state database")
	d.StringVar(&o.cocoonBinary, "cocoon-binary", o.cocoonBinary, "cocoon executable")
	d.StringVar(&o.cocoonRootDir, "cocoon-root-dir", o.cocoonRootDir, "cocoon --root-dir (empty: cocoon's default, "+cocoonDefaultRootDir+")")
	d.StringVar(&o.cocoonRunDir, "cocoon-run-dir", o.cocoonRunDir, "cocoon --run-dir (empty: cocoon's default, "+cocoonDefaultRunDir+")")
	d.StringVar(&o.cocoonLogDir, "cocoon-log-dir", o.cocoonLogDir, "cocoon --log-dir (empty: cocoon's default)")
	d.DurationVar(&o.cocoonTimeout, "cocoon-timeout", o.cocoonTimeout, "longest a cocoon command may run (imports have none: they end with the request)")
	d.IntVar(&o.maxCocoonCalls, "max-cocoon-calls", o.maxCocoonCalls,
		"most cocoon commands run at once, besides transfers and stops (0: no bound); the default is twice the CPUs, at least 4")
	d.StringVar(&o.netnsDir, "netns-dir", o.netnsDir, "directory of the pod network namespaces")
	d.StringVar(&o.sysfsDir, "sysfs-dir", o.sysfsDir, "the node's sysfs, where the PCI devices of a container's VFIO groups are found")
	d.StringVar(&o.virtiofsd, "virtiofsd", o.virtiofsd,
		"virtiofsd executable that shares a container's directory volumes with its guest where the VM can take virtio-fs (empty, or not installed: volumes are copied in)")
	d.StringVar(&o.cniConfDir, "cni-conf-dir", o.cniConfDir, "the cluster's CNI configuration; pods join the first network by file name")
	d.StringSliceVar(&o.cniBinDirs, "cni-bin-dir", o.cniBinDirs, "directories of the cluster's CNI plugins (repeat or separate with commas)")
	d.BoolVar(&o.serveDefaultHandler, "serve-default-handler", o.serveDefaultHandler,
		"run pods of the default runtime handler (no runtimeClassName) as cocoon VMs too; needed for static pods")
	d.DurationVar(&o.shutdownTimeout, "shutdown-timeout", o.shutdownTimeout, "how long SIGTERM waits for RPCs in flight")
	d.StringVar(&o.streamAddress, "stream-address", o.streamAddress,
		"host:port of the exec/attach/port-forward server the kubelet proxies to (port 0: a free port)")
	d.StringVar(&o.guestSSHUser, "guest-ssh-user", o.guestSSHUser, "user to log in to guests as, when cocoon has no vm exec")
	d.StringVar(&o.guestSSHKeyFile, "guest-ssh-key-file", o.guestSSHKeyFile, "private key to log in to guests with, when cocoon has no vm exec")
	// Removed, and refused by name so that a configuration still giving it learns why.
	d.StringVar(&o.guestSSHPassword, "guest-ssh-password", "", "")
	_ = d.MarkHidden("guest-ssh-password")
	d.IntVar(&o.guestSSHPort, "guest-ssh-port", o.guestSSHPort, "port of the guests' sshd")
	d.StringVar(&o.orphanPolicy, "orphan-policy", o.orphanPolicy,
		"what to do at start with VMs named like cocoon-cri's that no record claims: alert (log and count), destroy (vm rm --force) or keep")
	d.DurationVar(&o.guestReadyTimeout, "guest-ready-timeout", o.guestReadyTimeout,
		"how long a started guest may take before it runs commands (its agent or sshd up)")
	o.addRegistryFlags(d)
	d.DurationVar(&o.pullProgressTimeout, "image-pull-progress-timeout", o.pullProgressTimeout,
		"fail an image pull that receives nothing from its registry for this long (0: never)")
	d.StringVar(&o.metricsAddr, "metrics-addr", o.metricsAddr,
		"host:port to serve Prometheus metrics on at /metrics, e.g. 127.0.0.1:9809 (empty: not served; port 0: a free port)")
	d.BoolVar(&o.profiling, "profiling", o.profiling,
		"also serve the Go runtime's profiles (net/http/pprof) at /debug/pprof/ on --metrics-addr")
	d.StringVar(&o.passthroughEndpoint, "passthrough-endpoint", o.passthroughEndpoint,
		"CRI socket of the node's container runtime (unix:///run/containerd/containerd.sock): pods of every other runtime handler run there unchanged (empty: refused)")
	d.StringVar(&o.cgroupDriver, "cgroup-driver", o.cgroupDriver,
		"how VMs join pod cgroups: cgroupfs or systemd; the kubelet's cgroupDriver, and the passthrough runtime's")
	d.StringVar(&o.volumeMaxBytes, "volume-max-bytes", o.volumeMaxBytes,
		"the most a container's volumes may hold together, copied into its guest (a quantity, such as 64Mi); a container past it is refused")
	d.StringVar(&o.maxStorage, "max-storage", o.maxStorage,
		"largest VM disk a pod may ask for with the cocoonset.cocoonstack.io/storage annotation (a quantity)")
	d.DurationVar(&o.hibernateAfter, "hibernate-after", o.hibernateAfter,
		"hibernate a VM pod idle this long (no exec, attach or port-forward, no traffic, under 5% of a vCPU) until its next use, unless its vm.cocoonstack.io/hibernate-after annotation says otherwise (0: never; at least 1s)")
	d.StringToIntVar(&o.warmPools, "warm-pool", o.warmPools,
		"keep this many VMs of a snapshot image cloned and ready for its pods, as REF=N (repeat, or separate with commas; docs/warm-pool.md)")
	d.StringSliceVar(&o.allowedNetworks, "allowed-networks", o.allowedNetworks,
		"CNI networks of --cni-conf-dir that pods may pick by name with the cocoonset.cocoonstack.io/network annotation, besides the default one (repeat or separate with commas)")
	cmd.PersistentPreRunE = func(cmd *cobra.Command, _ []string) error {
		if err := config.Apply(cmd.Flags(), envPrefix, "config"); err != nil {
			return err
		}
		return o.validate()
	}
}

// addRegistryFlags defines how registries are reached: the daemon's flags for pulls, which
// `image push` takes too.
func (o *options) addRegistryFlags(f *pflag.FlagSet) {
	f.StringSliceVar(&o.registryInsecure, "registry-insecure", o.registryInsecure,
		"registries (host or host:port) that may be reached over plain HTTP; loopback ones always may (repeat or separate with commas)")
	f.StringVar(&o.registryCAFile, "registry-ca-file", o.registryCAFile, "PEM file of CA certificates trusted for registries, besides the system's")
}

// maxWarmPool bounds one pool: each VM holds its memory while it waits.
const maxWarmPool = 1000

// defaultMaxCocoonCalls lets cocoon commands use every CPU while others wait on I/O, without the
// lock polling of many more (docs/profiles.md, "Pods started at once").
func defaultMaxCocoonCalls() int {
	return max(4, 2*runtime.NumCPU())
}

func (o *options) validate() error {
	if _, err := parseLevel(o.logLevel); err != nil {
		return err
	}
	if o.logFormat != "text" && o.logFormat != "json" {
		return fmt.Errorf("--log-format %q: want text or json", o.logFormat)
	}
	if o.socket == "" || o.stateDir == "" {
		return fmt.Errorf("--socket and --state-dir must not be empty")
	}
	if o.cniConfDir == "" || len(o.cniBinDirs) == 0 {
		return fmt.Errorf("--cni-conf-dir and --cni-bin-dir must not be empty")
	}
	if _, err := vmruntime.ParseOrphanPolicy(o.orphanPolicy); err != nil {
		return fmt.Errorf("--orphan-policy: %w", err)
	}
	if o.guestSSHPassword != "" {
		return fmt.Errorf("--guest-ssh-password was removed: one password for every guest is handed to each guest's sshd, " +
			"and a hostile guest could log in to every other VM with it; use --guest-ssh-key-file")
	}
	if o.guestReadyTimeout <= 0 || o.guestSSHPort <= 0 || o.guestSSHPort > 65535 {
		return fmt.Errorf("--guest-ready-timeout must be positive and --guest-ssh-port a port")
	}
	if o.cocoonTimeout <= 0 {
		return fmt.Errorf("--cocoon-timeout must be positive")
	}
	if o.maxCocoonCalls < 0 {
		return fmt.Errorf("--max-cocoon-calls %d: want 0 (no bound) or more", o.maxCocoonCalls)
	}
	if o.pullProgressTimeout < 0 {
		return fmt.Errorf("--image-pull-progress-timeout must not be negative")
	}
	if o.cgroupDriver != cgroups.Cgroupfs && o.cgroupDriver != cgroups.Systemd {
		return fmt.Errorf("--cgroup-driver %q: want cgroupfs or systemd, the kubelet's cgroupDriver", o.cgroupDriver)
	}
	if o.passthroughEndpoint != "" {
		if err := passthrough.CheckEndpoint(o.passthroughEndpoint); err != nil {
			return fmt.Errorf("--passthrough-endpoint: %w", err)
		}
	}
	if q, err := resource.ParseQuantity(o.volumeMaxBytes); err != nil || q.Value() <= 0 {
		return fmt.Errorf("--volume-max-bytes %q: want a positive quantity, such as 64Mi", o.volumeMaxBytes)
	}
	if q, err := resource.ParseQuantity(o.maxStorage); err != nil || q.Value() < vmruntime.MinStorage {
		return fmt.Errorf("--max-storage %q: want a quantity of at least 10G, such as 200Gi", o.maxStorage)
	}
	if o.hibernateAfter < 0 || o.hibernateAfter > 0 && o.hibernateAfter < vmruntime.MinHibernateAfter {
		return fmt.Errorf("--hibernate-after %s: want 0 (never) or at least %s", o.hibernateAfter, vmruntime.MinHibernateAfter)
	}
	for ref, n := range o.warmPools {
		if ref == "" || n < 0 || n > maxWarmPool {
			return fmt.Errorf("--warm-pool %s=%d: want an image reference and a count from 0 to %d", ref, n, maxWarmPool)
		}
	}
	if o.profiling && o.metricsAddr == "" {
		return fmt.Errorf("--profiling serves the profiles on --metrics-addr: give one too")
	}
	if o.metricsAddr != "" {
		if _, _, err := net.SplitHostPort(o.metricsAddr); err != nil {
			return fmt.Errorf("--metrics-addr %q: want host:port: %w", o.metricsAddr, err)
		}
	}
	return nil
}

func (o *options) logger() *slog.Logger {
	level, _ := parseLevel(o.logLevel)
	handlerOpts := &slog.HandlerOptions{Level: level}
	if o.logFormat == "json" {
		return slog.New(slog.NewJSONHandler(os.Stderr, handlerOpts))
	}
	return slog.New(slog.NewTextHandler(os.Stderr, handlerOpts))
}

func parseLevel(s string) (slog.Level, error) {
	var l slog.Level
	if err := l.UnmarshalText([]byte(s)); err != nil {
		return l, fmt.Errorf("--log-level %q: want debug, info, warn or error", s)
	}
	return l, nil
}

func orDefault(v, def string) string {
	if v == "" {
		return def
	}
	return v
}
