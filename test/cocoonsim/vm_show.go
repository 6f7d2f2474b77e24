package cocoonsim

import (
	"context"
	"fmt"
	"io"
	"slices"
	"strings"
	"time"

	"github.com/spf13/cobra"

	"github.com/cocoonstack/cocoon-cri/pkg/cocoon"
)

// vmList prints every VM of both backends, oldest first. On v0.3.8, JSON output is not
// reconciled (a VM whose hypervisor died still shows "running"; the table shows "stopped
// (stale)") and no VMs is "No VMs found." even for JSON. v0.5 reconciles both and prints [].
func (a *app) vmList(cmd *cobra.Command, _ []string) error {
	backends, err := allBackends(a.conf, a.log)
	if err != nil {
		return err
	}
	vms, err := listAllVMs(cmd.Context(), backends)
	if err != nil {
		return fmt.Errorf("list: %w", err)
	}
	return a.printVMList(cmd, vms)
}

// printVMList is what vm list prints, and v0.5's one-shot vm status.
func (a *app) printVMList(cmd *cobra.Command, vms []*cocoon.VM) error {
	if format, _ := cmd.Flags().GetString("format"); format == "json" && a.profile.ListJSONReconciled {
		for _, vm := range vms {
			vm.State = reconcileState(vm)
		}
		if vms == nil {
			vms = []*cocoon.VM{}
		}
		return outputJSON(cmd.OutOrStdout(), vms)
	}
	if len(vms) == 0 {
		_, err := fmt.Fprintln(cmd.OutOrStdout(), "No VMs found.")
		return err
	}
	return outputFormatted(cmd, vms, func(w io.Writer) { printVMTable(w, vms) })
}

// vmInspect prints one VM with its reconciled state.
func (a *app) vmInspect(cmd *cobra.Command, args []string) error {
	backends, err := allBackends(a.conf, a.log)
	if err != nil {
		return err
	}
	owner, err := resolveVMOwner(cmd.Context(), backends, args[0])
	if err != nil {
		return fmt.Errorf("inspect: %w", err)
	}
	vm, err := owner.inspect(cmd.Context(), args[0])
	if err != nil {
		return fmt.Errorf("inspect: %w", err)
	}
	vm.State = reconcileState(vm)
	// Newer cocoon's inspect shows the agent's vsock socket; v0.3.8 has no such field.
	if !a.profile.Agent {
		return outputJSON(cmd.OutOrStdout(), vm)
	}
	vm.VsockSocket = vsockSocket(vm)
	// and, while it runs, what was hot-attached.
	out := struct {
		*cocoon.VM
		AttachedDevices *attachedDevices `json:"attached_devices,omitempty"`
	}{VM: vm}
	attached := attachedDevices{Fs: attachedFsDevices(cmd.Context(), vm), Devices: attachedPCIDevices(cmd.Context(), vm), Disks: attachedDisks(cmd.Context(), vm)}
	if len(attached.Fs)+len(attached.Devices)+len(attached.Disks) > 0 {
		out.AttachedDevices = &attached
	}
	return outputJSON(cmd.OutOrStdout(), out)
}

// listAllVMs lists both backends, sorted by creation time.
func listAllVMs(ctx context.Context, backends []*backend) ([]*cocoon.VM, error) {
	var all []*cocoon.VM
	for _, b := range backends {
		vms, err := b.list(ctx)
		if err != nil {
			return nil, fmt.Errorf("list %s: %w", b.kind.typ, err)
		}
		all = append(all, vms...)
	}
	slices.SortStableFunc(all, func(x, y *cocoon.VM) int { return x.CreatedAt.Compare(y.CreatedAt) })
	return all, nil
}

func printVMTable(w io.Writer, vms []*cocoon.VM) {
	fmt.Fprintln(w, "ID\tNAME\tSTATE\tCPU\tMEMORY\tSTORAGE\tIP\tIMAGE\tCREATED") //nolint:errcheck
	for _, vm := range vms {
		fmt.Fprintf(w, "%s\t%s\t%s\t%d\t%s\t%s\t%s\t%s\t%s\n", //nolint:errcheck
			vm.ID, vm.Config.Name, reconcileState(vm), vm.Config.CPU,
			bytesSize(vm.Config.Memory), bytesSize(vm.Config.Storage),
			vmIPs(vm), vm.Config.Image, vm.CreatedAt.Local().Format(time.DateTime))
	}
}

// vmIPs joins the static guest IPs, "-" when there are none.
func vmIPs(vm *cocoon.VM) string {
	var ips []string
	for _, nc := range vm.NetworkConfigs {
		if nc != nil && nc.Network != nil && nc.Network.IP != "" {
			ips = append(ips, nc.Network.IP)
		}
	}
	if len(ips) == 0 {
		return "-"
	}
	return strings.Join(ips, ",")
}
