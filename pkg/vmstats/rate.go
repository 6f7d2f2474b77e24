package vmstats

import "sync"

// CPURate turns cumulative CPU samples into a rate (nanocores) from each key's previous sample,
// the way the CRI's usage_nano_cores is defined. It is safe for concurrent use.
type CPURate struct {
	mu   sync.Mutex
	prev map[string]cpuSample
}

type cpuSample struct {
	at    int64 // Unix nanoseconds
	nanos uint64
	// origin names the process sampled: a different one starts the rate afresh.
	origin uint64
	// rate is what the sample measured, answered again to a caller in the same instant.
	rate uint64
	ok   bool
}

// Observe records a sample of key's cumulative CPU time taken at (Unix nanoseconds) from the
// process origin, and returns the usage since key's previous sample in nanocores. Without an
// earlier sample of the same process it returns the average since begun (when the VM started,
// Unix nanoseconds), so the first answer is not a misleading zero; ok is false when no rate can
// be given (no start known, or no time has passed).
func (r *CPURate) Observe(key string, origin uint64, at int64, nanos uint64, begun int64) (nanoCores uint64, ok bool) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.prev == nil {
		r.prev = map[string]cpuSample{}
	}
	prev, seen := r.prev[key]
	switch {
	case !seen || prev.origin != origin || nanos < prev.nanos:
		prev = cpuSample{at: begun}
	case at <= prev.at:
		// Two callers sampled in the same instant (or out of order): keep the older sample, so the
		// next caller still measures an interval, and answer what it measured.
		return prev.rate, prev.ok
	}
	cur := cpuSample{at: at, nanos: nanos, origin: origin}
	if elapsed := at - prev.at; prev.at > 0 && elapsed > 0 {
		cur.rate, cur.ok = uint64(float64(nanos-prev.nanos)/float64(elapsed)*1e9), true
	}
	r.prev[key] = cur
	return cur.rate, cur.ok
}

// Forget drops the samples of keys keep rejects.
func (r *CPURate) Forget(keep func(key string) bool) {
	r.mu.Lock()
	defer r.mu.Unlock()
	for k := range r.prev {
		if !keep(k) {
			delete(r.prev, k)
		}
	}
}

// Len is the number of keys with a sample.
func (r *CPURate) Len() int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return len(r.prev)
}
