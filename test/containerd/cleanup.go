package containerdtest

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/cocoonstack/cocoon-cri/test/stale"
)

// shimSocketDir is where containerd's shims put their sockets whatever containerd's state
// directory (containerd's defaults.DefaultStateDir + "/s"); each shim removes its own at exit.
const shimSocketDir = "/run/containerd/s"

// namespaceCgroups are the parent cgroups runc puts the containers of containerd's CRI namespace
// in when a pod names no cgroup parent: k8s.io in every hierarchy.
func namespaceCgroups() []string {
	dirs, _ := filepath.Glob("/sys/fs/cgroup/*/k8s.io")
	if unified, err := os.Stat("/sys/fs/cgroup/k8s.io"); err == nil && unified.IsDir() {
		dirs = append(dirs, "/sys/fs/cgroup/k8s.io")
	}
	return dirs
}

// killTasks kills what a killed containerd leaves running: every process in the cgroups of the
// containers runc still has state for, then the daemon's shims; and removes those cgroups. A
// cgroup names its container, so no other process is touched whatever PIDs were reused.
func (d *Daemon) killTasks() error {
	cgroups, err := d.containerCgroups()
	if err != nil {
		return err
	}
	for _, cg := range cgroups {
		killAll(cg)
	}
	for _, pid := range d.shimPIDs() {
		_ = syscall.Kill(pid, syscall.SIGKILL)
	}
	d.removeShimSockets()
	var errs []error
	for _, cg := range cgroups {
		if err := removeCgroup(cg); err != nil {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}

// containerCgroups are the cgroup directories of every container in runc's state under Dir.
func (d *Daemon) containerCgroups() ([]string, error) {
	states, _ := filepath.Glob(filepath.Join(d.opts.Dir, "runc", "*", "*", "state.json"))
	var dirs []string
	for _, file := range states {
		data, err := os.ReadFile(file)
		if err != nil {
			return nil, err
		}
		var state struct {
			CgroupPaths map[string]string `json:"cgroup_paths"`
		}
		if err := json.Unmarshal(data, &state); err != nil {
			return nil, fmt.Errorf("runc state %s: %w", file, err)
		}
		for _, dir := range state.CgroupPaths {
			if !slices.Contains(dirs, dir) {
				dirs = append(dirs, dir)
			}
		}
	}
	return dirs, nil
}

func killAll(cgroup string) {
	data, _ := os.ReadFile(filepath.Join(cgroup, "cgroup.procs"))
	for _, field := range strings.Fields(string(data)) {
		if pid, err := strconv.Atoi(field); err == nil {
			_ = syscall.Kill(pid, syscall.SIGKILL)
		}
	}
}

// removeCgroup removes a cgroup once its killed processes are gone.
func removeCgroup(dir string) error {
	deadline := time.Now().Add(10 * time.Second)
	for {
		err := os.Remove(dir)
		if err == nil || errors.Is(err, os.ErrNotExist) {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("remove cgroup %s: %w", dir, err)
		}
		killAll(dir)
		time.Sleep(50 * time.Millisecond)
	}
}

// shimPIDs are the runc shims serving this daemon: their command line names its socket.
func (d *Daemon) shimPIDs() []int {
	entries, _ := os.ReadDir("/proc")
	var pids []int
	for _, e := range entries {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		cmdline, err := os.ReadFile(filepath.Join("/proc", e.Name(), "cmdline"))
		if err != nil {
			continue
		}
		args := bytes.Split(bytes.TrimRight(cmdline, "\x00"), []byte{0})
		if filepath.Base(string(args[0])) != "containerd-shim-runc-v2" {
			continue
		}
		for i := 0; i+1 < len(args); i++ {
			if string(args[i]) == "-address" && string(args[i+1]) == d.socket() {
				pids = append(pids, pid)
			}
		}
	}
	return pids
}

// shimSockets are the sockets of this daemon's shims, in the host-wide directory every containerd
// puts them in: each task's bundle records its shim's address in bootstrap.json.
func (d *Daemon) shimSockets() []string {
	files, _ := filepath.Glob(filepath.Join(d.opts.Dir, "state", "io.containerd.runtime.v2.task", "*", "*", "bootstrap.json"))
	var sockets []string
	for _, file := range files {
		data, err := os.ReadFile(file)
		if err != nil {
			continue
		}
		var bootstrap struct {
			Address string `json:"address"`
		}
		if json.Unmarshal(data, &bootstrap) != nil {
			continue
		}
		if socket := strings.TrimPrefix(bootstrap.Address, "unix://"); filepath.Dir(socket) == shimSocketDir {
			sockets = append(sockets, socket)
		}
	}
	return sockets
}

// removeShimSockets removes the sockets of killed shims, which cannot.
func (d *Daemon) removeShimSockets() {
	for _, socket := range d.shimSockets() {
		_ = os.Remove(socket)
	}
}

// unmountUnder detaches every mount under dir (snapshots, pod shm, network namespaces), the last
// mounted first.
func unmountUnder(dir string) error {
	mounts, err := stale.MountsUnder(dir)
	if err != nil {
		return err
	}
	return stale.Unmount(mounts)
}

// removeShimSocketDir removes the shims' socket directory and its parent when this daemon made
// them and they are empty again.
func removeShimSocketDir() {
	_ = os.Remove(shimSocketDir)
	_ = os.Remove(filepath.Dir(shimSocketDir))
}
