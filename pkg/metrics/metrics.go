// Package metrics owns cocoon-cri's Prometheus metrics: a registry of its own (so nothing a library
// registers globally leaks into the exposition), the hooks the rest of the daemon calls, and the
// HTTP endpoint that serves them. The packages that produce the numbers (pkg/cocoon, imagestore,
// cri) know nothing of Prometheus: they take plain callbacks or a small interface, which the daemon
// points here. docs/design.md ("Metrics") lists every series.
package metrics

import (
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"

	"github.com/cocoonstack/cocoon-cri/pkg/store"
)

// namespace prefixes every cocoon-cri series.
const namespace = "cocoon_cri"

// Image pull results, the values of the result label.
const (
	// PullSucceeded: the artifact was downloaded and imported into cocoon.
	PullSucceeded = "success"
	// PullPresent: the digest was on the node already and was only tagged; such a pull moves
	// almost no bytes and would drag the duration of real downloads down if counted with them.
	PullPresent = "present"
	// PullFailed: the pull failed (registry, stall, import), or was cancelled.
	PullFailed = "failure"
)

// unknownKind labels a pull that failed before its artifact was classified.
const unknownKind = "unknown"

// Metrics is cocoon-cri's set of metrics. Its methods are safe for concurrent use.
type Metrics struct {
	reg *prometheus.Registry

	rpcs           *prometheus.CounterVec
	rpcSeconds     *prometheus.HistogramVec
	rpcOwnSeconds  *prometheus.HistogramVec
	cocoonSeconds  *prometheus.HistogramVec
	cocoonFailures *prometheus.CounterVec
	cniSeconds     *prometheus.HistogramVec
	cniFailures    *prometheus.CounterVec
	pullSeconds    *prometheus.HistogramVec
	pullBytes      *prometheus.CounterVec
	orphans        prometheus.Gauge
	watcherRestart prometheus.Counter
	hibernations   *prometheus.HistogramVec
	poolReady      *prometheus.GaugeVec
	poolRefills    *prometheus.HistogramVec
	poolHandOvers  *prometheus.HistogramVec
	poolMisses     *prometheus.CounterVec
	poolFallbacks  *prometheus.CounterVec
}

// Buckets, in seconds. RPCs range from a List served from memory (well under a millisecond) to a
// StartContainer that boots a guest and waits for it (the guest-ready timeout is minutes); cocoon
// calls likewise from an inspect to a clone; pulls from a tag-only pull to a multi-GiB download.
var (
	rpcBuckets    = []float64{.001, .005, .01, .025, .05, .1, .25, .5, 1, 2.5, 5, 10, 30, 60, 120, 300}
	ownBuckets    = []float64{.0001, .00025, .0005, .001, .0025, .005, .01, .025, .05, .1, .25, .5, 1, 5}
	cocoonBuckets = []float64{.01, .025, .05, .1, .25, .5, 1, 2.5, 5, 10, 30, 60, 120}
	pullBuckets   = []float64{.1, .5, 1, 5, 10, 30, 60, 120, 300, 600, 1200, 1800, 3600}
)

