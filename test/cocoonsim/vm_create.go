package cocoonsim

import (
	"context"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"time"

	"github.com/spf13/cobra"

	"github.com/cocoonstack/cocoon-cri/pkg/cocoon"
)

func (a *app) vmCreate(cmd *cobra.Command, args []string) error {
	vm, _, err := a.createVM(cmd, args[0])
	if err != nil {
		return err
	}
	if wantJSON(cmd) {
		return outputJSON(cmd.OutOrStdout(), vm)
	}
	logger := a.log.with("cmd.vm.create")
	logger.Infof("VM created: %s (name: %s, state: %s)", vm.ID, vm.Config.Name, vm.State)
	logger.Infof("start with: cocoon vm start %s", vm.ID)
	return nil
}

// vmRun is create + start. A failed start leaves the record in state "error". With -o json it
// prints the re-inspected VM, or the pre-start record if that inspect fails.
func (a *app) vmRun(cmd *cobra.Command, args []string) error {
	vm, b, err := a.createVM(cmd, args[0])
	if err != nil {
		return err
	}
	logger := a.log.with("cmd.vm.run")
	jsonOut := wantJSON(cmd)
	if !jsonOut {
		logger.Infof("VM created: %s (name: %s)", vm.ID, vm.Config.Name)
	}
	started, err := b.start(cmd.Context(), []string{vm.ID})
	if err != nil {
		return fmt.Errorf("start VM %s: %w", vm.ID, err)
	}
	if jsonOut {
		info, inspectErr := b.inspect(cmd.Context(), vm.ID)
		if inspectErr != nil {
			logger.Warnf("inspect after start failed: %v (json payload may be stale)", inspectErr)
		} else {
			vm = info
		}
		return outputJSON(cmd.OutOrStdout(), vm)
	}
	for _, id := range started {
		logger.Infof("started: %s", id)
	}
	return nil
}

// createVM is cocoon's createVM: validate flags, resolve the local image (no pull), set up the
// network, then create the VM record and its disks in state "created".
func (a *app) createVM(cmd *cobra.Command, image string) (*cocoon.VM, *backend, error) {
	useFC, _ := cmd.Flags().GetBool("fc")
	spec, err := vmSpecFromFlags(cmd, image)
	if err != nil {
		return nil, nil, err
	}
	if useFC && spec.Windows {
		return nil, nil, fmt.Errorf("--fc and --windows are mutually exclusive: Firecracker does not support Windows guests")
	}
	if useFC && spec.SharedMemory {
		return nil, nil, fmt.Errorf("--fc and --shared-memory are mutually exclusive: Firecracker does not support vhost-user-fs hot-plug")
	}
	bridgeDev, _ := cmd.Flags().GetString("bridge")
	if bridgeDev != "" && spec.Network != "" {
		return nil, nil, fmt.Errorf("--bridge and --network are mutually exclusive")
	}
	oci, cloudimg, err := a.imageBackends()
	if err != nil {
		return nil, nil, err
	}
	kind := kindCH
	if useFC {
		kind = kindFC
	}
	b, err := newBackend(a.conf, a.log, kind)
	if err != nil {
		return nil, nil, fmt.Errorf("init hypervisor: %w", err)
	}
	storage, boot, err := resolveImage(cmd.Context(), oci, cloudimg, spec)
	if err != nil {
		return nil, nil, err
	}
	if spec.Windows && boot.directBoot() {
		return nil, nil, fmt.Errorf("--windows requires cloudimg (UEFI boot), got OCI direct boot image")
	}
	if useFC && !boot.directBoot() {
		return nil, nil, fmt.Errorf("--fc requires OCI images (direct kernel boot): Firecracker does not support UEFI/cloudimg boot")
	}
	vmID := generateID()
	nics, _ := cmd.Flags().GetInt("nics")
	provider, nets, err := a.initNetwork(cmd.Context(), vmID, nics, &spec.VMConfig, kind.tapQueues(), bridgeDev)
	if err != nil {
		return nil, nil, err
	}
	vm, err := b.create(cmd.Context(), vmID, spec, storage, nets, boot)
	if err != nil {
		a.rollbackNetwork(cmd.Context(), provider, vmID)
		return nil, nil, fmt.Errorf("create VM: %w", err)
	}
	return vm, b, nil
}

