// Package faultpoint lets crash-safety tests kill cocoon-cri at a named point inside a lifecycle
// RPC, the way a SIGKILL or a power cut would. The environment is read once at start; when it is
// unset (always, outside those tests) a point costs a string comparison.
package faultpoint

import (
	"fmt"
	"os"
	"strconv"
	"strings"
	"sync"
	"syscall"
)

// EnvVar selects the point at which the process kills itself: "NAME" (its first pass) or
// "NAME#K" (its K-th pass since the process started).
const EnvVar = "COCOON_CRI_CRASH_AT"

// TraceEnvVar names a file to which every point passed is appended, one name per line: the
// crash tests run a scenario once with it to learn the points the scenario passes.
const TraceEnvVar = "COCOON_CRI_FAULTPOINT_TRACE"

// Named points inside RunPodSandbox, between its steps. Every store write and cocoon call is a
// point as well ("store container/before", "cocoon vm clone/after").
const (
	SandboxRecorded     = "RunPodSandbox/recorded"
	SandboxNetNSCreated = "RunPodSandbox/netns-created"
	SandboxCNIAdded     = "RunPodSandbox/cni-added"
	SandboxCocoonReady  = "RunPodSandbox/cocoon-config-written"
)

// Named points of a warm pool hand-over in StartContainer (docs/warm-pool.md). It passes the first,
// then the second beside tapmanager's HandOver, which passes "placeholder set aside" and "pod
// interface handed over", and the third once both are done.
const (
	HandOverClaimed    = "StartContainer/pool-vm-claimed"
	HandOverTaken      = "StartContainer/pool-vm-taken"
	HandOverGuestSetUp = "StartContainer/pool-guest-set-up"
)

// All lists the named RunPodSandbox points, in the order a run passes them.
var All = []string{SandboxRecorded, SandboxNetNSCreated, SandboxCNIAdded, SandboxCocoonReady}

var (
	tracePath          = os.Getenv(TraceEnvVar)
	enabled            = os.Getenv(EnvVar) != "" || tracePath != ""
	targetName, target = parseTarget(os.Getenv(EnvVar))
	mu                 sync.Mutex
	passes             = map[string]int{}
	trace              *os.File
)

func parseTarget(v string) (string, int) {
	name, k, ok := strings.Cut(v, "#")
	if !ok {
		return v, 1
	}
	n, err := strconv.Atoi(k)
	if err != nil || n < 1 {
		fmt.Fprintf(os.Stderr, "%s=%q: want NAME or NAME#K with K >= 1; no point selected\n", EnvVar, v) //nolint:errcheck
		return "", 0
	}
	return name, n
}

// Hit records a pass of the point and kills the process with SIGKILL if it is the selected pass.
func Hit(name string) {
	if !enabled {
		return
	}
	mu.Lock()
	passes[name]++
	pass := passes[name]
	if tracePath != "" {
		if trace == nil {
			trace, _ = os.OpenFile(tracePath, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644) //nolint:gosec // test-only trace
		}
		if trace != nil {
			_, _ = fmt.Fprintln(trace, name)
		}
	}
	mu.Unlock()
	if name != targetName || pass != target {
		return
	}
	_ = syscall.Kill(os.Getpid(), syscall.SIGKILL)
	select {} // SIGKILL cannot be caught; wait for it
}