// New returns the metrics of a daemon whose records are in st (read at every scrape for the VM
// counts; nil leaves them out) and whose version is version.
func New(st *store.Store, version string) *Metrics {
	m := &Metrics{
		reg: prometheus.NewRegistry(),
		rpcs: prometheus.NewCounterVec(prometheus.CounterOpts{
			Namespace: namespace, Name: "rpc_requests_total",
			Help: "CRI gRPC requests handled, by service, method, the runtime that served them (cocoon, passthrough, or both for merged answers) and gRPC status code.",
		}, []string{"service", "method", "runtime", "code"}),
		rpcSeconds: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Namespace: namespace, Name: "rpc_duration_seconds",
			Help:    "Time to handle a CRI gRPC request (a stream: its whole life), by service, method and the runtime that served it.",
			Buckets: rpcBuckets,
		}, []string{"service", "method", "runtime"}),
		rpcOwnSeconds: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Namespace: namespace, Name: "rpc_own_duration_seconds",
			Help: "Time of a unary CRI gRPC request not spent waiting on cocoon commands, CNI plugins or the passthrough runtime: " +
				"cocoon-cri's own cost, by service, method and the runtime that served it.",
			Buckets: ownBuckets,
		}, []string{"service", "method", "runtime"}),
		cocoonSeconds: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Namespace: namespace, Name: "cocoon_call_duration_seconds",
			Help:    "Time a cocoon command ran, failed or not, by subcommand (\"vm clone\").",
			Buckets: cocoonBuckets,
		}, []string{"subcommand"}),
		cocoonFailures: prometheus.NewCounterVec(prometheus.CounterOpts{
			Namespace: namespace, Name: "cocoon_call_failures_total",
			Help: "cocoon commands that failed (non-zero exit, timeout, could not run), by subcommand. " +
				"Some are expected and handled, such as vm rm of a VM already gone.",
		}, []string{"subcommand"}),
		cniSeconds: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Namespace: namespace, Name: "cni_call_duration_seconds",
			Help:    "Time the cluster's CNI plugins took for a pod network, failed or not, by operation (ADD, DEL).",
			Buckets: cocoonBuckets,
		}, []string{"op"}),
		cniFailures: prometheus.NewCounterVec(prometheus.CounterOpts{
			Namespace: namespace, Name: "cni_call_failures_total",
			Help: "CNI operations on pod networks that failed, by operation (ADD, DEL).",
		}, []string{"op"}),
		pullSeconds: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Namespace: namespace, Name: "image_pull_duration_seconds",
			Help:    "Time an image pull took, by artifact kind (snapshot, cloudimg, oci; unknown when it failed first) and result (success, present, failure).",
			Buckets: pullBuckets,
		}, []string{"kind", "result"}),
		pullBytes: prometheus.NewCounterVec(prometheus.CounterOpts{
			Namespace: namespace, Name: "image_pull_bytes_total",
			Help: "Bytes downloaded from registries by image pulls, added when a pull ends, by artifact kind. " +
				"OCI VM images are downloaded by cocoon itself and are not counted.",
		}, []string{"kind"}),
		orphans: prometheus.NewGauge(prometheus.GaugeOpts{
			Namespace: namespace, Name: "orphan_vms",
			Help: "cocoon VMs named as cocoon-cri names them (cri-) that no container record claims, left on the node by the last " +
				"startup reconcile: all it found under --orphan-policy alert or keep, those it failed to remove under destroy.",
		}),
		watcherRestart: prometheus.NewCounter(prometheus.CounterOpts{
			Namespace: namespace, Name: "event_watcher_restarts_total",
			Help: "Times the watcher of cocoon's VM events (cocoon vm status --event) ended and was started again.",
		}),
		hibernations: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Namespace: namespace, Name: "hibernation_duration_seconds",
			Help:    "Time hibernations of idle VMs (op hibernate; result failure when cocoon refused or failed) and wakes (op wake) took.",
			Buckets: prometheus.ExponentialBuckets(0.01, 2, 12),
		}, []string{"op", "result"}),
		poolReady: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Namespace: namespace, Name: "warm_pool_ready_vms",
			Help: "VMs a warm pool holds cloned and ready for a pod, by the pool's image reference.",
		}, []string{"image"}),
		poolRefills: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Namespace: namespace, Name: "warm_pool_refill_duration_seconds",
			Help:    "Time to make one warm pool VM (clone, cgroup, guest agent up), by image reference.",
			Buckets: cocoonBuckets,
		}, []string{"image"}),
		poolHandOvers: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Namespace: namespace, Name: "warm_pool_handover_duration_seconds",
			Help:    "Time to hand a warm pool VM to a starting container (pod interface, guest identity), by image reference.",
			Buckets: ownBuckets,
		}, []string{"image"}),
		poolMisses: prometheus.NewCounterVec(prometheus.CounterOpts{
			Namespace: namespace, Name: "warm_pool_misses_total",
			Help: "Containers of a pooled image that were cloned: no pool VM was ready, or the container's VM would differ from the pool's.",
		}, []string{"image"}),
		poolFallbacks: prometheus.NewCounterVec(prometheus.CounterOpts{
			Namespace: namespace, Name: "warm_pool_fallbacks_total",
			Help: "Hand-overs that failed: the pool VM was removed and the container cloned.",
		}, []string{"image"}),
	}
	m.reg.MustRegister(
		collectors.NewGoCollector(),
		collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}),
		m.rpcs, m.rpcSeconds, m.rpcOwnSeconds, m.cocoonSeconds, m.cocoonFailures, m.cniSeconds, m.cniFailures, m.pullSeconds, m.pullBytes, m.orphans, m.watcherRestart, m.hibernations,
		m.poolReady, m.poolRefills, m.poolHandOvers, m.poolMisses, m.poolFallbacks,
		prometheus.NewGaugeFunc(prometheus.GaugeOpts{
			Namespace: namespace, Name: "build_info",
			Help:        "Always 1; the version label is cocoon-cri's version.",
			ConstLabels: prometheus.Labels{"version": version},
		}, func() float64 { return 1 }),
	)
	if st != nil {
		m.reg.MustRegister(newVMCollector(st))
	}
	return m
}

