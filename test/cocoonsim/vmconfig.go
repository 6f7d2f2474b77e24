package cocoonsim

import (
	"fmt"
	"regexp"
	"runtime"
	"strings"
	"sync"

	"github.com/spf13/cobra"
	"github.com/spf13/pflag"

	"github.com/cocoonstack/cocoon-cri/pkg/cocoon"
	"github.com/cocoonstack/cocoon-cri/test/cocoonsim/internal/release"
)

var (
	validVMName   = lazyRegexp(`^[a-zA-Z0-9][a-zA-Z0-9._-]{0,62}$`)
	validUsername = lazyRegexp(`^[a-z_][a-z0-9_-]{0,31}$`)
	shellUnsafe   = lazyRegexp("[`$;|&(){}\\\\<>!]")
)

// vmSpec is a VM configuration as the commands build it: the persisted part (cocoon.VMConfig) and
// what cocoon keeps only for the duration of one command.
type vmSpec struct {
	cocoon.VMConfig
	OnDemand  bool
	User      string
	Password  string
	DataDisks []dataDiskSpec
}

// validate is cocoon's VMConfig.Validate, in its order and with its messages.
func (s *vmSpec) validate() error {
	switch {
	case s.Name == "":
		return fmt.Errorf("vm name cannot be empty")
	case !validVMName().MatchString(s.Name):
		return fmt.Errorf("vm name %q is invalid: must match %s (max 63 chars)", s.Name, validVMName().String())
	case s.CPU <= 0:
		return fmt.Errorf("--cpu must be at least 1, got %d", s.CPU)
	case s.Memory < 512<<20:
		return fmt.Errorf("--memory must be at least 512M, got %d", s.Memory)
	case s.Storage < 10<<30:
		return fmt.Errorf("--storage must be at least 10G, got %d", s.Storage)
	case s.QueueSize < 0:
		return fmt.Errorf("--queue-size must be non-negative, got %d", s.QueueSize)
	case s.DiskQueueSize < 0:
		return fmt.Errorf("--disk-queue-size must be non-negative, got %d", s.DiskQueueSize)
	case s.User != "" && !validUsername().MatchString(s.User):
		return fmt.Errorf("--user %q is invalid: must be a lowercase Linux username (letters, digits, underscores, hyphens)", s.User)
	case s.Password != "" && shellUnsafe().MatchString(s.Password):
		return fmt.Errorf("--password contains unsafe shell characters (backtick, $, ;, |, &, etc.)")
	}
	return nil
}

// vmSpecFromFlags reads vm create/run flags (cocoon's VMConfigFromFlags).
func vmSpecFromFlags(cmd *cobra.Command, image string) (*vmSpec, error) {
	f := cmd.Flags()
	name, _ := f.GetString("name")
	cpu, _ := f.GetInt("cpu")
	memStr, _ := f.GetString("memory")
	storStr, _ := f.GetString("storage")
	queueSize, _ := f.GetInt("queue-size")
	diskQueueSize, _ := f.GetInt("disk-queue-size")
	network, _ := f.GetString("network")
	user, _ := f.GetString("user")
	password, _ := f.GetString("password")
	noDirectIO, _ := f.GetBool("no-direct-io")
	windows, _ := f.GetBool("windows")
	sharedMemory, _ := f.GetBool("shared-memory") // false where the release has no such flag
	dataDiskRaw, _ := f.GetStringArray("data-disk")

	if name == "" {
		name = defaultVMName(image)
	}
	memBytes, err := ramInBytes(memStr)
	if err != nil {
		return nil, fmt.Errorf("invalid --memory %q: %w", memStr, err)
	}
	storBytes, err := ramInBytes(storStr)
	if err != nil {
		return nil, fmt.Errorf("invalid --storage %q: %w", storStr, err)
	}
	dataDisks, err := parseDataDiskFlags(dataDiskRaw)
	if err != nil {
		return nil, err
	}
	spec := &vmSpec{
		VMConfig: cocoon.VMConfig{Name: name, Config: cocoon.Config{
			CPU: cpu, Memory: memBytes, Storage: storBytes, QueueSize: queueSize, DiskQueueSize: diskQueueSize,
			Image: image, Network: network, NoDirectIO: noDirectIO, Windows: windows, SharedMemory: sharedMemory,
		}},
		User: user, Password: password, DataDisks: dataDisks,
	}
	if err := spec.validate(); err != nil {
		return nil, err
	}
	return spec, nil
}

