package cocoonsim

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"time"

	"github.com/google/go-containerregistry/pkg/name"
	"github.com/spf13/cobra"

	"github.com/cocoonstack/cocoon-cri/pkg/cocoon"
	"github.com/cocoonstack/cocoon-cri/test/cocoonsim/guest"
)

// vmClone creates a VM from a local snapshot and leaves it running. -o json prints the new VM with
// state "running" and pid 0 (use vm inspect for the PID); without it, post-clone guest hints go to
// stdout.
func (a *app) vmClone(cmd *cobra.Command, args []string) error {
	ctx := cmd.Context()
	begun := time.Now()
	logger := a.log.with("cmd.vm.clone")
	fromDir, snapRef, err := snapshotSource(cmd, args)
	if err != nil {
		return err
	}
	var (
		dataDir, source string
		snap            *cocoon.SnapshotConfig
	)
	if fromDir != "" {
		// The directory is only read: concurrent clones of it are safe, and it stays the caller's.
		if snap, err = readSnapshotEnvelope(fromDir); err != nil {
			return fmt.Errorf("load envelope: %w", err)
		}
		if err := verifyFromDirCOW(fromDir, snap); err != nil {
			return err
		}
		dataDir, source = fromDir, "dir "+fromDir
	} else {
		if dataDir, snap, err = a.snapshotSourceDir(ctx, snapRef); err != nil {
			return err
		}
		source = "snapshot " + snapRef + " (direct)"
	}
	kind := kindCH
	if snap.Hypervisor == cocoon.HypervisorFirecracker {
		kind = kindFC
	}
	b, err := newBackend(a.conf, a.log, kind)
	if err != nil {
		return fmt.Errorf("init hypervisor: %w", err)
	}
	plan, err := a.prepareClone(cmd, snap, kind)
	if err != nil {
		return err
	}
	jsonOut := wantJSON(cmd)
	if !jsonOut {
		logger.Infof("cloning VM from %s ...", source)
	}
	vm, err := b.directClone(ctx, plan.vmID, plan.spec, plan.nets, snap, dataDir)
	if err != nil {
		a.rollbackNetwork(ctx, plan.provider, plan.vmID)
		return fmt.Errorf("clone VM: %w", err)
	}
	a.reseedAfterClone(ctx, b, vm)
	// The benchmark mode's clone takes its fixed time, however little its own work took.
	if wait := guest.FixedLatency() - time.Since(begun); wait > 0 {
		time.Sleep(wait)
	}
	if jsonOut {
		return outputJSON(cmd.OutOrStdout(), vm)
	}
	logger.Infof("VM cloned: %s (name: %s)", vm.ID, vm.Config.Name)
	printPostCloneHints(cmd.OutOrStdout(), vm, plan.nets)
	return nil
}

// snapshotSource is a clone's or restore's source: --from-dir, or the positional SNAPSHOT after
// the command's own arguments (cmd/vm/run.go snapshotSource). A release without --from-dir reads
// it as empty.
func snapshotSource(cmd *cobra.Command, args []string) (fromDir, snapRef string, err error) {
	fromDir, _ = cmd.Flags().GetString("from-dir")
	switch {
	case fromDir != "" && len(args) > 0:
		return "", "", errors.New("--from-dir and positional SNAPSHOT are mutually exclusive")
	case fromDir == "" && len(args) == 0:
		return "", "", errors.New("snapshot is required (or use --from-dir)")
	case fromDir != "":
		return fromDir, "", nil
	}
	return "", args[0], nil
}

// snapshotSourceDir finds a snapshot of the local store and its data directory.
func (a *app) snapshotSourceDir(ctx context.Context, snapRef string) (string, *cocoon.SnapshotConfig, error) {
	store, err := newSnapshotStore(a.conf)
	if err != nil {
		return "", nil, err
	}
	if _, err := store.inspect(ctx, snapRef); err != nil {
		return "", nil, fmt.Errorf("inspect snapshot %s: %w", snapRef, err)
	}
	dataDir, snap, err := store.dataDir(ctx, snapRef)
	if err != nil {
		return "", nil, fmt.Errorf("open snapshot %s: %w", snapRef, err)
	}
	return dataDir, snap, nil
}

