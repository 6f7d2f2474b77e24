// Package release says which cocoon release the simulator plays. The simulator's commands and
// its hypervisor processes (which start with the simulator's environment) both read it.
package release

import (
	"fmt"
	"os"
	"strings"
	"time"
)

// Env selects the release ("0.3.8" or "0.5.1", a leading "v" allowed).
const Env = "COCOON_SIM_VERSION"

// Default is the release without Env: the one cocoon's install guide downloads.
const Default = "0.5.1"

// Profile is what differs between the releases the simulator plays, each as that release's CLI
// does it (docs/cocoon-contract.md).
type Profile struct {
	// Version is what `cocoon version` prints.
	Version string
	// CloneResizes: vm clone takes --cpu, --memory and --storage (v0.3.8). From v0.5 a clone has
	// its snapshot's size, and cobra refuses those flags as unknown.
	CloneResizes bool
	// RestoreMode: vm clone takes --restore-mode copy|ondemand|mmap instead of --on-demand (v0.5).
	RestoreMode bool
	// Agent: hypervisors serve a hybrid vsock socket for cocoon-agent, and the CLI has vm exec
	// and vm reseed; a clone reseeds its guest (fresh machine-id) on its own, best effort (v0.5).
	Agent bool
	// ListJSONReconciled: vm list -o json prints [] for no VMs and shows a running record over a
	// dead hypervisor as "stopped (stale)" (v0.5). v0.3.8 prints "No VMs found." even for JSON,
	// and the record's raw "running".
	ListJSONReconciled bool
	// StatusOnce: vm status without --event or --watch prints the table once and exits (v0.5);
	// v0.3.8's always watches.
	StatusOnce bool
	// VhostUserFs: vm create/run take --shared-memory (guest RAM shared=on, kept in the record and
	// its snapshots) and the CLI has vm fs attach|detach for vhost-user-fs shares (v0.5).
	VhostUserFs bool
	// CidataV05: a cloud image's cloud-init seed has the v0.5 sources' content (network-config
	// ends with a catch-all DHCP entry, RequiredForOnline sits under [Link], chpasswd sets root's
	// password only); v0.3.8's otherwise (package nocloud).
	CidataV05 bool
	// Hibernate: the CLI has vm hibernate, and vm restore is v0.5's (SNAPSHOT or --from-dir,
	// --restore-mode, --force; a running, stopped or error VM) and simulated (v0.5). v0.3.8's
	// vm restore has other flags and is not simulated; it has no vm hibernate.
	Hibernate bool
	// SnapshotDirs: snapshot export takes --to-dir (the snapshot's files and snapshot.json, written
	// last, in a directory) and vm clone takes --from-dir, which clones such a directory without
	// importing it (v0.3.9 on, so v0.5).
	SnapshotDirs bool
	// LockRetry is how often a command retries a database flock another holds
	// (lock/flock/flock.go): 100 ms in v0.3.8 and until April 2026, 2 ms in the v0.5 sources.
	LockRetry time.Duration
}

var profiles = map[string]Profile{
	"0.3.8": {Version: "v0.3.8", CloneResizes: true, LockRetry: 100 * time.Millisecond},
	"0.5.1": {Version: "v0.5.1", RestoreMode: true, Agent: true, ListJSONReconciled: true, StatusOnce: true, VhostUserFs: true, CidataV05: true, Hibernate: true, SnapshotDirs: true, LockRetry: 2 * time.Millisecond},
}

// Current is the profile Env names.
func Current() (Profile, error) {
	name := strings.TrimPrefix(os.Getenv(Env), "v")
	if name == "" {
		name = Default
	}
	p, ok := profiles[name]
	if !ok {
		return Profile{}, fmt.Errorf("cocoon-sim: %s=%q: the simulator plays cocoon 0.3.8 or 0.5.1", Env, os.Getenv(Env))
	}
	return p, nil
}

// HasAgent reports whether this process plays a release whose guests run cocoon-agent. An
// invalid Env counts as no agent: the simulator's commands refuse to run under it anyway.
func HasAgent() bool {
	p, err := Current()
	return err == nil && p.Agent
}
