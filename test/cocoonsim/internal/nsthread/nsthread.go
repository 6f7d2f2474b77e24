// Package nsthread runs code on an OS thread that may change network namespace, without letting
// that namespace leak to any other goroutine. Namespaces belong to threads; the Go scheduler moves
// goroutines between threads, so a namespace switch is only safe on a locked thread that is put
// back afterwards, or thrown away when it cannot be.
package nsthread

import (
	"errors"
	"fmt"
	"runtime"

	"github.com/vishvananda/netns"
)

// Run calls fn on a thread of its own, which fn may move into other network namespaces (setns,
// unshare). Afterwards the thread returns to the caller's namespace; if that fails it is discarded
// with its goroutine. Sockets and processes fn creates stay in the namespace they were made in.
func Run(fn func() error) error {
	errc := make(chan error, 1)
	go func() {
		runtime.LockOSThread()
		orig, err := netns.Get()
		if err != nil {
			errc <- fmt.Errorf("get current netns: %w", err)
			return
		}
		defer orig.Close() //nolint:errcheck
		fnErr := fn()
		if err := netns.Set(orig); err != nil {
			errc <- errors.Join(fnErr, fmt.Errorf("restore netns: %w", err))
			return
		}
		runtime.UnlockOSThread()
		errc <- fnErr
	}()
	return <-errc
}

// In calls fn on a thread inside the network namespace target.
func In(target netns.NsHandle, fn func() error) error {
	return Run(func() error {
		if err := netns.Set(target); err != nil {
			return fmt.Errorf("setns: %w", err)
		}
		return fn()
	})
}

// New creates an anonymous network namespace and returns a handle to it; the namespace lives as
// long as the handle, or anything created in it, stays open.
func New() (netns.NsHandle, error) {
	ns := netns.None()
	err := Run(func() error {
		var err error
		ns, err = netns.New()
		return err
	})
	if err != nil {
		return netns.None(), fmt.Errorf("create netns: %w", err)
	}
	return ns, nil
}
