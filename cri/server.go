// Package cri serves the CRI v1 RuntimeService and ImageService over cocoon: one file per RPC or
// family of RPCs, the way containerd's internal/cri/server is laid out. Records live in pkg/store,
// VMs in cocoon (through pkg/cocoon), network namespaces in tapmanager and images in imagestore.
// List and Status RPCs are answered from the store; only lifecycle RPCs call cocoon.
package cri

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"runtime"
	"sync"
	"time"

	"google.golang.org/grpc"
	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"

	"github.com/cocoonstack/cocoon-cri/imagestore"
	"github.com/cocoonstack/cocoon-cri/pkg/cocoon"
	"github.com/cocoonstack/cocoon-cri/pkg/keylock"
	"github.com/cocoonstack/cocoon-cri/pkg/refresh"
	"github.com/cocoonstack/cocoon-cri/pkg/store"
	"github.com/cocoonstack/cocoon-cri/streaming"
	"github.com/cocoonstack/cocoon-cri/tapmanager"
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

// Config is what the server needs from the daemon's configuration.
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
}

// Cocoon's own limits (reference/cocoon-contract.md section 1.1).
const (
	MinMemory  int64 = 512 << 20
	MinStorage int64 = 10 << 30
)

// Server implements runtimeapi.RuntimeServiceServer and runtimeapi.ImageServiceServer.
type Server struct {
	runtimeapi.UnsafeRuntimeServiceServer
	runtimeapi.UnsafeImageServiceServer

	cfg      Config
	log      *slog.Logger
	store    *store.Store
	cocoon   *cocoon.Client
	net      *tapmanager.Manager
	images   *imagestore.Service
	locks    keylock.Map
	health   *refresh.Value[*cocoon.VersionInfo]
	netReady *refresh.Value[struct{}]
	streams  *streaming.Server

	iosMu   sync.Mutex
	ios     map[string]*containerIO // running containers' streams, by container ID
	nowFunc func() time.Time
}

// New returns a server over the given components.
func New(cfg Config, log *slog.Logger, st *store.Store, cc *cocoon.Client, nets *tapmanager.Manager, images *imagestore.Service) *Server {
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
	if cfg.GuestReadyTimeout <= 0 {
		cfg.GuestReadyTimeout = 2 * time.Minute
	}
	return &Server{
		cfg: cfg, log: log, store: st, cocoon: cc, net: nets, images: images,
		health: newCocoonHealth(cc, cfg.StatusProbeInterval),
		ios:    map[string]*containerIO{},
		netReady: refresh.New(networkProbeInterval, probeTimeout, func(ctx context.Context) (struct{}, error) {
			return struct{}{}, nets.Ready(ctx)
		}),
		nowFunc: time.Now,
	}
}

// Register adds both CRI services to a gRPC server.
func (s *Server) Register(g *grpc.Server) {
	runtimeapi.RegisterRuntimeServiceServer(g, s)
	runtimeapi.RegisterImageServiceServer(g, s)
}

// Recover brings the records to a consistent state after a restart: a RunPodSandbox that a crash
// interrupted is rolled back, so the kubelet's retry of it starts clean.
func (s *Server) Recover(ctx context.Context) error {
	for _, sb := range s.store.Sandboxes.List(func(sb *store.Sandbox) bool { return sb.State == store.SandboxCreating }) {
		s.log.Info("rolling back an interrupted RunPodSandbox", "sandbox", sb.ID, "name", sb.Name)
		if err := s.rollbackSandbox(ctx, sb); err != nil {
			return fmt.Errorf("roll back sandbox %s: %w", sb.ID, err)
		}
	}
	for _, c := range s.store.Containers.List(func(c *store.Container) bool { return c.State == store.ContainerRunning }) {
		s.resumeIO(ctx, c)
	}
	return ctx.Err()
}

// Shutdown closes every running container's streams (their logs are flushed); the VMs go on.
func (s *Server) Shutdown() {
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

// resumeIO picks up a running container's streams after a restart: the console (and with it the
// log) is the VM's and goes on. A main process ran through a cocoon vm exec that ended with the
// old cocoon-cri, so its exit status is lost: the container exits, and its VM stops, so the
// kubelet restarts it the usual way.
func (s *Server) resumeIO(ctx context.Context, c *store.Container) {
	sb, err := s.store.Sandboxes.Get(c.SandboxID)
	if err != nil {
		return
	}
	if len(mainCommand(c.Config.Msg)) == 0 {
		s.startIO(sb, c)
		return
	}
	unlock := s.locks.Lock(sb.ID)
	defer unlock()
	if err := s.powerOff(ctx, sb, c, mainExitStopTimeout); err != nil && !errors.Is(err, cocoon.ErrNotFound) {
		s.log.Error("stopping the VM of a command lost in a restart failed", "container", c.ID, "err", err)
	}
	if err := s.recordExit(c, exitStatus{code: killedExitCode, reason: reasonMainProcessLost,
		message: "cocoon-cri restarted while the command ran; its exit status is unknown"}); err != nil {
		s.log.Error("recording a lost command failed", "container", c.ID, "err", err)
	}
}

// reasonMainProcessLost: the container's command was cut off by a restart of cocoon-cri.
const reasonMainProcessLost = "MainProcessLost"

func (s *Server) now() int64 { return s.nowFunc().UnixNano() }

// verboseInfo is the "info" map verbose Status RPCs answer with: one JSON document, the convention
// crictl inspect and other runtimes follow.
func verboseInfo(v any) (map[string]string, error) {
	data, err := json.Marshal(v)
	if err != nil {
		return nil, toStatus(fmt.Errorf("encode verbose info: %w", err))
	}
	return map[string]string{"info": string(data)}, nil
}