// cloneSpecFromFlags reads vm clone flags: everything unset is inherited from the snapshot, and
// resources may only grow (cocoon's CloneVMConfigFromFlags). Validation runs before any default
// name is chosen, which is why a clone without --name fails.
func cloneSpecFromFlags(cmd *cobra.Command, snap *cocoon.SnapshotConfig) (*vmSpec, error) {
	f := cmd.Flags()
	name, _ := f.GetString("name")
	network, _ := f.GetString("network")
	if network == "" {
		network = snap.Network
	}
	queueSize, _ := f.GetInt("queue-size")
	if queueSize == 0 {
		queueSize = snap.QueueSize
	}
	diskQueueSize, _ := f.GetInt("disk-queue-size")
	if diskQueueSize == 0 {
		diskQueueSize = snap.DiskQueueSize
	}
	noDirectIO := snap.NoDirectIO
	if f.Changed("no-direct-io") {
		noDirectIO, _ = f.GetBool("no-direct-io")
	}
	cpu, memBytes, storBytes, err := mergeResourceFlags(cmd, snap)
	if err != nil {
		return nil, err
	}
	onDemand, err := snapshotBackedMemory(f)
	if err != nil {
		return nil, err
	}
	spec := &vmSpec{
		VMConfig: cocoon.VMConfig{Name: name, Config: cocoon.Config{
			CPU: cpu, Memory: memBytes, Storage: storBytes, QueueSize: queueSize, DiskQueueSize: diskQueueSize,
			Image: snap.Image, ImageDigest: snap.ImageDigest, ImageType: snap.ImageType,
			Network: network, NoDirectIO: noDirectIO, Windows: snap.Windows, SharedMemory: snap.SharedMemory,
		}},
		OnDemand: onDemand,
	}
	if err := spec.validate(); err != nil {
		return nil, err
	}
	return spec, nil
}

// snapshotBackedMemory reports whether a clone's memory stays backed by its snapshot's file
// rather than copied: --on-demand on v0.3.8; on v0.5 --restore-mode ondemand or mmap, mmap being
// the default for a plain snapshot.
func snapshotBackedMemory(f *pflag.FlagSet) (bool, error) {
	if f.Lookup("restore-mode") == nil {
		return f.GetBool("on-demand")
	}
	switch mode, _ := f.GetString("restore-mode"); mode {
	case "", "ondemand", "mmap":
		return true, nil
	case "copy":
		return false, nil
	default:
		return false, fmt.Errorf("invalid --restore-mode %q: must be copy, ondemand or mmap", mode)
	}
}

func mergeResourceFlags(cmd *cobra.Command, snap *cocoon.SnapshotConfig) (int, int64, int64, error) {
	cpu, memory, storage := snap.CPU, snap.Memory, snap.Storage
	cpuFlag, _ := cmd.Flags().GetInt("cpu")
	memStr, _ := cmd.Flags().GetString("memory")
	storStr, _ := cmd.Flags().GetString("storage")
	if cpuFlag > 0 {
		cpu = cpuFlag
	}
	if memStr != "" {
		v, err := ramInBytes(memStr)
		if err != nil {
			return 0, 0, 0, fmt.Errorf("invalid --memory %q: %w", memStr, err)
		}
		memory = v
	}
	if storStr != "" {
		v, err := ramInBytes(storStr)
		if err != nil {
			return 0, 0, 0, fmt.Errorf("invalid --storage %q: %w", storStr, err)
		}
		storage = v
	}
	switch {
	case cpu < snap.CPU:
		return 0, 0, 0, fmt.Errorf("--cpu %d below snapshot minimum %d", cpu, snap.CPU)
	case memory < snap.Memory:
		return 0, 0, 0, fmt.Errorf("--memory %s below snapshot minimum %s", humanSize(memory), humanSize(snap.Memory))
	case storage < snap.Storage:
		return 0, 0, 0, fmt.Errorf("--storage %s below snapshot minimum %s", humanSize(storage), humanSize(snap.Storage))
	}
	return cpu, memory, storage, nil
}