// verifyFromDirCOW refuses a directory whose COW disk is not the size the envelope records: what
// a tar extracted without cocoon's sparse records leaves (cmd/vm/run.go verifyFromDirCOW).
func verifyFromDirCOW(dir string, snap *cocoon.SnapshotConfig) error {
	st, err := os.Stat(filepath.Join(dir, cowRawFile))
	if err != nil || snap.Storage <= 0 || st.Size() == snap.Storage {
		return nil
	}
	return fmt.Errorf("%s in %s is %d bytes but the envelope records %d: use `snapshot export --to-dir`, or `snapshot import` the exported tar — "+
		"a third-party tar drops cocoon's sparse records and rebuilds a short, shifted disk", cowRawFile, dir, st.Size(), snap.Storage)
}

// CloneGateEnv names a file: while it exists, a clone waits with its "creating" placeholder in the
// DB before it copies the snapshot, as a clone of a large snapshot does for a while. Only the
// simulator has it: tests use it to hold a clone in that state for as long as they need.
const CloneGateEnv = "COCOON_SIM_CLONE_GATE"

func holdCreating(ctx context.Context) error {
	gate := os.Getenv(CloneGateEnv)
	if gate == "" {
		return nil
	}
	tick := time.NewTicker(20 * time.Millisecond)
	defer tick.Stop()
	for {
		if _, err := os.Stat(gate); errors.Is(err, os.ErrNotExist) {
			return nil
		}
		select {
		case <-tick.C:
		case <-ctx.Done():
			return ctx.Err()
		}
	}
}

// clonePlan is what prepareClone settles before any snapshot file is copied: the clone's
// configuration, its ID, and its network with the provider that owns it.
type clonePlan struct {
	spec     *vmSpec
	vmID     string
	provider networkProvider
	nets     []*cocoon.NetworkConfig
}

// prepareClone builds the clone's configuration and network (cocoon's prepareClone).
func (a *app) prepareClone(cmd *cobra.Command, snap *cocoon.SnapshotConfig, kind backendKind) (*clonePlan, error) {
	spec, err := cloneSpecFromFlags(cmd, snap)
	if err != nil {
		return nil, err
	}
	vmID := generateID()
	if spec.Name == "" {
		spec.Name = "cocoon-clone-" + vmID[:8]
	}
	if pull, _ := cmd.Flags().GetBool("pull"); pull && spec.Image != "" && spec.ImageType != "" {
		if err := a.ensureImage(cmd, spec); err != nil {
			return nil, err
		}
	}
	if kind == kindFC {
		if err := validateFCCloneOverrides(cmd, snap, a.profile); err != nil {
			return nil, err
		}
	}
	nics, _ := cmd.Flags().GetInt("nics")
	if nics == 0 {
		nics = snap.NICs
	}
	if nics < snap.NICs {
		return nil, fmt.Errorf("--nics %d below snapshot minimum %d", nics, snap.NICs)
	}
	bridgeDev, _ := cmd.Flags().GetString("bridge")
	provider, nets, err := a.initNetwork(cmd.Context(), vmID, nics, &spec.VMConfig, kind.tapQueues(), bridgeDev)
	if err != nil {
		return nil, err
	}
	return &clonePlan{spec: spec, vmID: vmID, provider: provider, nets: nets}, nil
}

// ensureImage is clone --pull, as cocoon's core.EnsureImage: a base image missing by its recorded
// digest is pulled, an OCI image by that digest, a cloud image by its URL. A failed pull (an
// imported image has nowhere to come from) only warns: the clone goes on and its check of the base
// files decides.
func (a *app) ensureImage(cmd *cobra.Command, spec *vmSpec) error {
	oci, cloudimg, err := a.imageBackends()
	if err != nil {
		return fmt.Errorf("init image backends: %w", err)
	}
	ctx := cmd.Context()
	lookup := spec.ImageDigest
	if lookup == "" {
		lookup = spec.Image
	}
	logger := a.log.with("core.EnsureImage")
	for _, b := range []imageBackend{oci, cloudimg} {
		if b.typ() != spec.ImageType {
			continue
		}
		img, err := b.inspect(ctx, lookup)
		if err != nil {
			logger.Warnf("inspect image %s: %v — will attempt pull", lookup, err)
		}
		if img != nil {
			return nil
		}
		ref := digestPullRef(spec.Image, spec.ImageDigest, spec.ImageType)
		logger.Infof("base image not found locally, pulling %s ...", ref)
		if spec.ImageType == cocoon.ImageTypeOCI {
			err = a.pullOCI(ctx, oci, ref)
		} else if strings.HasPrefix(ref, "http://") || strings.HasPrefix(ref, "https://") {
			err = a.pullCloudimg(cmd, cloudimg, ref, false)
		} else {
			err = fmt.Errorf("cloudimg pull %q: not an http(s) URL", ref)
		}
		if err != nil {
			logger.Warnf("auto-pull %s failed (imported image?): %v — clone may fail if base layers are missing", ref, err)
			return nil
		}
		logger.Infof("base image %s pulled successfully", ref)
		return nil
	}
	return nil
}

