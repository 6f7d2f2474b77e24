package cocoon

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"sync"
	"time"

	"golang.org/x/sync/errgroup"
	"golang.org/x/sys/unix"

	"github.com/cocoonstack/cocoon-cri/pkg/atomicfile"
)

// Capabilities are what a cocoon binary offers of what cocoon-cri uses, learned from the binary
// itself: its version, and the --help of the subcommands whose flags changed between releases
// (docs/cocoon-contract.md). cocoon-cri passes only flags the binary has.
type Capabilities struct {
	// Version is what cocoon version prints ("v0.5.1").
	Version string
	// Exec: vm exec runs commands through the guest agent (newer than v0.3.8).
	Exec bool
	// CloneResize: vm clone takes --cpu, --memory and --storage (v0.3.8). Later releases fix a
	// clone's size to its snapshot's.
	CloneResize bool
	// CloneOnDemand: vm clone takes --on-demand (lazy memory restore, cloud-hypervisor).
	CloneOnDemand bool
	// CloneRestoreMode: vm clone takes --restore-mode copy|ondemand|mmap, which replaces
	// --on-demand.
	CloneRestoreMode bool
	// ReseedMachineID: vm reseed --machine-id gives a clone fresh entropy and its own machine-id.
	ReseedMachineID bool
	// DiskAttach: vm disk attach hot-adds a raw file or block device to a running VM (v0.5).
	DiskAttach bool
	// DeviceAttach: vm device attach hot-adds a PCI device bound to vfio-pci to a running VM (v0.5).
	DeviceAttach bool
	// FsAttach: vm create/run take --shared-memory and vm fs attach hot-adds a vhost-user-fs share
	// (a virtiofsd socket) to a running VM created with it (v0.5).
	FsAttach bool
	// Hibernate: vm hibernate saves a running VM into a snapshot of its own and ends its
	// hypervisor in one pause, and vm restore resumes it from that snapshot with the same identity
	// and network (v0.5).
	Hibernate bool
	// RestoreMode: vm restore takes --restore-mode copy|ondemand|mmap.
	RestoreMode bool
	// SnapshotDirs: snapshot export takes --to-dir and vm clone --from-dir, which clones a
	// directory so exported without importing it (v0.3.9 on).
	SnapshotDirs bool
}

// Capabilities probes the binary once and caches the answer, shared by every client of that
// binary path: it cannot change while the binary does not. A probe that fails is not cached: the
// next call asks again. With Options.CapabilitiesFile, a restarted cocoon-cri asks only for the
// version while neither binary changed.
func (c *Client) Capabilities(ctx context.Context) (Capabilities, error) {
	return probes.get(ctx, c)
}

// probes caches Capabilities per binary path.
var probes = &capabilityCache{known: map[string]Capabilities{}, inFlight: map[string]*probeCall{}}

// capabilityCache holds what each binary was found to offer. Its lock is never held across a
// cocoon call: callers that need a probe in flight wait for it, each no longer than its own context.
type capabilityCache struct {
	mu       sync.Mutex
	known    map[string]Capabilities
	inFlight map[string]*probeCall
}

// probeCall is one probe in flight; done closes when caps and err are set.
type probeCall struct {
	done chan struct{}
	caps Capabilities
	err  error
}

// probeTimeout bounds each call of a probe: help output is instant on any cocoon.
const probeTimeout = 30 * time.Second

func (p *capabilityCache) get(ctx context.Context, c *Client) (Capabilities, error) {
	p.mu.Lock()
	if caps, ok := p.known[c.opts.Binary]; ok {
		p.mu.Unlock()
		return caps, nil
	}
	call, running := p.inFlight[c.opts.Binary]
	if !running {
		call = &probeCall{done: make(chan struct{})}
		p.inFlight[c.opts.Binary] = call
		// The probe belongs to every caller waiting for it, not to the first one's context.
		go p.run(context.WithoutCancel(ctx), c, call)
	}
	p.mu.Unlock()
	select {
	case <-call.done:
		return call.caps, call.err
	case <-ctx.Done():
		return Capabilities{}, fmt.Errorf("probe cocoon: %w", ctx.Err())
	}
}

// run probes the binary and publishes the answer; a failure is not kept, so the next caller asks
// again.
func (p *capabilityCache) run(ctx context.Context, c *Client, call *probeCall) {
	call.caps, call.err = probe(ctx, c)
	p.mu.Lock()
	defer p.mu.Unlock()
	if call.err == nil {
		p.known[c.opts.Binary] = call.caps
	}
	delete(p.inFlight, c.opts.Binary)
	close(call.done)
}

// probe asks the binary for its version, then reuses the help probe an earlier cocoon-cri process
// kept in Options.CapabilitiesFile for the same two binaries and version, or reads the help anew.
func probe(ctx context.Context, c *Client) (Capabilities, error) {
	v, err := c.Version(ctx)
	if err != nil {
		return Capabilities{}, fmt.Errorf("probe cocoon: %w", err)
	}
	file := c.opts.CapabilitiesFile
	if file == "" {
		return probeHelp(ctx, c, v.Version)
	}
	key, err := probeKey(c.opts.Binary, v.Version)
	if err != nil {
		c.opts.Logger.Warn("cocoon's capabilities cannot be kept across restarts", "err", err)
		return probeHelp(ctx, c, v.Version)
	}
	if caps, ok := loadProbe(file, key); ok {
		return caps, nil
	}
	caps, err := probeHelp(ctx, c, v.Version)
	if err != nil {
		return Capabilities{}, err
	}
	if err := saveProbe(file, key, caps); err != nil {
		c.opts.Logger.Warn("cocoon's capabilities cannot be kept across restarts", "err", err)
	}
	return caps, nil
}

