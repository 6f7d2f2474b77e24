package cocoon

import (
	"context"
	"fmt"
	"math"
	"strconv"
	"time"
)

// CreateOptions are the flags of vm create and vm run. Every field is passed explicitly, so zero
// means zero (NICs 0 = no network), not cocoon's default.
type CreateOptions struct {
	Name       string
	CPU        int
	Memory     int64 // bytes
	Storage    int64 // COW disk bytes
	NICs       int
	Network    string // CNI conflist name; empty = cocoon's default
	Bridge     string // TAP on this host bridge instead of CNI
	NoDirectIO bool
	Windows    bool
	// Firecracker runs the VM under Firecracker instead of cloud-hypervisor (OCI images only).
	Firecracker bool
	// SharedMemory shares the VM's RAM (cloud-hypervisor memory shared=on), which vm fs attach
	// needs; only where Capabilities.FsAttach (v0.5), and not with Firecracker.
	SharedMemory bool
}

func (o CreateOptions) args() []string {
	args := []string{"--name", o.Name,
		"--cpu", strconv.Itoa(o.CPU),
		"--memory", strconv.FormatInt(o.Memory, 10),
		"--storage", strconv.FormatInt(o.Storage, 10),
		"--nics", strconv.Itoa(o.NICs)}
	args = appendIf(args, o.Network != "", "--network", o.Network)
	args = appendIf(args, o.Bridge != "", "--bridge", o.Bridge)
	args = appendIf(args, o.NoDirectIO, "--no-direct-io")
	args = appendIf(args, o.Windows, "--windows")
	args = appendIf(args, o.Firecracker, "--fc")
	args = appendIf(args, o.SharedMemory, "--shared-memory")
	return args
}

// CloneOptions are the flags of vm clone. Zero values inherit from the snapshot, as in cocoon.
type CloneOptions struct {
	Name string // required: cocoon v0.3.8 fails without it
	// CPU, Memory and Storage resize the clone where cocoon can (Capabilities.CloneResize);
	// elsewhere a clone has its snapshot's size and they are not passed.
	CPU        int
	Memory     int64
	Storage    int64
	NICs       int
	Network    string
	Bridge     string
	NoDirectIO bool
	// OnDemand restores memory lazily (cloud-hypervisor only): the source snapshot must stay on
	// disk for as long as the clone lives. --restore-mode ondemand or --on-demand, whichever this
	// cocoon has.
	OnDemand bool
	// CopyMemory copies the snapshot's memory into the clone (--restore-mode copy where cocoon
	// has the flag, whose default maps the memory file), so the snapshot may go at once. v0.3.8
	// copies by default.
	CopyMemory bool
	// Pull fetches the snapshot's base image by its recorded digest when it is missing.
	Pull bool
	// FromDir: the snapshot is a directory (snapshot export --to-dir's), cloned with --from-dir
	// without being imported, and only read. Where Capabilities.SnapshotDirs.
	FromDir bool
}

func (o CloneOptions) args(caps Capabilities) []string {
	args := []string{"--name", o.Name}
	if caps.CloneResize {
		args = appendIf(args, o.CPU > 0, "--cpu", strconv.Itoa(o.CPU))
		args = appendIf(args, o.Memory > 0, "--memory", strconv.FormatInt(o.Memory, 10))
		args = appendIf(args, o.Storage > 0, "--storage", strconv.FormatInt(o.Storage, 10))
	}
	args = appendIf(args, o.NICs > 0, "--nics", strconv.Itoa(o.NICs))
	args = appendIf(args, o.Network != "", "--network", o.Network)
	args = appendIf(args, o.Bridge != "", "--bridge", o.Bridge)
	args = appendIf(args, o.NoDirectIO, "--no-direct-io")
	switch {
	case o.OnDemand && caps.CloneRestoreMode:
		args = append(args, "--restore-mode", "ondemand")
	case o.OnDemand && caps.CloneOnDemand:
		args = append(args, "--on-demand")
	case o.CopyMemory && caps.CloneRestoreMode:
		args = append(args, "--restore-mode", "copy")
	}
	args = appendIf(args, o.Pull, "--pull")
	return args
}

func appendIf(args []string, cond bool, more ...string) []string {
	if cond {
		return append(args, more...)
	}
	return args
}