// resolveImage asks each image backend for the image; exactly one must have it.
func resolveImage(ctx context.Context, oci *ociStore, cloudimg *cloudimgStore, spec *vmSpec) ([]*cocoon.StorageConfig, *bootConfig, error) {
	type resolver struct {
		typ    string
		config func(context.Context, *vmSpec) ([]*cocoon.StorageConfig, *bootConfig, error)
	}
	var owner string
	var storage []*cocoon.StorageConfig
	var boot *bootConfig
	var errs []string
	for _, r := range []resolver{{cocoon.ImageTypeOCI, oci.config}, {cocoon.ImageTypeCloudImg, cloudimg.config}} {
		s, bc, err := r.config(ctx, spec)
		if err != nil {
			errs = append(errs, fmt.Sprintf("%s: %v", r.typ, err))
			continue
		}
		if owner != "" {
			return nil, nil, fmt.Errorf("image %s: %w (matched both %s and %s)", spec.Image, errImageAmbiguous, owner, r.typ)
		}
		owner, storage, boot = r.typ, s, bc
	}
	if owner == "" {
		return nil, nil, fmt.Errorf("image %q not resolved: %s", spec.Image, strings.Join(errs, "; "))
	}
	return storage, boot, nil
}

// create reserves the record, prepares the disks and leaves the VM "created" (cocoon's CH
// Create). Any failure removes the placeholder and the VM's directories again.
func (b *backend) create(ctx context.Context, id string, spec *vmSpec, storage []*cocoon.StorageConfig, nets []*cocoon.NetworkConfig, boot *bootConfig) (_ *cocoon.VM, err error) {
	if err := validateHostCPU(spec.CPU); err != nil {
		return nil, err
	}
	now := time.Now()
	runDir, logDir := b.vmRunDir(id), b.vmLogDir(id)
	blobIDs := extractBlobIDs(storage, boot)
	defer func() {
		if err != nil {
			_ = os.RemoveAll(runDir)
			_ = os.RemoveAll(logDir)
			b.rollbackCreate(ctx, id, spec.Name)
		}
	}()
	if err = b.reserveVM(ctx, id, spec.VMConfig, blobIDs, runDir, logDir); err != nil {
		return nil, fmt.Errorf("reserve VM record: %w", err)
	}
	if err = ensureDirs(runDir, logDir); err != nil {
		return nil, fmt.Errorf("ensure dirs: %w", err)
	}
	bootCopy := *boot
	var prepared []*cocoon.StorageConfig
	if bootCopy.directBoot() {
		prepared, err = b.prepareOCI(ctx, runDir, spec, storage, nets, &bootCopy)
	} else {
		prepared, err = b.prepareCloudimg(ctx, id, runDir, spec, storage, nets)
	}
	if err != nil {
		return nil, err
	}
	if err = validateStorageConfigs(prepared); err != nil {
		return nil, fmt.Errorf("storage invariants violated: %w", err)
	}
	// The image's own storage, not the prepared disks: a cloud image VM's base qcow2 is only
	// the backing file of its overlay.
	if err = installGuestSpec(runDir, storage); err != nil {
		return nil, err
	}
	vm := &cocoon.VM{
		ID: id, Hypervisor: b.kind.typ, State: cocoon.VMStateCreated,
		Config: spec.VMConfig, StorageConfigs: prepared, NetworkConfigs: nets,
		CreatedAt: now, UpdatedAt: now,
	}
	if err = b.finalizeCreate(ctx, id, vm, &bootCopy, blobIDs); err != nil {
		return nil, fmt.Errorf("finalize VM record: %w", err)
	}
	return vm, nil
}

// prepareOCI creates the ext4 COW disk (a sparse cow.raw of the storage size) and the kernel
// command line of a direct-boot VM.
func (b *backend) prepareOCI(ctx context.Context, runDir string, spec *vmSpec, layers []*cocoon.StorageConfig, nets []*cocoon.NetworkConfig, boot *bootConfig) ([]*cocoon.StorageConfig, error) {
	cowPath := filepath.Join(runDir, cowRawFile)
	if err := createSparseFile(cowPath, spec.Storage); err != nil {
		return nil, err
	}
	if err := mkfsExt4(ctx, cowPath); err != nil {
		return nil, err
	}
	storage := append(slices.Clone(layers), &cocoon.StorageConfig{Path: cowPath, Serial: cowSerial, Role: cocoon.StorageRoleCOW})
	dataDisks, err := prepareDataDisks(ctx, runDir, spec.DataDisks)
	if err != nil {
		return nil, err
	}
	storage = append(storage, dataDisks...)
	dns, err := b.conf.dnsServers()
	if err != nil {
		return nil, fmt.Errorf("parse DNS servers: %w", err)
	}
	boot.Cmdline = b.buildCmdline(storage, nets, spec.Name, dns)
	return storage, nil
}