// CocoonCall records one cocoon command; it has the signature of pkg/cocoon's Options.Observe.
func (m *Metrics) CocoonCall(subcommand string, took time.Duration, err error) {
	m.cocoonSeconds.WithLabelValues(subcommand).Observe(took.Seconds())
	if err != nil {
		m.cocoonFailures.WithLabelValues(subcommand).Inc()
	}
}

// CNICall records one CNI operation on a pod network; it has the signature of tapmanager's
// Config.Observe.
func (m *Metrics) CNICall(op string, took time.Duration, err error) {
	m.cniSeconds.WithLabelValues(op).Observe(took.Seconds())
	if err != nil {
		m.cniFailures.WithLabelValues(op).Inc()
	}
}

// ImagePulled records one pull that ended: kind is the artifact's kind ("" when it failed before
// the manifest was classified), present says the digest was on the node already, bytes is what
// was downloaded from the registry.
func (m *Metrics) ImagePulled(kind string, took time.Duration, bytes int64, present bool, err error) {
	if kind == "" {
		kind = unknownKind
	}
	result := PullSucceeded
	switch {
	case err != nil:
		result = PullFailed
	case present:
		result = PullPresent
	}
	m.pullSeconds.WithLabelValues(kind, result).Observe(took.Seconds())
	if bytes > 0 {
		m.pullBytes.WithLabelValues(kind).Add(float64(bytes))
	}
}

// Orphans records how many orphan VMs the startup reconcile left on the node (cri.Observer).
func (m *Metrics) Orphans(n int) { m.orphans.Set(float64(n)) }

// PoolReady sets how many VMs an image's warm pool has ready (vmruntime.Observer).
func (m *Metrics) PoolReady(image string, n int) { m.poolReady.WithLabelValues(image).Set(float64(n)) }

// PoolRefilled records one pool VM made (vmruntime.Observer).
func (m *Metrics) PoolRefilled(image string, took time.Duration) {
	m.poolRefills.WithLabelValues(image).Observe(took.Seconds())
}

// PoolHandedOver records one hand-over (vmruntime.Observer).
func (m *Metrics) PoolHandedOver(image string, took time.Duration) {
	m.poolHandOvers.WithLabelValues(image).Observe(took.Seconds())
}

// PoolMissed counts one container of a pooled image that was cloned (vmruntime.Observer).
func (m *Metrics) PoolMissed(image string) { m.poolMisses.WithLabelValues(image).Inc() }

// PoolFellBack counts one failed hand-over (vmruntime.Observer).
func (m *Metrics) PoolFellBack(image string) { m.poolFallbacks.WithLabelValues(image).Inc() }

// Hibernated records one hibernation (cri.Observer).
func (m *Metrics) Hibernated(took time.Duration) {
	m.hibernations.WithLabelValues("hibernate", "success").Observe(took.Seconds())
}

// HibernationFailed counts one hibernation cocoon refused or failed (cri.Observer).
func (m *Metrics) HibernationFailed(took time.Duration) {
	m.hibernations.WithLabelValues("hibernate", "failure").Observe(took.Seconds())
}

// Woke records one wake of a hibernated VM (cri.Observer).
func (m *Metrics) Woke(took time.Duration) {
	m.hibernations.WithLabelValues("wake", "success").Observe(took.Seconds())
}

// WatcherRestarted counts one restart of the VM event watcher (cri.Observer).
func (m *Metrics) WatcherRestarted() { m.watcherRestart.Inc() }
