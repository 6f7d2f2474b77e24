package main

import (
	"context"
	"fmt"
	"log/slog"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"syscall"
	"time"

	"google.golang.org/grpc"
	"k8s.io/apimachinery/pkg/api/resource"

	"github.com/cocoonstack/cocoon-cri/cri"
	"github.com/cocoonstack/cocoon-cri/cri/passthrough"
	"github.com/cocoonstack/cocoon-cri/cri/vmruntime"
	"github.com/cocoonstack/cocoon-cri/imagestore"
	"github.com/cocoonstack/cocoon-cri/pkg/cgroups"
	"github.com/cocoonstack/cocoon-cri/pkg/cocoon"
	"github.com/cocoonstack/cocoon-cri/pkg/metrics"
	"github.com/cocoonstack/cocoon-cri/pkg/store"
	"github.com/cocoonstack/cocoon-cri/pkg/vfio"
	"github.com/cocoonstack/cocoon-cri/tapmanager"
)

const (
	// stateFile is the database inside --state-dir.
	stateFile = "cocoon-cri.db"
	// capabilitiesFile inside --state-dir keeps what the cocoon binary was found to offer.
	capabilitiesFile = "cocoon-capabilities.json"
)

func runDaemon(parent context.Context, o *options) error {
	log := o.logger()
	ctx, stop := signal.NotifyContext(parent, syscall.SIGTERM, syscall.SIGINT)
	defer stop()

	cgroupDriver, err := cgroups.New(o.cgroupDriver)
	if err != nil {
		return fmt.Errorf("--cgroup-driver %s: %w", o.cgroupDriver, err)
	}
	st, err := store.Open(filepath.Join(o.stateDir, stateFile))
	if err != nil {
		return err
	}
	defer st.Close()
	for _, q := range st.Quarantined {
		log.Error("a state record could not be read and was moved to the quarantine bucket; its pod is unknown to cocoon-cri from now on",
			"table", q.Table, "key", q.Key, "err", q.Err)
	}

	// Collected always (the hooks cost next to nothing), served only with --metrics-addr. The
	// address is bound before anything changes on the node, so a busy port fails the start early.
	m := metrics.New(st, version)
	metricsAddr := "off"
	if o.metricsAddr != "" {
		ep, err := m.Listen(o.metricsAddr, log.With("component", "metrics"), o.profiling)
		if err != nil {
			return err
		}
		defer stopMetrics(ep, log)
		go func() {
			if err := ep.Serve(); err != nil {
				log.Error("the metrics server stopped", "err", err)
			}
		}()
		metricsAddr = ep.Addr().String()
	}

	cc := cocoon.New(cocoon.Options{
		Binary:   o.cocoonBinary,
		RootDir:  o.cocoonRootDir,
		RunDir:   o.cocoonRunDir,
		LogDir:   o.cocoonLogDir,
		Timeout:  o.cocoonTimeout,
		MaxCalls: o.maxCocoonCalls,
		// A restart asks cocoon for its version only, while neither binary changed.
		CapabilitiesFile: filepath.Join(o.stateDir, capabilitiesFile),
		Logger:           log.With("component", "cocoon"),
		Observe:          m.CocoonCall,
	})
	images, err := imagestore.New(st, cc, log.With("component", "images"), imagestore.Dirs{
		Root: orDefault(o.cocoonRootDir, cocoonDefaultRootDir),
		Run:  orDefault(o.cocoonRunDir, cocoonDefaultRunDir),
	}, imagestore.PullOptions{
		Insecure:        o.registryInsecure,
		CAFile:          o.registryCAFile,
		ProgressTimeout: o.pullProgressTimeout,
		CredentialsDir:  filepath.Join(o.stateDir, "pull-credentials"),
		OnPulled: func(r imagestore.PullResult) {
			m.ImagePulled(string(r.Kind), r.Took, r.Bytes, r.Present, r.Err)
		},
	})
	if err != nil {
		return err
	}
	self, err := os.Executable()
	if err != nil {
		return fmt.Errorf("find cocoon-cri's executable (it serves the attach plugin): %w", err)
	}
	nets := tapmanager.NewManager(tapmanager.Config{
		NetNSDir: o.netnsDir,
		ConfDir:  o.cniConfDir,
		BinDirs:  o.cniBinDirs,
		StateDir: filepath.Join(o.stateDir, "network"),
		Plugin:   self,
		Observe:  m.CNICall,
	})
	if err := nets.Init(); err != nil {
		return err
	}
	maxStorage := resource.MustParse(o.maxStorage) // validated with the options
	volumeMaxBytes := resource.MustParse(o.volumeMaxBytes)
	vms := vmruntime.New(vmruntime.Config{
		Version:             version,
		ServeDefaultHandler: o.serveDefaultHandler,
		GuestSSH:            vmruntime.GuestSSH{User: o.guestSSHUser, KeyFile: o.guestSSHKeyFile, Port: o.guestSSHPort},
		GuestReadyTimeout:   o.guestReadyTimeout,
		OrphanPolicy:        vmruntime.OrphanPolicy(o.orphanPolicy),
		Metrics:             m,
		Cgroups:             cgroupDriver,
		PullOnCreate:        o.passthroughEndpoint != "",
		MaxStorage:          maxStorage.Value(),
		VolumeMaxBytes:      volumeMaxBytes.Value(),
		AllowedNetworks:     o.allowedNetworks,
		Sysfs:               vfio.Sysfs(o.sysfsDir),
		Virtiofsd:           findVirtiofsd(o.virtiofsd, log),
		ShareDir:            filepath.Join(o.stateDir, "shares"),
		CheckpointJournal:   filepath.Join(o.stateDir, "checkpoints"),
		HibernateAfter:      o.hibernateAfter,
		WarmPools:           o.warmPools,
	}, log, st, vmruntime.CocoonClient(cc), nets, images)
	defer vms.Shutdown()

	var pass cri.Backend
	if o.passthroughEndpoint != "" {
		p, err := passthrough.Dial(o.passthroughEndpoint)
		if err != nil {
			return err
		}
		defer p.Close()
		pass = p
	}
	router := cri.New(vms, pass, o.passthroughEndpoint, log.With("component", "cri"))
	// Before anything changes on the node: VMs placed with another driver than the kubelet's
	// would escape its pod cgroups.
	checkCtx, cancelCheck := context.WithTimeout(ctx, cgroupCheckTimeout)
	err = router.CheckCgroupDriver(checkCtx)
	cancelCheck()
	if err != nil {
		return err
	}

	streams, err := vms.ServeStreams(o.streamAddress)
	if err != nil {
		return err
	}
	defer streams.Close()
	go func() {
		if err := streams.Serve(); err != nil {
			log.Error("the stream server stopped", "err", err)
		}
	}()

	// The capability probe (the version on a restart, the whole help on a first start) runs beside
	// the recovery's listing: the first answer needs both. A failure here is asked again by the
	// first caller.
	go func() { _, _ = cc.Capabilities(ctx) }()
	if err := vms.Recover(ctx); err != nil {
		return fmt.Errorf("recover state: %w", err)
	}
	go vms.WatchVMs(ctx)
	go vms.RunHibernation(ctx)
	go vms.RunWarmPools(ctx)
	if err := images.Sweep(ctx); err != nil {
		log.Warn("deleting unused image artifacts failed; the next removal retries", "err", err)
	}

	lis, err := listenUnix(o.socket)
	if err != nil {
		return err
	}
	unary, stream := cri.Interceptors(log.With("component", "cri"), m)
	g := grpc.NewServer(grpc.ChainUnaryInterceptor(unary), grpc.ChainStreamInterceptor(stream))
	router.Register(g)
	vms.RegisterImport(g)
	vms.RegisterPodControl(g)

	// Logged before the first answer: whoever sees an answer finds this line (the addresses in it)
	// already written. The listener queues connections meanwhile.
	log.Info("cocoon-cri serving", "version", version, "socket", o.socket, "stateDir", o.stateDir, "cocoon", o.cocoonBinary,
		"streams", streams.Addr(), "metrics", metricsAddr, "guestExec", vmruntime.DescribeExecPath(vms.ExecPath(ctx)),
		"passthrough", orDefault(o.passthroughEndpoint, "off"), "cgroupDriver", o.cgroupDriver)
	serveErr := make(chan error, 1)
	go func() { serveErr <- g.Serve(lis) }()

	select {
	case err := <-serveErr:
		return fmt.Errorf("serve: %w", err)
	case <-ctx.Done():
	}
	log.Info("shutting down", "grace", o.shutdownTimeout)
	stopped := make(chan struct{})
	go func() {
		g.GracefulStop()
		close(stopped)
	}()
	select {
	case <-stopped:
	case <-time.After(o.shutdownTimeout):
		log.Warn("RPCs still in flight at the shutdown deadline; stopping them")
		g.Stop()
	}
	log.Info("stopped")
	return nil
}

// cgroupCheckTimeout bounds the start's question to the passthrough runtime; one that does not
// answer in time is checked again by Status.
const cgroupCheckTimeout = 10 * time.Second

// metricsShutdownTimeout bounds the wait for scrapes in progress when the daemon stops.
const metricsShutdownTimeout = 5 * time.Second

// stopMetrics stops the metrics server, last: a scrape during shutdown still gets an answer.
func stopMetrics(ep *metrics.Endpoint, log *slog.Logger) {
	ctx, cancel := context.WithTimeout(context.Background(), metricsShutdownTimeout)
	defer cancel()
	if err := ep.Shutdown(ctx); err != nil {
		log.Warn("stopping the metrics server", "err", err)
	}
}

// findVirtiofsd is the virtiofsd to share volumes with, or "" when none is set or installed:
// volumes are then copied into guests.
func findVirtiofsd(path string, log *slog.Logger) string {
	if path == "" {
		return ""
	}
	found, err := exec.LookPath(path)
	if err != nil {
		log.Info("no virtiofsd: containers' volumes are copied into their guests", "virtiofsd", path, "err", err)
		return ""
	}
	return found
}