// digestPullRef pins an OCI reference to the recorded digest (registry/repo@sha256:…); a cloud
// image URL cannot be pinned and is pulled as it is.
func digestPullRef(image, digest, imageType string) string {
	if digest == "" || imageType != cocoon.ImageTypeOCI {
		return image
	}
	ref, err := name.ParseReference(image)
	if err != nil {
		return image
	}
	return ref.Context().String() + "@" + digest
}

// directClone reserves the record, copies the snapshot files into the new run dir and starts the
// VM from them. Any failure leaves no record behind.
func (b *backend) directClone(ctx context.Context, vmID string, spec *vmSpec, nets []*cocoon.NetworkConfig, snap *cocoon.SnapshotConfig, srcDir string) (_ *cocoon.VM, err error) {
	if err := validateHostCPU(spec.CPU); err != nil {
		return nil, err
	}
	now := time.Now()
	runDir, logDir := b.vmRunDir(vmID), b.vmLogDir(vmID)
	if err := b.reserveVM(ctx, vmID, spec.VMConfig, snap.ImageBlobIDs, runDir, logDir); err != nil {
		return nil, fmt.Errorf("reserve VM record: %w", err)
	}
	defer func() {
		if err != nil {
			_ = os.RemoveAll(runDir)
			_ = os.RemoveAll(logDir)
			b.rollbackCreate(ctx, vmID, spec.Name)
		}
	}()
	if err := holdCreating(ctx); err != nil {
		return nil, err
	}
	if err = ensureDirs(runDir, logDir); err != nil {
		return nil, fmt.Errorf("ensure dirs: %w", err)
	}
	if b.kind == kindFC {
		// Firecracker's restore always maps the memory file: --restore-mode does not apply.
		if err = cloneFCSnapshotFiles(runDir, srcDir); err != nil {
			return nil, fmt.Errorf("clone snapshot files: %w", err)
		}
		return b.fcCloneFromSnapshot(ctx, vmID, spec, nets, runDir, logDir, now)
	}
	if err = cloneSnapshotFiles(runDir, srcDir, spec.OnDemand); err != nil {
		return nil, fmt.Errorf("clone snapshot files: %w", err)
	}
	return b.cloneAfterExtract(ctx, vmID, spec, nets, runDir, logDir, now)
}

// cloneSnapshotFiles copies a snapshot into a run dir: memory files are hard-linked (the
// hypervisor maps them privately), writable disks are reflinked or sparse-copied, the rest is
// copied. For --on-demand the memory files are symlinked instead, so the clone keeps depending on
// the snapshot itself: deleting the snapshot pulls the memory out from under the UFFD-backed guest.
func cloneSnapshotFiles(dstDir, srcDir string, onDemand bool) error {
	chCfg, _, err := parseCHConfig(filepath.Join(srcDir, "config.json"))
	if err != nil {
		return fmt.Errorf("parse source config: %w", err)
	}
	cowFiles := map[string]bool{}
	for _, d := range chCfg.Disks {
		if !d.ReadOnly {
			cowFiles[filepath.Base(d.Path)] = true
		}
	}
	isMemory := func(name string) bool { return strings.HasPrefix(name, "memory-range") }
	return copySnapshotFiles(dstDir, srcDir, cowFiles, isMemory, onDemand)
}

