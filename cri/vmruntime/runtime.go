// Package vmruntime is cocoon-cri's own CRI runtime: pods as cocoon VMs. It serves the CRI v1
// RuntimeService and ImageService behind the edge (package cri), one file per RPC or family of
// RPCs, the way containerd's internal/cri/server is laid out. Records live in pkg/store, VMs in
// cocoon (through pkg/cocoon), network namespaces in tapmanager and images in imagestore. List and
// Status RPCs are answered from the store; only lifecycle RPCs call cocoon.
package vmruntime

import (
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"runtime"
	"sync"
	"time"

	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"

	"github.com/cocoonstack/cocoon-cri/imagestore"
	"github.com/cocoonstack/cocoon-cri/pkg/cgroups"
	"github.com/cocoonstack/cocoon-cri/pkg/cocoon"
	"github.com/cocoonstack/cocoon-cri/pkg/keylock"
	"github.com/cocoonstack/cocoon-cri/pkg/refresh"
	"github.com/cocoonstack/cocoon-cri/pkg/store"
	"github.com/cocoonstack/cocoon-cri/pkg/vfio"
	"github.com/cocoonstack/cocoon-cri/streaming"
)

// Names the runtime reports about itself.
const (
	// RuntimeName is reported by Version.
	RuntimeName = "cocoon-cri"
	// KubeletAPIVersion is the only Version.version the kubelet accepts.
	KubeletAPIVersion = "0.1.0"
	// RuntimeAPIVersion is the CRI version served.
	RuntimeAPIVersion = "v1"
	// HandlerName is the RuntimeClass handler cocoon-cri serves.
	HandlerName = "cocoon"
)

// Config is what the runtime needs from the daemon's configuration.
type Config struct {
	// Version is cocoon-cri's own version, reported as runtime_version.
	Version string
	// ServeDefaultHandler makes the default runtime handler ("") run cocoon VMs too. Needed for
	// static pods, which cannot resolve a RuntimeClass without an API server.
	ServeDefaultHandler bool
	// Defaults for VMs booted from an image when the container sets no limits; clones inherit the
	// snapshot's size instead.
	DefaultVCPUs   int
	DefaultMemory  int64
	DefaultStorage int64
	// HostCPUs caps vCPUs: cocoon refuses more vCPUs than the host has cores.
	HostCPUs int
	// StatusProbeInterval is how often Status re-checks that cocoon answers.
	StatusProbeInterval time.Duration
	// GuestSSH is the guest login used when cocoon has no vm exec.
	GuestSSH GuestSSH
	// GuestReadyTimeout bounds the wait for a started guest to take commands (its agent or sshd).
	GuestReadyTimeout time.Duration
	// Metrics, when set, is told what the VM watcher and the startup reconcile find.
	Metrics Observer
	// OrphanPolicy says what the startup reconcile does with VMs named like cocoon-cri's that no
	// record claims: OrphanAlert (the default), OrphanDestroy or OrphanKeep.
	OrphanPolicy OrphanPolicy
	// Cgroups places VMs into pod cgroups with the kubelet's cgroup driver; nil is cgroupfs.
	Cgroups cgroups.Driver
	// PullOnCreate: OCI images are pulled by another runtime (passthrough), so CreateContainer
	// brings an OCI VM image into cocoon when a VM pod needs it.
	PullOnCreate bool
	// VolumeMaxBytes bounds what a container's volumes hold together: they are copied into its
	// guest's memory. 0 is the default, 64 MiB.
	VolumeMaxBytes int64
	// VolumeSyncInterval is how often read-only volumes are compared with the host; 0 is 2 s.
	VolumeSyncInterval time.Duration
	// MaxStorage caps the disk a pod may ask for (the storage annotation); 0 is no cap.
	MaxStorage int64
	// AllowedNetworks are the CNI networks pods may pick by name besides the default one.
	AllowedNetworks []string
	// Sysfs is where the node's sysfs is read, to find the PCI devices of a VFIO group; empty is
	// /sys.
	Sysfs vfio.Sysfs
	// Virtiofsd is the virtiofsd executable that serves a container's directory volumes to its
	// guest over virtio-fs, where cocoon and the VM can take a share; empty: volumes are copied in.
	Virtiofsd string
	// ShareDir is where the shares' directories and sockets are made (under the state dir).
	ShareDir string
	// CheckpointJournal is where checkpoints in progress are noted (under the state dir), so that a
	// restart removes what one cut short. Empty: none is kept.
	CheckpointJournal string
	// HibernateAfter is the idle period after which a pod's VM hibernates, for pods without the
	// hibernate-after annotation; 0 is never.
	HibernateAfter time.Duration
	// WarmPools is how many VMs to keep cloned and ready, by snapshot image reference
	// (docs/warm-pool.md).
	WarmPools map[string]int `json:"warmPools,omitempty"`
}

