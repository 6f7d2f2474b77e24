package metrics

import (
	"github.com/prometheus/client_golang/prometheus"

	"github.com/cocoonstack/cocoon-cri/pkg/store"
)

// vmCollector counts the containers (one VM each) by state when scraped. Counting at scrape time
// from the store's in-memory mirror, rather than keeping a gauge that every state change must
// remember to move, means the numbers cannot drift from the records, also across a restart or a
// startup reconcile that rewrites them.
type vmCollector struct {
	hibernated *prometheus.Desc
	st         *store.Store
	desc       *prometheus.Desc
}

// vmStates are always exposed, at zero when no container is in them, so that a dashboard's series
// do not vanish on an idle node.
var vmStates = []store.ContainerState{store.ContainerCreated, store.ContainerRunning, store.ContainerExited}

func newVMCollector(st *store.Store) *vmCollector {
	return &vmCollector{st: st, desc: prometheus.NewDesc(
		prometheus.BuildFQName(namespace, "", "vms"),
		"Containers by state, each one VM: created (its VM is made at start), running, exited (VM stopped, kept until the container is removed).",
		[]string{"state"}, nil,
	), hibernated: prometheus.NewDesc(
		prometheus.BuildFQName(namespace, "", "hibernated_vms"),
		"Running containers whose VM hibernates: saved to disk, its hypervisor ended, woken on use.",
		nil, nil,
	)}
}

func (c *vmCollector) Describe(ch chan<- *prometheus.Desc) { ch <- c.desc; ch <- c.hibernated }

func (c *vmCollector) Collect(ch chan<- prometheus.Metric) {
	counts := make(map[store.ContainerState]int, len(vmStates))
	for _, s := range vmStates {
		counts[s] = 0
	}
	// The filter sees every record under the table's read lock and keeps none, so nothing is copied.
	hibernated := 0
	c.st.Containers.List(func(ctr *store.Container) bool {
		counts[ctr.State]++
		if ctr.State == store.ContainerRunning && ctr.VM.Hibernated() {
			hibernated++
		}
		return false
	})
	ch <- prometheus.MustNewConstMetric(c.hibernated, prometheus.GaugeValue, float64(hibernated))
	for state, n := range counts {
		ch <- prometheus.MustNewConstMetric(c.desc, prometheus.GaugeValue, float64(n), string(state))
	}
}