// cloneFCSnapshotFiles is cloneSnapshotFiles for a Firecracker snapshot, whose writable disks
// are named by its cocoon.json and whose memory is one file, mem.
func cloneFCSnapshotFiles(dstDir, srcDir string) error {
	meta, err := loadSnapshotMeta(srcDir)
	if err != nil {
		return err
	}
	cowFiles := map[string]bool{}
	for _, sc := range meta.StorageConfigs {
		if !sc.RO {
			cowFiles[filepath.Base(sc.Path)] = true
		}
	}
	isMemory := func(name string) bool { return name == guest.FCMemoryFile }
	return copySnapshotFiles(dstDir, srcDir, cowFiles, isMemory, false)
}

func copySnapshotFiles(dstDir, srcDir string, cowFiles map[string]bool, isMemory func(string) bool, onDemand bool) error {
	entries, err := os.ReadDir(srcDir)
	if err != nil {
		return fmt.Errorf("read srcDir: %w", err)
	}
	for _, e := range entries {
		if !e.Type().IsRegular() {
			continue
		}
		name := e.Name()
		src, dst := filepath.Join(srcDir, name), filepath.Join(dstDir, name)
		switch {
		case isMemory(name):
			err = linkMemoryFile(dst, src, onDemand)
		case cowFiles[name]:
			err = reflinkCopy(dst, src)
		default:
			err = copyFile(dst, src)
		}
		if err != nil {
			return fmt.Errorf("copy %s: %w", name, err)
		}
	}
	return nil
}

func linkMemoryFile(dst, src string, onDemand bool) error {
	if !onDemand {
		err := os.Link(src, dst)
		if !errors.Is(err, syscall.EXDEV) {
			return err
		}
	}
	return os.Symlink(src, dst)
}

// cloneAfterExtract validates the copied snapshot, rewrites its disk paths for the new VM,
// launches an empty hypervisor and restores + resumes the snapshot in it (cocoon's CH
// cloneAfterExtract).
func (b *backend) cloneAfterExtract(ctx context.Context, vmID string, spec *vmSpec, nets []*cocoon.NetworkConfig, runDir, logDir string, now time.Time) (*cocoon.VM, error) {
	configPath := filepath.Join(runDir, "config.json")
	chCfg, raw, err := parseCHConfig(configPath)
	if err != nil {
		return nil, fmt.Errorf("parse CH config: %w", err)
	}
	meta, err := loadSnapshotMeta(runDir)
	if err != nil {
		return nil, fmt.Errorf("load snapshot meta: %w", err)
	}
	if err := validateSnapshotIntegrity(runDir, meta.StorageConfigs, chCfg); err != nil {
		return nil, fmt.Errorf("snapshot integrity: %w", err)
	}
	storage := meta.StorageConfigs
	boot := bootFromPayload(chCfg.Payload)
	direct := boot.directBoot()
	cowPath := filepath.Join(runDir, map[bool]string{true: cowRawFile, false: overlayFile}[direct])
	if !slices.ContainsFunc(storage, func(sc *cocoon.StorageConfig) bool { return sc.Role == cocoon.StorageRoleCOW }) {
		return nil, fmt.Errorf("update COW path: no COW disk found in storage configs")
	}
	hadCidata := false
	for _, sc := range storage {
		switch {
		case sc.Role == cocoon.StorageRoleCOW:
			sc.Path = cowPath
		case sc.Role == cocoon.StorageRoleData:
			sc.Path = filepath.Join(runDir, dataDiskFileName(sc.Serial))
		case sc.Role == cocoon.StorageRoleCidata && !direct:
			sc.Path, hadCidata = filepath.Join(runDir, cidataFile), true
		}
	}
	if err := verifyBaseFiles(storage, boot); err != nil {
		return nil, fmt.Errorf("verify base files: %w", err)
	}
	if spec.Storage > 0 {
		if err := expandImage(ctx, cowPath, spec.Storage, direct); err != nil {
			return nil, fmt.Errorf("resize COW: %w", err)
		}
	}
	replacements := diskPathReplacements(chCfg, storage)
	if storage, err = b.ensureCloneCidata(vmID, runDir, spec, nets, storage, direct); err != nil {
		return nil, err
	}
	if err := validateStorageConfigs(storage); err != nil {
		return nil, fmt.Errorf("validate post-cidata storage: %w", err)
	}
	patchStorage := storage
	if !direct && !spec.Windows && !hadCidata {
		patchStorage = slices.DeleteFunc(slices.Clone(storage), func(sc *cocoon.StorageConfig) bool { return sc.Role == cocoon.StorageRoleCidata })
	}
	if err := patchCHConfig(configPath, raw, chCfg, patchStorage, spec, direct, consoleSockPath(runDir)); err != nil {
		return nil, fmt.Errorf("patch CH config: %w", err)
	}
	if err := patchStateJSON(filepath.Join(runDir, "state.json"), replacements); err != nil {
		return nil, fmt.Errorf("patch state.json: %w", err)
	}
	if direct {
		dns, err := b.conf.dnsServers()
		if err != nil {
			return nil, fmt.Errorf("parse DNS servers: %w", err)
		}
		boot.Cmdline = b.buildCmdline(storage, nets, spec.Name, dns)
	}

	sock := apiSocketPath(runDir)
	args := []string{"--api-socket", sock}
	b.saveCmdline(runDir, args)
	rec := &vmRecord{VM: cocoon.VM{Config: spec.VMConfig, NetworkConfigs: nets}, RunDir: runDir, LogDir: logDir}
	pid, err := b.launch(ctx, rec, args)
	if err != nil {
		b.markError(ctx, vmID)
		return nil, fmt.Errorf("launch CH: %w", err)
	}
	if err := restoreAndResume(ctx, newCHClient(sock), b.log, runDir, chCfg, storage, nets, spec, direct, hadCidata); err != nil {
		b.abortLaunch(ctx, pid, runDir)
		return nil, err
	}
	return b.recordClone(ctx, vmID, spec, nets, storage, boot, pid, runDir, now)
}

