package cocoon

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// boundFake is a cocoon whose vm inspect of REF runs until the file release.REF exists; every call
// leaves started.REF behind.
func boundFake(t *testing.T, maxCalls int) (*Client, string) {
	t.Helper()
	dir := t.TempDir()
	script := `#!/bin/sh
for ref; do :; done
touch "` + dir + `/started.$ref"
case "$*" in *"vm inspect"*)
	while [ ! -e "` + dir + `/release.$ref" ]; do sleep 0.01; done
	echo "{\"id\":\"$ref\",\"state\":\"running\"}";;
esac
`
	bin := filepath.Join(dir, "cocoon")
	if err := os.WriteFile(bin, []byte(script), 0o755); err != nil {
		t.Fatal(err)
	}
	return New(Options{Binary: bin, MaxCalls: maxCalls}), dir
}

func waitForFile(t *testing.T, path string) {
	t.Helper()
	for deadline := time.Now().Add(time.Minute); time.Now().Before(deadline); time.Sleep(10 * time.Millisecond) {
		if _, err := os.Stat(path); err == nil {
			return
		}
	}
	t.Fatalf("%s never appeared", path)
}

// With MaxCalls cocoon commands running, another waits for one of them to end, in every copy of
// the client; a stop (which lasts its grace period) runs anyway; a call given up while waiting
// says why and never ran.
func TestCallsBeyondMaxCallsWait(t *testing.T) {
	c, dir := boundFake(t, 2)
	ctx := context.Background()
	inspected := make(chan error, 3)
	inspect := func(ctx context.Context, c *Client, ref string) {
		_, err := c.VMInspect(ctx, ref)
		inspected <- err
	}
	go inspect(ctx, c, "a")
	go inspect(ctx, c, "b")
	waitForFile(t, filepath.Join(dir, "started.a"))
	waitForFile(t, filepath.Join(dir, "started.b"))

	queuedCtx, giveUp := context.WithCancel(ctx)
	queued := make(chan error, 1)
	go func() {
		_, err := c.WithNetwork("/cni/conf", "", nil).VMInspect(queuedCtx, "c")
		queued <- err
	}()
	stopCtx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	if err := c.VMStop(stopCtx, "d", StopOptions{Timeout: time.Second}); err != nil {
		t.Fatalf("a stop with both slots taken: %v", err)
	}
	giveUp()
	err := <-queued
	if !errors.Is(err, context.Canceled) || !strings.Contains(err.Error(), "waiting for one of the 2 cocoon calls running to end") {
		t.Fatalf("a call given up while waiting: %v", err)
	}
	if _, err := os.Stat(filepath.Join(dir, "started.c")); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("the call given up while waiting ran cocoon (%v)", err)
	}

	go inspect(ctx, c, "e")
	if err := os.WriteFile(filepath.Join(dir, "release.a"), nil, 0o644); err != nil {
		t.Fatal(err)
	}
	waitForFile(t, filepath.Join(dir, "started.e"))
	for _, ref := range []string{"b", "e"} {
		if err := os.WriteFile(filepath.Join(dir, "release."+ref), nil, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	for range 3 {
		if err := <-inspected; err != nil {
			t.Fatal(err)
		}
	}
}

// Without a bound, calls never wait for each other.
func TestNoMaxCallsNoWait(t *testing.T) {
	c, dir := boundFake(t, 0)
	done := make(chan error, 3)
	for _, ref := range []string{"a", "b", "c"} {
		go func() {
			_, err := c.VMInspect(context.Background(), ref)
			done <- err
		}()
	}
	for _, ref := range []string{"a", "b", "c"} {
		waitForFile(t, filepath.Join(dir, "started."+ref))
	}
	for _, ref := range []string{"a", "b", "c"} {
		if err := os.WriteFile(filepath.Join(dir, "release."+ref), nil, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	for range 3 {
		if err := <-done; err != nil {
			t.Fatal(err)
		}
	}
}