// validateFCCloneOverrides: a Firecracker snapshot cannot change CPU, memory or NIC count. From
// v0.5, which has no size flags on clone, --nics is refused as soon as it is given.
func validateFCCloneOverrides(cmd *cobra.Command, snap *cocoon.SnapshotConfig, prof release.Profile) error {
	if !prof.CloneResizes {
		if cmd.Flags().Changed("nics") {
			return fmt.Errorf("--nics override on clone is Cloud Hypervisor only (FC network_overrides retargets existing NICs, not resize)")
		}
		return nil
	}
	if cpu, _ := cmd.Flags().GetInt("cpu"); cpu > 0 && cpu != snap.CPU {
		return fmt.Errorf("--cpu %d not supported: Firecracker cannot change CPU after snapshot/load (snapshot has %d)", cpu, snap.CPU)
	}
	if mem, _ := cmd.Flags().GetString("memory"); mem != "" {
		return fmt.Errorf("--memory not supported: Firecracker cannot change memory after snapshot/load")
	}
	if nics, _ := cmd.Flags().GetInt("nics"); nics > 0 && nics != snap.NICs {
		return fmt.Errorf("--nics %d not supported: Firecracker cannot change NIC count after snapshot/load (snapshot has %d)", nics, snap.NICs)
	}
	return nil
}

// validateHostCPU rejects more vCPUs than the host has (cocoon uses runtime.NumCPU()).
func validateHostCPU(cpu int) error {
	if host := runtime.NumCPU(); cpu > host {
		return fmt.Errorf("requested %d vCPUs exceeds host cores (%d)", cpu, host)
	}
	return nil
}

var (
	refComponent = lazyRegexp(`^[a-z0-9]+((\.|_|__|-+)[a-z0-9]+)*$`)
	refTag       = lazyRegexp(`^[\w][\w.-]{0,127}$`)
)

// defaultVMName is cocoon's sanitizeVMName: "cocoon-<repo>[-<tag>]" from an image reference,
// without registry host, "library/" and the "latest" tag, cut to 63 characters.
func defaultVMName(image string) string {
	repo, tag, ok := splitImageRef(image)
	var name string
	if ok {
		name = "cocoon-" + strings.ReplaceAll(repo, "/", "-")
		if tag != "" && tag != "latest" {
			name += "-" + tag
		}
	} else {
		name = "cocoon-" + strings.NewReplacer("/", "-", ":", "-").Replace(image)
	}
	if len(name) > 63 {
		name = name[:63]
	}
	return name
}

// splitImageRef parses an OCI reference into repository path (no registry) and tag; ok is false
// for strings that are not valid references (cloud image URLs, for instance).
func splitImageRef(ref string) (repo, tag string, ok bool) {
	name := ref
	if at := strings.Index(name, "@"); at >= 0 {
		name = name[:at]
	} else if colon := strings.LastIndex(name, ":"); colon > strings.LastIndex(name, "/") {
		name, tag = name[:colon], name[colon+1:]
		if !refTag().MatchString(tag) {
			return "", "", false
		}
	}
	parts := strings.Split(name, "/")
	if len(parts) > 1 && (strings.ContainsAny(parts[0], ".:") || parts[0] == "localhost") {
		parts = parts[1:]
	}
	for _, p := range parts {
		if !refComponent().MatchString(p) {
			return "", "", false
		}
	}
	return strings.TrimPrefix(strings.Join(parts, "/"), "library/"), tag, true
}

// lazyRegexp compiles pattern on first use: every simulator process is one short command, and
// compiling all of its patterns at start cost about 4 ms of each (docs/profiles.md).
func lazyRegexp(pattern string) func() *regexp.Regexp {
	return sync.OnceValue(func() *regexp.Regexp { return regexp.MustCompile(pattern) })
}
