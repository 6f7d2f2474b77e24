package cgroups

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/opencontainers/cgroups/systemd"
)

func TestNew(t *testing.T) {
	d, err := New(Cgroupfs)
	if err != nil || d.Name() != Cgroupfs {
		t.Fatalf("New(cgroupfs) = %v, %v", d, err)
	}
	for _, name := range []string{"", "Systemd", "cgroupfs "} {
		if _, err := New(name); err == nil || !strings.Contains(err.Error(), `"cgroupfs" or "systemd"`) {
			t.Errorf("New(%q): %v", name, err)
		}
	}
}

// TestNewSystemdWithoutSystemd: this machine runs no systemd, so the systemd driver must refuse
// to start and say what to do instead.
func TestNewSystemdWithoutSystemd(t *testing.T) {
	if systemd.IsRunningSystemd() {
		t.Skip("systemd runs here")
	}
	d, err := New(Systemd)
	if err == nil {
		t.Fatalf("New(systemd) without systemd = %v", d)
	}
	for _, want := range []string{"PID 1", "D-Bus", "/run/systemd/system", "--cgroup-driver cgroupfs", "kubelet's cgroupDriver"} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("error %q does not say %q", err, want)
		}
	}
}

func TestCgroupfsDriverWithoutCgroups(t *testing.T) {
	d := cgroupfsDriver{host: func() (*Host, error) { return nil, errors.New("no cgroup filesystem is mounted") }}
	if _, _, err := d.Place("/kubepods/pod1", "c1", []int{1}); err == nil || !strings.Contains(err.Error(), "not usable") {
		t.Fatalf("Place without cgroups: %v", err)
	}
	if err := d.Remove(context.Background(), "/kubepods/pod1/c1", "/kubepods/pod1/c1"); err != nil {
		t.Fatalf("Remove without cgroups, where nothing was placed: %v", err)
	}
	if _, _, err := d.Place("kubepods-pod1.slice:cri-containerd:c1", "c1", []int{1}); err == nil {
		t.Fatal("Place under a systemd-form parent succeeded")
	}
}

// TestCgroupfsDriverOnThisHost places a process tree through the Driver and takes it back.
func TestCgroupfsDriverOnThisHost(t *testing.T) {
	h := realHost(t)
	parent := testParent(t, h)
	d, err := New(Cgroupfs)
	if err != nil {
		t.Fatal(err)
	}
	cmd, pids := startTree(t)
	cgroup, created, err := d.Place(parent, "ctr1", pids)
	if err != nil {
		t.Fatal(err)
	}
	if want, _ := d.Path(parent, "ctr1"); cgroup != want || created != parent {
		t.Fatalf("Place = %q, %q; want %q, %q", cgroup, created, want, parent)
	}
	controller := "memory"
	if h.Hierarchies[0].Unified {
		controller = ""
	}
	for _, pid := range pids {
		if !inCgroup(t, pid, controller, cgroup) {
			t.Errorf("process %d is not in %s", pid, cgroup)
		}
	}
	_ = cmd.Process.Kill()
	_ = cmd.Wait()
	killPID(pids[1])
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if err := d.Remove(ctx, cgroup, created); err != nil {
		t.Fatal(err)
	}
	assertGone(t, h, parent)
}
