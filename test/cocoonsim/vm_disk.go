package cocoonsim

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"path/filepath"
	"strings"

	"github.com/spf13/cobra"

	"github.com/cocoonstack/cocoon-cri/pkg/cocoon"
	"github.com/cocoonstack/cocoon-cri/test/cocoonsim/guest"
)

// cocoon v0.5's `vm disk attach|detach` (cmd/vm/disk.go, extend/disk/disk.go,
// hypervisor/cloudhypervisor/extend.go): a raw file hot-added to a running Cloud Hypervisor VM as
// a data disk whose serial is its name, so the guest finds it at /dev/disk/by-id/virtio-<name>.
// cocoon never deletes the file. Firecracker VMs boot on MMIO here, which takes no hot-plug.

// diskNameRE is the rule for a disk name: the guest serial, which Linux cuts at 20 bytes.
var diskNameRE = lazyRegexp(`^[a-z][a-z0-9_-]{0,19}$`)

// diskIDPrefix makes a disk's CH device ID from its name: the detach key.
const diskIDPrefix = "cocoon-disk-"

func (a *app) diskCommand() *cobra.Command {
	diskCmd := &cobra.Command{Use: "disk", Short: "Hot-attach/detach raw data disks (CH only)"}
	attach := &cobra.Command{Use: "attach VM", Short: "Hot-attach a raw disk file to a running VM", Args: cobra.ExactArgs(1), RunE: a.diskAttach}
	attach.Flags().String("path", "", "absolute path to an existing raw disk file (required; never deleted by cocoon)")
	attach.Flags().String("name", "", "disk name: guest /dev/disk/by-id/virtio-<name> and the detach key (required)")
	attach.Flags().Bool("readonly", false, "attach read-only")
	attach.Flags().String("directio", "auto", "O_DIRECT for the disk: on, off or auto")
	attach.Flags().StringP("output", "o", "", "output format: json")
	_ = attach.MarkFlagRequired("path")
	_ = attach.MarkFlagRequired("name")
	detach := &cobra.Command{Use: "detach VM", Short: "Hot-detach a disk by name", Args: cobra.ExactArgs(1), RunE: a.diskDetach}
	detach.Flags().String("name", "", "disk name given at attach (required)")
	detach.Flags().StringP("output", "o", "", "output format: json")
	_ = detach.MarkFlagRequired("name")
	diskCmd.AddCommand(attach, detach)
	return diskCmd
}

// attachedDevices is inspect's attached_devices.
type attachedDevices struct {
	Fs      []attachedFs        `json:"fs,omitempty"`
	Devices []attachedPCIDevice `json:"devices,omitempty"`
	Disks   []attachedDisk      `json:"disks,omitempty"`
}

// attachedDisk is a hot-attached disk as `vm inspect` lists it under attached_devices.disks.
type attachedDisk struct {
	ID       string `json:"id"`
	Name     string `json:"name"`
	Path     string `json:"path"`
	ReadOnly bool   `json:"readonly,omitempty"`
}

func (a *app) diskAttach(cmd *cobra.Command, args []string) error {
	ctx := cmd.Context()
	owner, vm, err := a.resolveAttachTarget(ctx, "disk attach", args[0])
	if err != nil {
		return err
	}
	path, _ := cmd.Flags().GetString("path")
	name, _ := cmd.Flags().GetString("name")
	readonly, _ := cmd.Flags().GetBool("readonly")
	directIO, _ := cmd.Flags().GetString("directio")
	if directIO != "on" && directIO != "off" && directIO != "auto" {
		return fmt.Errorf("directio must be on/off/auto, got %q", directIO)
	}
	if err := validateDiskSpec(path, name); err != nil {
		return err
	}
	resolved, err := filepath.EvalSymlinks(path)
	if err != nil {
		return fmt.Errorf("disk path: %w", err)
	}
	for _, dir := range []string{a.conf.RootDir, a.conf.RunDir, a.conf.LogDir} {
		if dir != "" && (resolved == dir || strings.HasPrefix(resolved, strings.TrimSuffix(dir, "/")+"/")) {
			return fmt.Errorf("external volume path %s is inside a cocoon-managed directory", path)
		}
	}
	if vm.State != cocoon.VMStateRunning {
		return fmt.Errorf("vm is not running: vm %s is %s: %w", vm.ID, vm.State, errNotRunning)
	}
	if owner.kind == kindFC {
		return fmt.Errorf("vm %s boots on the MMIO transport (created without --pci): backend does not support disk attach", vm.ID)
	}
	hc := newCHClient(vm.SocketPath)
	info, err := hc.info(ctx)
	if err != nil {
		return fmt.Errorf("vm.info: %w", err)
	}
	id := diskIDPrefix + name
	for _, d := range info.Config.Disks {
		switch {
		case d.ID == id:
			return fmt.Errorf("disk name %q already attached", name)
		case d.Serial == name:
			return fmt.Errorf("disk serial %q already used by disk %q", name, d.ID)
		case d.Path == resolved:
			return fmt.Errorf("disk path %q already attached as %q", resolved, d.ID)
		}
	}
	disk := guest.Disk{ID: id, Path: resolved, ReadOnly: readonly, Serial: name, ImageType: "Raw",
		NumQueues: info.Config.CPUs.BootVCPUs, QueueSize: 512, Sparse: !readonly,
		DirectIO: directIO == "on" || (directIO == "auto" && !readonly)}
	if err := hc.addDisk(ctx, disk); err != nil {
		return fmt.Errorf("vm.add-disk: %w", err)
	}
	return a.attachResult(cmd, "cmd.vm.disk", map[string]string{"vm": args[0], "name": name, "id": id}, "attached disk name=%s id=%s vm=%s", name, id, args[0])
}

