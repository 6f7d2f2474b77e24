package imagestore

import (
	"context"
	"fmt"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"

	"github.com/cocoonstack/cocoon-cri/pkg/store"
)

// PullProgress is how far a pull is, as the OnProgress hook is told it.
type PullProgress struct {
	Ref string
	// Bytes have been downloaded of Total (0 while unknown).
	Bytes, Total int64
	// Done marks a pull's last report.
	Done bool
}

// progressReportInterval is how often a running pull logs how far it is.
const progressReportInterval = 10 * time.Second

// pullProgress counts one pull's downloaded bytes (it is the io.Writer copyBlob tells), reports
// them now and then, and watches for stalls.
type pullProgress struct {
	ref     string
	timeout time.Duration
	log     *slog.Logger
	hook    func(PullProgress)
	started time.Time

	bytes, total atomic.Int64
	lastByte     atomic.Int64 // Unix nanoseconds of the last progress

	mu          sync.Mutex
	stall       error
	lastReport  time.Time
	reportBytes int64

	// What the pull found, for its PullResult; only the pull's own goroutine touches them.
	kind    store.ImageKind
	present bool
}

func (s *Service) newPullProgress(ref string) *pullProgress {
	p := &pullProgress{ref: ref, timeout: s.pullOpts.ProgressTimeout, log: s.log, hook: s.pullOpts.OnProgress, started: time.Now()}
	p.lastReport = p.started
	return p
}

func (p *pullProgress) Write(b []byte) (int, error) {
	p.bytes.Add(int64(len(b)))
	p.lastByte.Store(time.Now().UnixNano())
	return len(b), nil
}

func (p *pullProgress) setTotal(n int64) { p.total.Store(n) }

// watch returns a context that is cancelled when no byte arrives for the progress timeout, and
// the function that ends the watch (the context stays valid; the pull's own context releases it).
// A pull is watched while it talks to the registry, not while it waits for a lock or for cocoon
// to finish an import.
func (p *pullProgress) watch(ctx context.Context) (context.Context, func()) {
	ctx, cancel := context.WithCancelCause(ctx)
	p.lastByte.Store(time.Now().UnixNano())
	tick := progressReportInterval
	if p.timeout > 0 {
		tick = max(min(tick, p.timeout/4), time.Millisecond)
	}
	stop, stopped := make(chan struct{}), make(chan struct{})
	go func() {
		defer close(stopped)
		ticker := time.NewTicker(tick)
		defer ticker.Stop()
		for {
			select {
			case <-stop:
				return
			case <-ctx.Done():
				return
			case now := <-ticker.C:
				if p.timeout > 0 && now.Sub(time.Unix(0, p.lastByte.Load())) > p.timeout {
					cancel(p.stalled(now))
					return
				}
				p.report(now, false)
			}
		}
	}()
	var once sync.Once
	return ctx, func() {
		once.Do(func() { close(stop) })
		<-stopped
	}
}

// stalled records and returns the stall error. It wraps context.DeadlineExceeded: the pull ran
// out of time to make progress.
func (p *pullProgress) stalled(now time.Time) error {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.stall = fmt.Errorf("pull of %s received nothing for %s (--image-pull-progress-timeout), after %d bytes: %w",
		p.ref, now.Sub(time.Unix(0, p.lastByte.Load())).Round(time.Millisecond), p.bytes.Load(), context.DeadlineExceeded)
	return p.stall
}

// stallError is the error of a stall the watch saw, or nil.
func (p *pullProgress) stallError() error {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.stall
}

// report logs the progress and tells the hook, at most once per interval unless final.
func (p *pullProgress) report(now time.Time, final bool) {
	p.mu.Lock()
	bytes := p.bytes.Load()
	due := final || (now.Sub(p.lastReport) >= progressReportInterval && bytes != p.reportBytes)
	if due {
		p.lastReport, p.reportBytes = now, bytes
	}
	p.mu.Unlock()
	if !due {
		return
	}
	if !final {
		p.log.Info("pulling image", "ref", p.ref, "bytes", bytes, "total", p.total.Load(), "elapsed", now.Sub(p.started).Round(time.Second))
	}
	if p.hook != nil {
		p.hook(PullProgress{Ref: p.ref, Bytes: bytes, Total: p.total.Load(), Done: final})
	}
}
