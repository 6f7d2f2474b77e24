// Package hostguard checks that a test run left the host's own files alone: simulated guests write
// their /etc files and run commands as root, the kubelet the conformance test runs sets global
// sysctls and creates directories, and so does containerd: a mistake there could change the host itself.
package hostguard

import (
	"bytes"
	"fmt"
	"os"
	"syscall"
)

// KubeletSysctls are the global kernel settings (under /proc/sys) a kubelet sets when it starts:
// pkg/kubelet/cm/container_manager_linux.go, setupKernelTunables.
var KubeletSysctls = []string{
	"vm/overcommit_memory", "vm/panic_on_oom", "kernel/panic", "kernel/panic_on_oops",
	"kernel/keys/root_maxkeys", "kernel/keys/root_maxbytes",
}

// guarded are the host files guests have their own copies of, and the kubelet's sysctls.
var guarded = append([]string{"/etc/hosts", "/etc/hostname", "/etc/resolv.conf"}, sysctlPaths()...)

func sysctlPaths() []string {
	paths := make([]string, len(KubeletSysctls))
	for i, s := range KubeletSysctls {
		paths[i] = "/proc/sys/" + s
	}
	return paths
}

// runtimeDirs are the host directories a kubelet makes whatever its flags say, and those a
// containerd makes when its configuration does not move them (the tests' containerd keeps
// everything under its own directory). Not /run/containerd itself, nor the k8s.io cgroup of pods
// without a parent: every containerd puts its shims' sockets in /run/containerd/s and runc those
// pods there, so the test daemons of packages that run at once make and remove them while another
// package's guard looks; each daemon removes what it made (test/containerd checks it).
var runtimeDirs = []string{
	"/var/log/containers", "/var/log/pods", "/var/lib/kubelet",
	"/run/containerd/containerd.sock", "/run/containerd/io.containerd.runtime.v2.task", "/run/containerd/runc",
	"/var/lib/containerd", "/opt/containerd", "/run/netns",
}

// State is what the host looked like before the run.
type State struct {
	files  map[string][]byte
	exists map[string]bool
}

// Snapshot records the guarded files and whether the kubelet's and containerd's directories exist.
func Snapshot() State {
	s := State{files: map[string][]byte{}, exists: map[string]bool{}}
	for _, f := range guarded {
		data, err := os.ReadFile(f)
		if err == nil {
			s.files[f] = data
		}
	}
	for _, d := range runtimeDirs {
		_, err := os.Lstat(d)
		s.exists[d] = err == nil
	}
	return s
}

// Check reports what changed since the snapshot, and whether /dev/null is still the null device.
func (s State) Check() error {
	var info syscall.Stat_t
	if err := syscall.Stat(os.DevNull, &info); err != nil {
		return fmt.Errorf("%s: %w", os.DevNull, err)
	}
	if info.Mode&syscall.S_IFMT != syscall.S_IFCHR || info.Rdev != 0x103 {
		return fmt.Errorf("%s is no longer the null device (mode %o): something replaced it", os.DevNull, info.Mode)
	}
	for f, before := range s.files {
		after, err := os.ReadFile(f)
		if err != nil || !bytes.Equal(before, after) {
			return fmt.Errorf("the host's %s changed during the run", f)
		}
	}
	for d, before := range s.exists {
		if _, err := os.Lstat(d); (err == nil) != before {
			return fmt.Errorf("the host's %s was created or removed during the run", d)
		}
	}
	return nil
}
