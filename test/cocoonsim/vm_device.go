package cocoonsim

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strings"

	"github.com/spf13/cobra"

	"github.com/cocoonstack/cocoon-cri/pkg/cocoon"
	"github.com/cocoonstack/cocoon-cri/test/cocoonsim/guest"
)

// cocoon v0.5's `vm device attach|detach` (cmd/vm/attach.go, extend/vfio/vfio.go,
// hypervisor/cloudhypervisor/extend.go): a host PCI device, bound to vfio-pci by the user, passed
// through to a running Cloud Hypervisor VM. It lasts until the VM stops. The host's sysfs is
// guest.SysfsEnv's directory when set.

var (
	bdfShortRE = lazyRegexp(`^[0-9a-f]{2}:[0-9a-f]{2}\.[0-7]$`)
	bdfFullRE  = lazyRegexp(`^[0-9a-f]{4}:[0-9a-f]{2}:[0-9a-f]{2}\.[0-7]$`)
	// deviceIDRE is cloud-hypervisor's rule for a device ID; cocoon keeps cocoon- for itself.
	deviceIDRE = lazyRegexp(`^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}$`)
)

func (a *app) deviceCommand() *cobra.Command {
	deviceCmd := &cobra.Command{Use: "device", Short: "Attach/detach a VFIO PCI passthrough device to a running VM (CH only)"}
	attach := &cobra.Command{Use: "attach VM", Short: "Attach a VFIO PCI device to a running VM", Args: cobra.ExactArgs(1), RunE: a.deviceAttach}
	attach.Flags().String("pci", "", "BDF (01:00.0 / 0000:01:00.0) or sysfs path /sys/bus/pci/devices/<bdf>")
	attach.Flags().String("id", "", "optional device id; CH auto-generates if empty (must not start with cocoon-)")
	attach.Flags().StringP("output", "o", "", "output format: json")
	_ = attach.MarkFlagRequired("pci")
	detach := &cobra.Command{Use: "detach VM", Short: "Detach a VFIO PCI device from a running VM", Args: cobra.ExactArgs(1), RunE: a.deviceDetach}
	detach.Flags().String("id", "", "device id returned by attach (required)")
	detach.Flags().StringP("output", "o", "", "output format: json")
	_ = detach.MarkFlagRequired("id")
	deviceCmd.AddCommand(attach, detach)
	return deviceCmd
}

// attachedPCIDevice is a passed-through device as `vm inspect` lists it under
// attached_devices.devices.
type attachedPCIDevice struct {
	ID  string `json:"id"`
	BDF string `json:"bdf,omitempty"`
}

func (a *app) deviceAttach(cmd *cobra.Command, args []string) error {
	ctx := cmd.Context()
	vm, err := a.chTarget(ctx, "device attach", args[0])
	if err != nil {
		return err
	}
	pci, _ := cmd.Flags().GetString("pci")
	id, _ := cmd.Flags().GetString("id")
	if id != "" && (strings.HasPrefix(id, "cocoon-") || !deviceIDRE().MatchString(id)) {
		return fmt.Errorf("id %q invalid: must match [A-Za-z0-9][A-Za-z0-9_.-]{0,63} and not start with cocoon-", id)
	}
	path, err := normalizePCIPath(pci)
	if err != nil {
		return err
	}
	hc, err := runningCH(vm)
	if err != nil {
		return err
	}
	switch st, err := os.Stat(guest.HostSysfsPath(path)); {
	case err != nil:
		var pathErr *fs.PathError
		if errors.As(err, &pathErr) {
			err = pathErr.Err
		}
		return fmt.Errorf("pci path %s: %w", path, err)
	case !st.IsDir():
		return fmt.Errorf("pci path %s: not a directory", path)
	}
	info, err := hc.info(ctx)
	if err != nil {
		return fmt.Errorf("vm.info: %w", err)
	}
	for _, d := range info.Config.Devices {
		switch {
		case d.Path == path:
			return fmt.Errorf("device %s already attached (id=%s)", path, d.ID)
		case id != "" && d.ID == id:
			return fmt.Errorf("device id %q already in use", id)
		}
	}
	got, err := hc.addDevice(ctx, guest.Device{ID: id, Path: path})
	if err != nil {
		return fmt.Errorf("vm.add-device: %w", err)
	}
	return a.attachResult(cmd, "cmd.vm.device", map[string]string{"vm": args[0], "pci": pci, "id": got}, "attached device pci=%s id=%s vm=%s", pci, got, args[0])
}