// VMCreate registers a VM from a local image without starting it (state created).
func (c *Client) VMCreate(ctx context.Context, image string, o CreateOptions) (*VM, error) {
	return query[VM](ctx, c, append(append([]string{"vm", "create"}, o.args()...), "-o", "json", image)...)
}

// VMRun creates and starts a VM from a local image. If the start fails cocoon leaves the record in
// state error; the caller removes it.
func (c *Client) VMRun(ctx context.Context, image string, o CreateOptions) (*VM, error) {
	vm, err := query[VM](ctx, c, append(append([]string{"vm", "run"}, o.args()...), "-o", "json", image)...)
	return c.settled(ctx, vm, err)
}

// VMClone creates a running VM from a local snapshot, or from a snapshot directory (FromDir).
func (c *Client) VMClone(ctx context.Context, snapshot string, o CloneOptions) (*VM, error) {
	if o.Name == "" {
		// cocoon v0.3.8 validates the name before applying its documented default.
		return nil, fmt.Errorf("clone %s: a VM name is required: %w", snapshot, ErrInvalid)
	}
	caps, err := c.Capabilities(ctx)
	if err != nil {
		return nil, fmt.Errorf("clone %s: %w", snapshot, err)
	}
	args := append(append([]string{"vm", "clone"}, o.args(caps)...), "-o", "json")
	if o.FromDir {
		args = append(args, "--from-dir", snapshot)
	} else {
		args = append(args, snapshot)
	}
	vm, err := query[VM](ctx, c, args...)
	return c.settled(ctx, vm, err)
}

// settled returns the VM as inspect sees it when the lifecycle output cannot be trusted: clone
// always prints pid 0, and run prints the pre-start record when its own re-inspect failed.
func (c *Client) settled(ctx context.Context, vm *VM, err error) (*VM, error) {
	if err != nil || (vm.State == VMStateRunning && vm.PID > 0) {
		return vm, err
	}
	return c.VMInspect(ctx, vm.ID)
}

// VMStart starts a created or stopped VM; a running VM is a success. cocoon first recreates a
// missing netns and CNI setup from the persisted MAC and IP.
func (c *Client) VMStart(ctx context.Context, id string) error {
	_, err := c.run(ctx, call{args: []string{"vm", "start", id}})
	return err
}

// StopOptions are the flags of vm stop.
type StopOptions struct {
	// Force skips the graceful shutdown (ACPI power button for UEFI guests).
	Force bool
	// Timeout is the graceful shutdown budget; 0 uses cocoon's configured default (30 s).
	Timeout time.Duration
}

// escalation is what cocoon spends after the graceful budget: SIGTERM, 5 s, SIGKILL, bookkeeping.
const escalation = 15 * time.Second

// VMStop stops a VM; stopping a VM that is not running succeeds.
func (c *Client) VMStop(ctx context.Context, id string, o StopOptions) error {
	args := []string{"vm", "stop"}
	args = appendIf(args, o.Force, "--force")
	budget := 30 * time.Second
	if o.Timeout > 0 {
		secs := int(math.Ceil(o.Timeout.Seconds()))
		args = append(args, "--timeout", strconv.Itoa(secs))
		budget = time.Duration(secs) * time.Second
	}
	args = append(args, id)
	_, err := c.run(ctx, call{args: args, timeout: budget + escalation + c.opts.Timeout, long: true})
	return err
}

// VMRemove deletes a VM, its run and log dirs and its network (CNI DEL, netns). force also stops a
// running VM. A missing VM is an ErrNotFound error, not a success: cocoon exits 1.
func (c *Client) VMRemove(ctx context.Context, id string, force bool) error {
	args := appendIf([]string{"vm", "rm"}, force, "--force")
	_, err := c.run(ctx, call{args: append(args, id)})
	return err
}

// reseedTimeout bounds vm reseed: cocoon tries the agent three times, 4 s each, 2 s apart.
const reseedTimeout = 30 * time.Second

// VMReseed gives a running VM's guest fresh entropy through its agent and, with machineID, a new
// /etc/machine-id (v0.5; see Capabilities.ReseedMachineID).
func (c *Client) VMReseed(ctx context.Context, id string, machineID bool) error {
	args := appendIf([]string{"vm", "reseed"}, machineID, "--machine-id")
	_, err := c.run(ctx, call{args: append(args, id), timeout: reseedTimeout})
	return err
}

