// Package faultpoint lets crash-safety tests kill cocoon-cri at a named point inside a lifecycle
// RPC, the way a SIGKILL or a power cut would. The environment variable is read once at start; when
// it is unset (always, outside those tests) a point costs a string comparison.
package faultpoint

import (
	"os"
	"syscall"
)

// EnvVar names the point at which the process kills itself.
const EnvVar = "COCOON_CRI_CRASH_AT"

var target = os.Getenv(EnvVar)

// The points, named RPC/step. Tests iterate over All.
const (
	SandboxRecorded     = "RunPodSandbox/recorded"
	SandboxNetNSCreated = "RunPodSandbox/netns-created"
	SandboxCNIAdded     = "RunPodSandbox/cni-added"
	SandboxCocoonReady  = "RunPodSandbox/cocoon-config-written"
)

// All lists every point, in the order a run passes them.
var All = []string{SandboxRecorded, SandboxNetNSCreated, SandboxCNIAdded, SandboxCocoonReady}

// Hit kills the process with SIGKILL if name is the selected point.
func Hit(name string) {
	if target == "" || target != name {
		return
	}
	_ = syscall.Kill(os.Getpid(), syscall.SIGKILL)
	select {} // SIGKILL cannot be caught; wait for it
}