func (a *app) diskDetach(cmd *cobra.Command, args []string) error {
	ctx := cmd.Context()
	_, vm, err := a.resolveAttachTarget(ctx, "disk detach", args[0])
	if err != nil {
		return err
	}
	name, _ := cmd.Flags().GetString("name")
	if name == "" {
		return errors.New("name is required")
	}
	if vm.State != cocoon.VMStateRunning {
		return fmt.Errorf("vm is not running: vm %s is %s: %w", vm.ID, vm.State, errNotRunning)
	}
	hc := newCHClient(vm.SocketPath)
	info, err := hc.info(ctx)
	if err != nil {
		return fmt.Errorf("vm.info: %w", err)
	}
	id := diskIDPrefix + name
	if !hasDisk(info.Config.Disks, id) {
		return fmt.Errorf("disk %q not attached", name)
	}
	if err := hc.removeDevice(ctx, id); err != nil {
		return fmt.Errorf("vm.remove-device %s: %w", id, err)
	}
	return a.attachResult(cmd, "cmd.vm.disk", map[string]string{"vm": args[0], "name": name}, "detached disk name=%s vm=%s", name, args[0])
}

func hasDisk(disks []guest.Disk, id string) bool {
	for _, d := range disks {
		if d.ID == id {
			return true
		}
	}
	return false
}

// resolveAttachTarget finds the VM an attach or detach names.
func (a *app) resolveAttachTarget(ctx context.Context, op, ref string) (*backend, *cocoon.VM, error) {
	backends, err := allBackends(a.conf, a.log)
	if err != nil {
		return nil, nil, err
	}
	owner, err := resolveVMOwner(ctx, backends, ref)
	if err != nil {
		return nil, nil, fmt.Errorf("%s: %w", op, err)
	}
	vm, err := owner.inspect(ctx, ref)
	if err != nil {
		return nil, nil, fmt.Errorf("%s: %w", op, err)
	}
	vm.State = reconcileState(vm)
	return owner, vm, nil
}

// validateDiskSpec is cocoon's disk.Spec normalisation, before the VM is looked at.
func validateDiskSpec(path, name string) error {
	switch {
	case path == "":
		return errors.New("path is required")
	case !filepath.IsAbs(path):
		return fmt.Errorf("path must be absolute, got %q", path)
	case name == "":
		return errors.New("name is required")
	case !diskNameRE().MatchString(name) || strings.HasPrefix(name, "cocoon-"):
		return fmt.Errorf("name %q invalid: must match %s", name, diskNameRE())
	}
	return nil
}

// attachResult prints what an attach or detach did: JSON with -o json, a log line otherwise.
func (a *app) attachResult(cmd *cobra.Command, logName string, result map[string]string, format string, args ...any) error {
	if out, _ := cmd.Flags().GetString("output"); out == "json" {
		return outputJSON(cmd.OutOrStdout(), result)
	}
	a.log.with(logName).Infof(format, args...)
	return nil
}

// attachedDisks are the running VM's hot-attached disks, as inspect shows them.
func attachedDisks(ctx context.Context, vm *cocoon.VM) []attachedDisk {
	info := runningCHInfo(ctx, vm)
	if info == nil {
		return nil
	}
	var disks []attachedDisk
	for _, d := range info.Config.Disks {
		if name, ok := strings.CutPrefix(d.ID, diskIDPrefix); ok && diskNameRE().MatchString(name) {
			disks = append(disks, attachedDisk{ID: d.ID, Name: name, Path: d.Path, ReadOnly: d.ReadOnly})
		}
	}
	return disks
}

// runningCHInfo is vm.info of a running cloud-hypervisor VM, nil for any other.
func runningCHInfo(ctx context.Context, vm *cocoon.VM) *chInfo {
	if vm.State != cocoon.VMStateRunning || vm.SocketPath == "" || vm.Hypervisor == cocoon.HypervisorFirecracker {
		return nil
	}
	info, err := newCHClient(vm.SocketPath).info(ctx)
	if err != nil {
		return nil
	}
	return info
}

// chInfo is the part of cloud-hypervisor's vm.info read here.
type chInfo struct {
	Config guest.VMConfig `json:"config"`
	State  string         `json:"state"`
}

func (c *chClient) info(ctx context.Context) (*chInfo, error) {
	body, err := c.do(ctx, http.MethodGet, "vm.info", nil, http.StatusOK)
	if err != nil {
		return nil, err
	}
	var info chInfo
	if err := json.Unmarshal(body, &info); err != nil {
		return nil, fmt.Errorf("decode vm.info: %w", err)
	}
	return &info, nil
}