// prepareCloudimg creates the qcow2 overlay on the base image and, except for Windows, the
// cloud-init seed.
func (b *backend) prepareCloudimg(ctx context.Context, id, runDir string, spec *vmSpec, base []*cocoon.StorageConfig, nets []*cocoon.NetworkConfig) ([]*cocoon.StorageConfig, error) {
	if len(base) == 0 {
		return nil, fmt.Errorf("cloudimg: no base image StorageConfig")
	}
	overlay := filepath.Join(runDir, overlayFile)
	if err := qemuImgCreateOverlay(ctx, base[0].Path, overlay); err != nil {
		return nil, err
	}
	if spec.Storage > 0 {
		if err := expandImage(ctx, overlay, spec.Storage, false); err != nil {
			return nil, fmt.Errorf("expand overlay: %w", err)
		}
	}
	dataDisks, err := prepareDataDisks(ctx, runDir, spec.DataDisks)
	if err != nil {
		return nil, err
	}
	storage := append([]*cocoon.StorageConfig{{Path: overlay, Role: cocoon.StorageRoleCOW}}, dataDisks...)
	if spec.Windows {
		return storage, nil
	}
	dns, err := b.conf.dnsServers()
	if err != nil {
		return nil, fmt.Errorf("parse DNS servers: %w", err)
	}
	cidata := filepath.Join(runDir, cidataFile)
	if err := writeCidata(cidata, id, spec, dns, nets, storage); err != nil {
		return nil, err
	}
	return append(storage, &cocoon.StorageConfig{Path: cidata, RO: true, Role: cocoon.StorageRoleCidata}), nil
}

// buildCmdline is the direct-boot kernel command line cocoon passes to the guest.
// Cloud-hypervisor names the disks by virtio-blk serial, Firecracker by position.
func (b *backend) buildCmdline(storage []*cocoon.StorageConfig, nets []*cocoon.NetworkConfig, vmName string, dns []string) string {
	var cmdline strings.Builder
	if b.kind == kindFC {
		layers, cow := fcDiskNames(storage)
		fmt.Fprintf(&cmdline, "%s boot=cocoon-overlay cocoon.layers=%s cocoon.cow=%s clocksource=kvm-clock rw", fcCmdlineHead, strings.Join(layers, ","), cow)
	} else {
		var layers []string
		for _, s := range storage {
			if s.Role == cocoon.StorageRoleLayer {
				layers = append(layers, s.Serial)
			}
		}
		slices.Reverse(layers)
		fmt.Fprintf(&cmdline, "console=hvc0 loglevel=3 boot=cocoon-overlay cocoon.layers=%s cocoon.cow=%s clocksource=kvm-clock rw",
			strings.Join(layers, ","), cowSerial)
	}
	if len(nets) == 0 {
		return cmdline.String()
	}
	cmdline.WriteString(" net.ifnames=0")
	fmt.Fprintf(&cmdline, " cocoon.hostname=%s", vmName)
	for i, n := range nets {
		if n.Network == nil || n.Network.IP == "" {
			continue
		}
		mask := net.IP(net.CIDRMask(n.Network.Prefix, 32)).String()
		param := fmt.Sprintf(" ip=%s::%s:%s:%s:eth%d:off", n.Network.IP, n.Network.Gateway, mask, vmName, i)
		if len(dns) > 0 {
			param += ":" + dns[0]
			if len(dns) > 1 {
				param += ":" + dns[1]
			}
		}
		cmdline.WriteString(param)
	}
	return cmdline.String()
}

// extractBlobIDs lists the image blobs a VM pins against garbage collection.
func extractBlobIDs(storage []*cocoon.StorageConfig, boot *bootConfig) map[string]struct{} {
	ids := map[string]struct{}{}
	blobHex := func(path string) string {
		base := filepath.Base(path)
		return strings.TrimSuffix(base, filepath.Ext(base))
	}
	switch {
	case boot.directBoot():
		for _, s := range storage {
			if s.Role == cocoon.StorageRoleLayer {
				ids[blobHex(s.Path)] = struct{}{}
			}
		}
		ids[filepath.Base(filepath.Dir(boot.KernelPath))] = struct{}{}
		if boot.InitrdPath != "" {
			ids[filepath.Base(filepath.Dir(boot.InitrdPath))] = struct{}{}
		}
	case len(storage) > 0:
		ids[blobHex(storage[0].Path)] = struct{}{}
	}
	return ids
}