// keptProbe is the CapabilitiesFile's content.
type keptProbe struct {
	Key          string       `json:"key"`
	Capabilities Capabilities `json:"capabilities"`
}

// probeKey names what a probe's answer depends on: the cocoon binary (by path and file identity,
// which any replacement changes: a new inode, size, mtime or ctime), the version it reports (a
// wrapper script's target can change under it) and cocoon-cri's own executable (whose probe reads
// the help).
func probeKey(binary, version string) (string, error) {
	path, err := exec.LookPath(binary)
	if err != nil {
		return "", err
	}
	self, err := os.Executable()
	if err != nil {
		return "", err
	}
	cocoonID, err := fileIdentity(path)
	if err != nil {
		return "", err
	}
	selfID, err := fileIdentity(self)
	if err != nil {
		return "", err
	}
	return fmt.Sprintf("cocoon %s %s %s; cocoon-cri %s %s", path, cocoonID, version, self, selfID), nil
}

func fileIdentity(path string) (string, error) {
	var st unix.Stat_t
	if err := unix.Stat(path, &st); err != nil {
		return "", fmt.Errorf("stat %s: %w", path, err)
	}
	return fmt.Sprintf("dev=%d ino=%d size=%d mtime=%d.%09d ctime=%d.%09d",
		st.Dev, st.Ino, st.Size, st.Mtim.Sec, st.Mtim.Nsec, st.Ctim.Sec, st.Ctim.Nsec), nil
}

// loadProbe returns the kept answer when its key is key; anything else (no file, another key, a
// damaged file) means probing anew.
func loadProbe(file, key string) (Capabilities, bool) {
	data, err := os.ReadFile(file)
	if err != nil {
		return Capabilities{}, false
	}
	var kept keptProbe
	if json.Unmarshal(data, &kept) != nil || kept.Key != key {
		return Capabilities{}, false
	}
	return kept.Capabilities, true
}

func saveProbe(file, key string, caps Capabilities) error {
	data, err := json.Marshal(keptProbe{Key: key, Capabilities: caps})
	if err != nil {
		return err
	}
	if err := os.MkdirAll(filepath.Dir(file), 0o700); err != nil {
		return err
	}
	return atomicfile.Write(file, data, 0o600)
}

// probeHelp reads what the binary offers from the --help of the subcommands whose flags changed.
// The helps are asked at once: each is a process start, and on a loaded node one after another
// they held the daemon's start for as long as the slowest ten process starts in a row.
func probeHelp(ctx context.Context, c *Client, version string) (Capabilities, error) {
	subcommands := [][]string{
		{"vm", "clone"}, {"vm", "exec"}, {"vm", "reseed"}, {"vm", "disk", "attach"},
		{"vm", "device", "attach"}, {"vm", "fs", "attach"}, {"vm", "create"}, {"vm", "hibernate"},
		{"vm", "restore"}, {"snapshot", "export"},
	}
	helps := make([]string, len(subcommands))
	g, gctx := errgroup.WithContext(ctx)
	for i, args := range subcommands {
		g.Go(func() error {
			out, err := c.run(gctx, call{args: append(slices.Clone(args), "--help"), timeout: probeTimeout})
			if err != nil {
				return fmt.Errorf("probe cocoon %s: %w", strings.Join(args, " "), err)
			}
			helps[i] = string(out)
			return nil
		})
	}
	if err := g.Wait(); err != nil {
		return Capabilities{}, err
	}
	clone, exec, reseed, disk, device, fs, create, hibernate, restore, export :=
		helps[0], helps[1], helps[2], helps[3], helps[4], helps[5], helps[6], helps[7], helps[8], helps[9]

	caps := Capabilities{Version: version}
	caps.CloneResize = hasFlag(clone, "cpu") && hasFlag(clone, "memory") && hasFlag(clone, "storage")
	caps.CloneOnDemand = hasFlag(clone, "on-demand")
	caps.CloneRestoreMode = hasFlag(clone, "restore-mode")
	// cobra answers the help of a subcommand it does not have with its parent's, exit 0: the
	// usage line tells which help came back.
	caps.Exec = strings.Contains(exec, execUsage)
	caps.ReseedMachineID = strings.Contains(reseed, "cocoon vm reseed") && hasFlag(reseed, "machine-id")
	caps.DiskAttach = strings.Contains(disk, "cocoon vm disk attach") && hasFlag(disk, "path") && hasFlag(disk, "name")
	caps.DeviceAttach = strings.Contains(device, "cocoon vm device attach") && hasFlag(device, "pci") && hasFlag(device, "id")
	caps.FsAttach = strings.Contains(fs, "cocoon vm fs attach") && hasFlag(fs, "socket") && hasFlag(fs, "tag") &&
		hasFlag(create, "shared-memory")
	caps.Hibernate = strings.Contains(hibernate, "cocoon vm hibernate") && hasFlag(hibernate, "name") &&
		strings.Contains(restore, "cocoon vm restore")
	caps.RestoreMode = caps.Hibernate && hasFlag(restore, "restore-mode")
	caps.SnapshotDirs = hasFlag(clone, "from-dir") && hasFlag(export, "to-dir")
	return caps, nil
}

// hasFlag reports whether cobra help text lists the long flag name ("      --cpu int").
func hasFlag(help, name string) bool {
	return regexp.MustCompile(`(?m)^\s+(-\w, )?--` + regexp.QuoteMeta(name) + `(\s|$)`).MatchString(help)
}
