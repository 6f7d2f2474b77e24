package vmstats

import (
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
)

// startSleeper starts a process for the samplers to sample, killed when the test ends.
func startSleeper(t *testing.T) int {
	t.Helper()
	cmd := exec.Command("sleep", "600")
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = cmd.Process.Kill()
		_ = cmd.Wait()
	})
	return cmd.Process.Pid
}

// openFilesOf counts this process's descriptors open on pid's /proc files.
func openFilesOf(t *testing.T, pid int) int {
	t.Helper()
	entries, err := os.ReadDir("/proc/self/fd")
	if err != nil {
		t.Fatal(err)
	}
	n := 0
	for _, e := range entries {
		target, err := os.Readlink(filepath.Join("/proc/self/fd", e.Name()))
		if err == nil && strings.HasPrefix(target, "/proc/"+strconv.Itoa(pid)+"/") {
			n++
		}
	}
	return n
}

// A key's files stay open between samples (net/dev from its first read) and are closed with
// Close, when the key's PID changes, and by Forget.
func TestSamplersKeepFilesUntilClosed(t *testing.T) {
	var s Samplers
	first, second := startSleeper(t), startSleeper(t)
	for range 2 {
		if _, err := s.Sample("/proc", "c", first); err != nil {
			t.Fatal(err)
		}
	}
	if n := openFilesOf(t, first); n != 2 {
		t.Fatalf("%d files open after two samples, want stat and status", n)
	}
	if _, err := s.NetDev("/proc", "c", first); err != nil {
		t.Fatal(err)
	}
	if n := openFilesOf(t, first); n != 3 {
		t.Fatalf("%d files open after net/dev, want 3", n)
	}
	s.Close("c")
	if n := openFilesOf(t, first); n != 0 || s.Len() != 0 {
		t.Fatalf("%d files open, %d keys after Close", n, s.Len())
	}

	if _, err := s.Sample("/proc", "c", first); err != nil {
		t.Fatal(err)
	}
	if _, err := s.Sample("/proc", "c", second); err != nil {
		t.Fatal(err)
	}
	if a, b := openFilesOf(t, first), openFilesOf(t, second); a != 0 || b != 2 {
		t.Fatalf("after the key's PID changed: %d files of the old process, %d of the new; want 0 and 2", a, b)
	}
	s.Forget(func(key string) bool { return key != "c" })
	if n := openFilesOf(t, second); n != 0 || s.Len() != 0 {
		t.Fatalf("%d files open, %d keys after Forget", n, s.Len())
	}
}

// Samples of several keys, and of one key, run at once with Close and Forget beside them (run
// with -race): every sample either succeeds or finds its files closed.
func TestSamplersConcurrentUse(t *testing.T) {
	var s Samplers
	pids := []int{startSleeper(t), startSleeper(t)}
	var wg sync.WaitGroup
	errs := make(chan error, 64)
	for g := range 8 {
		wg.Go(func() {
			for i := range 50 {
				key := strconv.Itoa((g + i) % 2)
				pid := pids[(g+i)%2]
				var err error
				switch i % 5 {
				case 3:
					s.Close(key)
				case 4:
					s.Forget(func(k string) bool { return k != key })
				case 2:
					_, err = s.NetDev("/proc", key, pid)
				default:
					_, err = s.Sample("/proc", key, pid)
				}
				if err != nil && !errors.Is(err, ErrGone) {
					errs <- err
					return
				}
			}
		})
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Error(err)
	}
	s.Forget(func(string) bool { return false })
	for _, pid := range pids {
		if n := openFilesOf(t, pid); n != 0 {
			t.Errorf("%d files of %d left open", n, pid)
		}
	}
}