// Observer is told what the runtime finds outside any RPC: VMs with cocoon-cri's names that no
// record claims, and restarts of the VM event stream. pkg/metrics implements it.
// Config.Metrics may be nil, so callers check. Implementations must be safe for concurrent use and
// must not block.
type Observer interface {
	// Orphans is called by each startup reconcile that could list cocoon's VMs, with the number of
	// orphan VMs it left on the node (after the orphan policy acted), 0 included.
	Orphans(n int)
	// WatcherRestarted is called each time the VM event stream ended and is started again.
	WatcherRestarted()
	// Hibernated is called after each hibernation, with how long it took, and Woke after each
	// wake; HibernationFailed after each hibernation cocoon refused or failed.
	Hibernated(took time.Duration)
	Woke(took time.Duration)
	HibernationFailed(took time.Duration)
	// PoolReady is called with how many VMs an image's warm pool has ready, after each fill;
	// PoolRefilled after each pool VM made, with how long it took; PoolHandedOver after each
	// hand-over, PoolMissed for each pod of a pooled image that found none ready or did not fit,
	// PoolFellBack for each failed hand-over.
	PoolReady(image string, n int)
	PoolRefilled(image string, took time.Duration)
	PoolHandedOver(image string, took time.Duration)
	PoolMissed(image string)
	PoolFellBack(image string)
}

// Cocoon's own limits (docs/cocoon-contract.md section 1.1).
const (
	MinMemory  int64 = 512 << 20
	MinStorage int64 = 10 << 30
)

// Runtime implements runtimeapi.RuntimeServiceServer and runtimeapi.ImageServiceServer.
type Runtime struct {
	runtimeapi.UnsafeRuntimeServiceServer
	runtimeapi.UnsafeImageServiceServer

	cfg      Config
	log      *slog.Logger
	store    *store.Store
	cocoon   Cocoon
	net      PodNetwork
	images   *imagestore.Service
	locks    keylock.Map
	health   *refresh.Value[*cocoon.VersionInfo]
	netReady *refresh.Value[struct{}]
	streams  *streaming.Server
	events   eventHub
	cgroups  cgroups.Driver
	stats    *statsCollector
	guest    *guestExecutor
	shares   *volumeShares
	watcher  *vmWatcher
	volumes  *volumeCopier

	pullAuths pullAuths
	// archives are the digests of checkpoint archives RestorePod has read.
	archives archiveDigests
	// idle follows the use of the VMs that may hibernate.
	idle idleTracker
	// forks are the saves of fork sources under way.
	forks forkSaves
	// pools are the warm pools.
	pools *warmPools

	iosMu   sync.Mutex
	ios     map[string]*containerIO // running containers' streams, by container ID
	nowFunc func() time.Time
}

