// Package waittime accounts, for one RPC, the wall time spent waiting on programs outside
// cocoon-cri: cocoon commands, the CNI plugins, the passthrough runtime. What is left of the RPC's
// time is cocoon-cri's own cost, the figure its performance targets are about.
package waittime

import (
	"context"
	"sync"
	"time"
)

// Account is one RPC's time spent waiting. Waits that overlap count once: an RPC waiting on two
// programs at once loses that time once.
type Account struct {
	mu     sync.Mutex
	open   int
	since  time.Time
	waited time.Duration
	closed bool
	now    func() time.Time
}

type accountKey struct{}

// New starts an account for the RPC that ctx belongs to.
func New(ctx context.Context) (context.Context, *Account) {
	return withClock(ctx, time.Now)
}

func withClock(ctx context.Context, now func() time.Time) (context.Context, *Account) {
	a := &Account{now: now}
	return context.WithValue(ctx, accountKey{}, a), a
}

// Begin marks the start of a wait in ctx's RPC and returns what marks its end. Without an
// account in ctx (background work, a unit test) both do nothing.
func Begin(ctx context.Context) (end func()) {
	a, ok := ctx.Value(accountKey{}).(*Account)
	if !ok {
		return func() {}
	}
	a.mu.Lock()
	defer a.mu.Unlock()
	if a.closed {
		// Work the RPC left behind (a goroutine with its context): not the RPC's time.
		return func() {}
	}
	if a.open == 0 {
		a.since = a.now()
	}
	a.open++
	var once sync.Once
	return func() { once.Do(a.end) }
}

func (a *Account) end() {
	a.mu.Lock()
	defer a.mu.Unlock()
	a.open--
	if a.open > 0 {
		return
	}
	if a.closed {
		// Closed while this wait was open: Close counted it up to then.
		return
	}
	a.waited += a.now().Sub(a.since)
}

// Close ends the account when its RPC ends and returns the time waited. A wait still open counts
// up to now; waits begun later are not counted.
func (a *Account) Close() time.Duration {
	a.mu.Lock()
	defer a.mu.Unlock()
	if !a.closed {
		a.closed = true
		if a.open > 0 {
			a.waited += a.now().Sub(a.since)
		}
	}
	return a.waited
}
