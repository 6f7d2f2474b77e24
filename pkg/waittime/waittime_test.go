package waittime

import (
	"context"
	"testing"
	"time"
)

// clock is a time the test moves by hand.
type clock struct{ t time.Time }

func (c *clock) now() time.Time          { return c.t }
func (c *clock) advance(d time.Duration) { c.t = c.t.Add(d) }

func TestAccount(t *testing.T) {
	c := &clock{t: time.Unix(1000, 0)}
	ctx, a := withClock(context.Background(), c.now)

	c.advance(time.Second) // the RPC's own work
	end := Begin(ctx)
	c.advance(3 * time.Second)
	end()
	end() // a second end changes nothing
	c.advance(time.Second)

	// Two overlapping waits: 2 s of wall time, counted once.
	endA := Begin(ctx)
	c.advance(time.Second)
	endB := Begin(ctx)
	c.advance(time.Second)
	endA()
	endB()

	// A wait still open when the RPC ends counts up to the end, and no later.
	left := Begin(ctx)
	c.advance(time.Second)
	if got, want := a.Close(), 6*time.Second; got != want {
		t.Fatalf("waited %v, want %v", got, want)
	}
	c.advance(time.Second)
	left()
	// Begun after the end: work the RPC left behind.
	late := Begin(ctx)
	c.advance(time.Second)
	late()
	if got, want := a.Close(), 6*time.Second; got != want {
		t.Fatalf("waited %v after the close, want %v still", got, want)
	}
}

func TestBeginWithoutAccount(t *testing.T) {
	end := Begin(context.Background())
	end() // nothing to count, and no panic
}