// New returns a runtime over the given components: the daemon's are CocoonClient(a *cocoon.Client)
// and a *tapmanager.Manager (deps.go).
func New(cfg Config, log *slog.Logger, st *store.Store, cc Cocoon, nets PodNetwork, images *imagestore.Service) *Runtime {
	if cfg.HostCPUs <= 0 {
		cfg.HostCPUs = runtime.NumCPU()
	}
	if cfg.DefaultVCPUs <= 0 {
		cfg.DefaultVCPUs = 1
	}
	if cfg.DefaultMemory <= 0 {
		cfg.DefaultMemory = 1 << 30
	}
	if cfg.DefaultStorage <= 0 {
		cfg.DefaultStorage = MinStorage
	}
	if cfg.StatusProbeInterval <= 0 {
		cfg.StatusProbeInterval = 5 * time.Second
	}
	if cfg.GuestSSH.User == "" {
		cfg.GuestSSH.User = "root"
	}
	if cfg.GuestSSH.Port == 0 {
		cfg.GuestSSH.Port = 22
	}
	if cfg.Cgroups == nil {
		cfg.Cgroups, _ = cgroups.New(cgroups.Cgroupfs) // the cgroupfs driver cannot fail to make
	}
	if cfg.GuestReadyTimeout <= 0 {
		cfg.GuestReadyTimeout = 2 * time.Minute
	}
	if cfg.VolumeMaxBytes <= 0 {
		cfg.VolumeMaxBytes = 64 << 20
	}
	if cfg.Sysfs == "" {
		cfg.Sysfs = "/sys"
	}
	if cfg.VolumeSyncInterval <= 0 {
		cfg.VolumeSyncInterval = 2 * time.Second
	}
	s := &Runtime{
		cfg: cfg, log: log, store: st, cocoon: cc, net: nets, images: images,
		health:  newCocoonHealth(cc, cfg.StatusProbeInterval),
		ios:     map[string]*containerIO{},
		cgroups: cfg.Cgroups,
		netReady: refresh.New(networkProbeInterval, probeTimeout, func(ctx context.Context) (struct{}, error) {
			return struct{}{}, nets.Ready(ctx)
		}),
		nowFunc: time.Now,
		pools:   newWarmPools(cfg.WarmPools),
		stats:   &statsCollector{log: log, net: nets, containersDir: images.ContainersDir, exists: func(id string) bool { return st.Containers.Has(id) }},
	}
	// Through s: the tests set nowFunc after New.
	s.guest = &guestExecutor{ssh: cfg.GuestSSH, readyTimeout: cfg.GuestReadyTimeout, log: log, store: st, cocoon: cc,
		cocoonFor: s.cocoonFor, now: func() time.Time { return s.nowFunc() }}
	s.shares = &volumeShares{virtiofsd: cfg.Virtiofsd, dir: cfg.ShareDir, log: log, store: st, locks: &s.locks,
		cocoon: cc, cocoonFor: s.cocoonFor, guest: s.guest}
	s.watcher = &vmWatcher{log: log, store: st, locks: &s.locks, cocoon: cc, metrics: cfg.Metrics,
		recordExit: s.recordExit, reclaimLostVM: s.reclaimLostVM}
	s.volumes = &volumeCopier{maxBytes: cfg.VolumeMaxBytes, syncInterval: cfg.VolumeSyncInterval, log: log, store: st, guest: s.guest}
	return s
}

// Shutdown closes every running container's streams (their logs are flushed) and the watches of
// hibernated pods' traffic; the VMs go on.
func (s *Runtime) Shutdown() {
	s.idle.dropAll()
	s.iosMu.Lock()
	ids := make([]string, 0, len(s.ios))
	for id := range s.ios {
		ids = append(ids, id)
	}
	s.iosMu.Unlock()
	for _, id := range ids {
		s.stopIO(id)
	}
}

func (s *Runtime) now() int64 { return s.nowFunc().UnixNano() }

// verboseInfo is the "info" map verbose Status RPCs answer with: one JSON document, the convention
// crictl inspect and other runtimes follow.
func verboseInfo(v any) (map[string]string, error) {
	data, err := json.Marshal(v)
	if err != nil {
		return nil, fmt.Errorf("encode verbose info: %w", err)
	}
	return map[string]string{"info": string(data)}, nil
}