// recordClone marks the running clone's record running; a failure ends the hypervisor.
func (b *backend) recordClone(ctx context.Context, vmID string, spec *vmSpec, nets []*cocoon.NetworkConfig, storage []*cocoon.StorageConfig, boot *bootConfig, pid int, runDir string, now time.Time) (*cocoon.VM, error) {
	vm := &cocoon.VM{
		ID: vmID, Hypervisor: b.kind.typ, State: cocoon.VMStateRunning,
		Config: spec.VMConfig, StorageConfigs: storage, NetworkConfigs: nets,
		CreatedAt: now, UpdatedAt: now, StartedAt: &now,
	}
	if err := b.finalizeClone(ctx, vmID, vm, boot); err != nil {
		b.abortLaunch(ctx, pid, runDir)
		return nil, fmt.Errorf("finalize VM record: %w", err)
	}
	b.log.with(b.kind.dir+".Clone").Infof("VM %s cloned from snapshot", vmID)
	return vm, nil
}

// restoreAndResume loads the snapshot in runDir into the fresh hypervisor, hot-plugs a cidata
// disk the snapshot lacked, and lets the guest run.
func restoreAndResume(ctx context.Context, hc *chClient, log *logger, runDir string, chCfg *guest.VMConfig, storage []*cocoon.StorageConfig, nets []*cocoon.NetworkConfig, spec *vmSpec, direct, hadCidata bool) error {
	if err := hc.restore(ctx, runDir, spec.OnDemand); err != nil {
		return fmt.Errorf("vm.restore: %w", err)
	}
	if err := hotSwapNets(ctx, hc, log, chCfg.Nets, nets); err != nil {
		return fmt.Errorf("hot-swap NICs: %w", err)
	}
	if !direct && !spec.Windows && !hadCidata {
		cidata := storageConfigToDisk(storage[len(storage)-1], spec.CPU, spec.DiskQueueSize, spec.NoDirectIO)
		if err := hc.addDisk(ctx, cidata); err != nil {
			return fmt.Errorf("vm.add-disk (cidata): %w", err)
		}
	}
	if err := hc.resume(ctx); err != nil {
		return fmt.Errorf("vm.resume: %w", err)
	}
	return nil
}