func (a *app) deviceDetach(cmd *cobra.Command, args []string) error {
	ctx := cmd.Context()
	vm, err := a.chTarget(ctx, "device detach", args[0])
	if err != nil {
		return err
	}
	id, _ := cmd.Flags().GetString("id")
	if id == "" {
		return errors.New("id is required")
	}
	hc, err := runningCH(vm)
	if err != nil {
		return err
	}
	info, err := hc.info(ctx)
	if err != nil {
		return fmt.Errorf("vm.info: %w", err)
	}
	found := false
	for _, d := range info.Config.Devices {
		found = found || d.ID == id
	}
	if !found {
		return fmt.Errorf("device id %q not attached", id)
	}
	if err := hc.removeDevice(ctx, id); err != nil {
		return fmt.Errorf("vm.remove-device %s: %w", id, err)
	}
	return a.attachResult(cmd, "cmd.vm.device", map[string]string{"vm": args[0], "id": id}, "detached device id=%s vm=%s", id, args[0])
}

// chTarget is the cloud-hypervisor VM ref names: Firecracker takes no VFIO hot-plug.
func (a *app) chTarget(ctx context.Context, op, ref string) (*cocoon.VM, error) {
	owner, vm, err := a.resolveAttachTarget(ctx, op, ref)
	if err != nil {
		return nil, err
	}
	if owner.kind == kindFC {
		return nil, fmt.Errorf("%s: backend %s: backend does not support device attach", op, cocoon.HypervisorFirecracker)
	}
	return vm, nil
}

// runningCH is the API of a running cloud-hypervisor VM.
func runningCH(vm *cocoon.VM) (*chClient, error) {
	if vm.State != cocoon.VMStateRunning {
		return nil, fmt.Errorf("vm is not running: vm %s is %s: %w", vm.ID, vm.State, errNotRunning)
	}
	return newCHClient(vm.SocketPath), nil
}

// normalizePCIPath is cocoon's vfio.NormalizePath: a short or full BDF, or a sysfs path, becomes
// /sys/bus/pci/devices/<full BDF>.
func normalizePCIPath(input string) (string, error) {
	in := strings.TrimSpace(input)
	if in == "" {
		return "", errors.New("pci is required")
	}
	if strings.HasPrefix(in, "/") {
		bdf, ok := strings.CutPrefix(filepath.Clean(in), guest.SysfsPCIPrefix)
		if !ok {
			return "", fmt.Errorf("pci %q invalid: absolute path must be under %s", input, guest.SysfsPCIPrefix)
		}
		if bdf = strings.ToLower(bdf); !bdfFullRE().MatchString(bdf) {
			return "", fmt.Errorf("pci %q invalid: sysfs BDF suffix must match 0000:xx:yy.z", input)
		}
		return guest.SysfsPCIPrefix + bdf, nil
	}
	switch low := strings.ToLower(in); {
	case bdfFullRE().MatchString(low):
		return guest.SysfsPCIPrefix + low, nil
	case bdfShortRE().MatchString(low):
		return guest.SysfsPCIPrefix + "0000:" + low, nil
	}
	return "", fmt.Errorf("pci %q invalid: expect BDF (01:00.0 / 0000:01:00.0) or sysfs path", input)
}

// attachedPCIDevices are the running VM's passed-through devices, as inspect shows them.
func attachedPCIDevices(ctx context.Context, vm *cocoon.VM) []attachedPCIDevice {
	info := runningCHInfo(ctx, vm)
	if info == nil {
		return nil
	}
	var devs []attachedPCIDevice
	for _, d := range info.Config.Devices {
		devs = append(devs, attachedPCIDevice{ID: d.ID, BDF: strings.TrimPrefix(d.Path, guest.SysfsPCIPrefix)})
	}
	return devs
}