// VMDiskAttach hot-adds a raw file or block device to a running cloud-hypervisor VM as a data
// disk whose serial is name: the guest finds it at /dev/disk/by-id/virtio-<name>.
func (c *Client) VMDiskAttach(ctx context.Context, id, path, name string, readonly bool) error {
	args := appendIf([]string{"vm", "disk", "attach", "--path", path, "--name", name}, readonly, "--readonly")
	_, err := c.run(ctx, call{args: append(args, id)})
	return err
}

// VMDeviceAttach hot-adds the PCI device at bdf, bound to vfio-pci on the host, to a running
// cloud-hypervisor VM as device id. It stays until the VM stops.
func (c *Client) VMDeviceAttach(ctx context.Context, vm, bdf, id string) error {
	_, err := c.run(ctx, call{args: []string{"vm", "device", "attach", "--pci", bdf, "--id", id, vm}})
	return err
}

// VMFsAttach hot-adds a vhost-user-fs share, served by the virtiofsd listening on socket (an
// absolute path), to a running cloud-hypervisor VM created with SharedMemory; the guest mounts it
// with mount -t virtiofs <tag> <dir>. It stays until detached or the VM stops.
func (c *Client) VMFsAttach(ctx context.Context, vm, socket, tag string) error {
	_, err := c.run(ctx, call{args: []string{"vm", "fs", "attach", "--socket", socket, "--tag", tag, vm}})
	return err
}

// VMFsDetach removes the share attached with tag from a running VM.
func (c *Client) VMFsDetach(ctx context.Context, vm, tag string) error {
	_, err := c.run(ctx, call{args: []string{"vm", "fs", "detach", "--tag", tag, vm}})
	return err
}

// VMInspect returns one VM with its state reconciled against the hypervisor process ("stopped
// (stale)" when the record says running but the process is gone).
func (c *Client) VMInspect(ctx context.Context, ref string) (*VM, error) {
	return query[VM](ctx, c, "vm", "inspect", ref)
}

// VMList returns every VM. On v0.3.8 states are the raw records (a dead hypervisor still shows
// "running"); v0.5 reconciles them as vm inspect does.
func (c *Client) VMList(ctx context.Context) ([]VM, error) {
	return queryList[VM](ctx, c, "vm", "list")
}

// VMHibernate saves a running VM into the snapshot name (memory and disk, owned by the VM) and
// ends its hypervisor, in one pause: the VM is then stopped and its memory released. A save that
// fails (a full disk) leaves the VM running and the call failed; cocoon refuses a VM with
// hot-attached disks or shares (ErrInUse), and a backend without hibernation.
func (c *Client) VMHibernate(ctx context.Context, vm, name string) error {
	_, err := c.run(ctx, call{args: []string{"vm", "hibernate", "--name", name, vm}, timeout: transferTimeout, long: true})
	return err
}

// VMRestore resumes a VM from one of its own snapshots in a new hypervisor process: the same VM ID,
// network namespace, MAC and IP, the guest's memory and processes as saved. The memory is copied
// (--restore-mode copy where cocoon has the flag: its default maps a plain snapshot's memory file,
// which must then stay), so the snapshot may be removed afterwards.
func (c *Client) VMRestore(ctx context.Context, vm, snapshot string) error {
	caps, err := c.Capabilities(ctx)
	if err != nil {
		return fmt.Errorf("restore %s: %w", vm, err)
	}
	args := appendIf([]string{"vm", "restore"}, caps.RestoreMode, "--restore-mode", "copy")
	_, err = c.run(ctx, call{args: append(args, vm, snapshot), timeout: transferTimeout, long: true})
	return err
}

// StopsAtOnce says that vm stop ends a VM at once, whatever the timeout: cocoon presses no power
// button for a direct-boot guest (an OCI VM image) under cloud-hypervisor, so a graceful stop must
// ask the guest itself. A UEFI guest gets the ACPI power button and a Firecracker one
// Ctrl-Alt-Del, with the timeout to power off.
func StopsAtOnce(hypervisor string, directBoot bool) bool {
	return directBoot && hypervisor != HypervisorFirecracker
}