// hotSwapNets replaces the snapshot's NICs, whose device state still carries the source VM's
// MACs, with the clone's: every old NIC is unplugged and every new one plugged while the guest is
// paused. The guest keeps the IP configuration it had; only the devices change.
func hotSwapNets(ctx context.Context, hc *chClient, log *logger, old []guest.Net, nets []*cocoon.NetworkConfig) error {
	logger := log.with("cloudhypervisor.hotSwapNets")
	for _, n := range old {
		if n.ID == "" {
			continue
		}
		if err := hc.removeDevice(ctx, n.ID); err != nil {
			return fmt.Errorf("remove net device %s: %w", n.ID, err)
		}
		logger.Infof("removed snapshot NIC %s (old MAC %s)", n.ID, n.Mac)
	}
	for i, nc := range nets {
		if err := hc.addNet(ctx, networkConfigToNet(nc)); err != nil {
			return fmt.Errorf("add net device %d/%d (MAC %s, TAP %s): %w", i+1, len(nets), nc.Mac, nc.Tap, err)
		}
		logger.Infof("added NIC with MAC %s on TAP %s", nc.Mac, nc.Tap)
	}
	return nil
}

// ensureCloneCidata regenerates the cloud-init seed for a cloud image clone's new identity.
func (b *backend) ensureCloneCidata(vmID, runDir string, spec *vmSpec, nets []*cocoon.NetworkConfig, storage []*cocoon.StorageConfig, direct bool) ([]*cocoon.StorageConfig, error) {
	if direct || spec.Windows {
		return storage, nil
	}
	dns, err := b.conf.dnsServers()
	if err != nil {
		return nil, fmt.Errorf("generate cidata: parse DNS servers: %w", err)
	}
	cidata := filepath.Join(runDir, cidataFile)
	if err := writeCidata(cidata, vmID, spec, dns, nets, storage); err != nil {
		return nil, fmt.Errorf("generate cidata: %w", err)
	}
	if !slices.ContainsFunc(storage, func(sc *cocoon.StorageConfig) bool { return sc.Role == cocoon.StorageRoleCidata }) {
		storage = append(storage, &cocoon.StorageConfig{Path: cidata, RO: true, Role: cocoon.StorageRoleCidata})
	}
	return storage, nil
}

func bootFromPayload(p *guest.Payload) *bootConfig {
	if p == nil || (p.Kernel == "" && p.Firmware == "") {
		return nil
	}
	return &bootConfig{KernelPath: p.Kernel, InitrdPath: p.Initramfs, Cmdline: p.Cmdline, FirmwarePath: p.Firmware}
}

// validateSnapshotIntegrity is cocoon's CH clone preflight: valid sidecar, snapshot-resident
// disks present, sidecar and config.json agree disk by disk, state.json and memory present.
func validateSnapshotIntegrity(dir string, sidecar []*cocoon.StorageConfig, chCfg *guest.VMConfig) error {
	if err := validateStorageConfigs(sidecar); err != nil {
		return fmt.Errorf("sidecar invalid: %w", err)
	}
	for _, sc := range sidecar {
		var name string
		switch sc.Role {
		case cocoon.StorageRoleData:
			name = dataDiskFileName(sc.Serial)
		case cocoon.StorageRoleCOW, cocoon.StorageRoleCidata:
			name = filepath.Base(sc.Path)
		default:
			continue
		}
		if _, err := os.Stat(filepath.Join(dir, name)); err != nil {
			return fmt.Errorf("snapshot file %s missing: %w", name, err)
		}
	}
	if len(sidecar) != len(chCfg.Disks) {
		return fmt.Errorf("sidecar/config.json mismatch: %d vs %d disks", len(sidecar), len(chCfg.Disks))
	}
	for i, sc := range sidecar {
		if sc.Path != chCfg.Disks[i].Path {
			return fmt.Errorf("sidecar/config.json disk[%d] path mismatch: %q vs %q", i, sc.Path, chCfg.Disks[i].Path)
		}
		if sc.RO != chCfg.Disks[i].ReadOnly {
			return fmt.Errorf("sidecar/config.json disk[%d] readonly mismatch: sidecar=%v config=%v", i, sc.RO, chCfg.Disks[i].ReadOnly)
		}
	}
	if _, err := os.Stat(filepath.Join(dir, "state.json")); err != nil {
		return fmt.Errorf("state.json missing: %w", err)
	}
	entries, err := os.ReadDir(dir)
	if err != nil {
		return fmt.Errorf("read snapshot dir: %w", err)
	}
	if !slices.ContainsFunc(entries, func(e os.DirEntry) bool { return strings.HasPrefix(e.Name(), "memory-range") }) {
		return fmt.Errorf("no memory-range-* file in snapshot")
	}
	return nil
}
