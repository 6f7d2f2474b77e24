package cocoonsim

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"

	"github.com/spf13/cobra"

	"github.com/cocoonstack/cocoon-cri/pkg/cocoon"
	"github.com/cocoonstack/cocoon-cri/test/cocoonsim/guest"
)

// hibernateCommand is v0.5's "vm hibernate" (cmd/vm/commands.go, cmd/vm/hibernate.go).
func (a *app) hibernateCommand() *cobra.Command {
	cmd := &cobra.Command{Use: "hibernate [flags] VM", Short: "Atomically snapshot a running VM and stop it (resume with vm restore)", Args: cobra.ExactArgs(1), RunE: a.vmHibernate}
	cmd.Flags().String("name", "", "snapshot name")
	cmd.Flags().String("description", "", "snapshot description")
	return cmd
}

// restoreCommand is v0.5's "vm restore": SNAPSHOT optional beside --from-dir, --restore-mode as
// docs/cli.md's Restore Flags, --force only with --from-dir.
func (a *app) restoreCommand() *cobra.Command {
	cmd := &cobra.Command{
		Use:   "restore [flags] VM [SNAPSHOT]",
		Short: "Restore a running or stopped VM to a previous snapshot (or a directory via --from-dir)",
		Args:  cobra.RangeArgs(1, 2),
		PreRunE: func(cmd *cobra.Command, _ []string) error {
			force, _ := cmd.Flags().GetBool("force")
			fromDir, _ := cmd.Flags().GetString("from-dir")
			if force && fromDir == "" {
				return fmt.Errorf("--force only applies with --from-dir")
			}
			return nil
		},
		RunE: a.vmRestore,
	}
	f := cmd.Flags()
	f.String("restore-mode", "", "memory restore mode: copy, ondemand (UFFD) or mmap (CoW map); CH only (default mmap for plain snapshots, else copy)")
	f.String("from-dir", "", "restore from a snapshot directory (must contain snapshot.json) instead of the local snapshot DB; mutually exclusive with positional SNAPSHOT")
	f.Bool("force", false, "skip the snapshot-belongs-to-VM check (only meaningful with --from-dir; risk of restoring to an unrelated lineage)")
	addOutputFlag(cmd)
	return cmd
}

// vmHibernate: the snapshot name is checked before the VM is paused; the snapshot is persisted
// inside the pause window and the hypervisor killed only after that succeeded. It prints no JSON.
func (a *app) vmHibernate(cmd *cobra.Command, args []string) error {
	ctx := cmd.Context()
	logger := a.log.with("cmd.vm.hibernate")
	vmRef := args[0]
	owner, store, err := a.vmOwnerAndSnapshots(ctx, vmRef)
	if err != nil {
		return err
	}
	vm, err := owner.inspect(ctx, vmRef)
	if err != nil {
		return fmt.Errorf("inspect VM %s: %w", vmRef, err)
	}
	name, _ := cmd.Flags().GetString("name")
	description, _ := cmd.Flags().GetString("description")
	if err := store.checkNameFree(ctx, name); err != nil {
		return err
	}
	logger.Infof("hibernating VM %s ...", vmRef)
	snapID, err := owner.hibernate(ctx, vm.ID, func(cfg *cocoon.SnapshotConfig, dir string) (string, error) {
		cfg.Name, cfg.Description = name, description
		return store.create(ctx, cfg, dir)
	})
	if err != nil {
		return err
	}
	resumeRef := name
	if resumeRef == "" {
		resumeRef = snapID
	}
	logger.Infof("VM hibernated; snapshot %s (resume: cocoon vm restore %s %s)", snapID, vmRef, resumeRef)
	return nil
}

// hibernate is cocoon's HibernateSequence: pause, capture, persist, and only then terminate the
// hypervisor; any failure before the terminate resumes the VM, a failed terminate marks it error.
// The hibernated VM is stopped, its snapshot in its snapshot_ids.
func (b *backend) hibernate(ctx context.Context, vmID string, persist func(*cocoon.SnapshotConfig, string) (string, error)) (string, error) {
	rec, err := b.loadRecord(ctx, vmID)
	if err != nil {
		return "", err
	}
	if err := validateStorageConfigs(rec.StorageConfigs); err != nil {
		return "", fmt.Errorf("storage invariants violated: %w", err)
	}
	cowName := overlayFile
	if rec.BootConfig.directBoot() {
		cowName = cowRawFile
	}
	tmpDir, err := os.MkdirTemp(rec.RunDir, "snapshot-")
	if err != nil {
		return "", fmt.Errorf("create temp dir: %w", err)
	}
	defer os.RemoveAll(tmpDir) //nolint:errcheck // gone already once persisted
	logger := b.log.with(b.kind.typ + ".HibernateSequence")
	pause, resume, capture := b.snapshotOps(rec.RunDir, tmpDir)
	var snapID string
	var killFailed bool
	err = b.withRunningVM(ctx, &rec, func(pid int) error {
		if b.kind == kindCH {
			// cocoon's CH pause step refuses what a restore could not bring back.
			vm := b.toVM(&rec)
			vm.State = cocoon.VMStateRunning
			if err := hotAttachedError(ctx, vm); err != nil {
				return fmt.Errorf("pause: %w", err)
			}
		}
		if err := pause(ctx); err != nil {
			return fmt.Errorf("pause: %w", err)
		}
		failResume := func(e error) error {
			if err := resume(context.WithoutCancel(ctx)); err != nil {
				logger.Warnf("resume VM %s after failed hibernate: %v", vmID, err)
			}
			return e
		}
		if err := captureDisks(ctx, capture, tmpDir, filepath.Join(rec.RunDir, cowName), cowName, rec.StorageConfigs); err != nil {
			return failResume(err)
		}
		cfg, err := b.finalizeCapture(ctx, vmID, &rec, tmpDir)
		if err != nil {
			return failResume(err)
		}
		if snapID, err = persist(cfg, tmpDir); err != nil {
			b.unrecordSnapshot(ctx, vmID, cfg.ID)
			return failResume(fmt.Errorf("persist snapshot: %w", err))
		}
		if err := b.terminateVMM(ctx, &rec, pid); err != nil {
			killFailed = true
			return fmt.Errorf("terminate: %w", err)
		}
		return nil
	})
	if err != nil {
		if killFailed {
			b.markError(ctx, vmID)
		}
		return "", fmt.Errorf("hibernate VM %s: %w", vmID, err)
	}
	b.cleanupRuntimeFiles(rec.RunDir)
	if err := b.updateStates(ctx, []string{vmID}, cocoon.VMStateStopped); err != nil {
		logger.Warnf("mark stopped %s: %v", vmID, err)
	}
	return snapID, nil
}

// terminateVMM ends a VM's hypervisor at once: cloud-hypervisor gets vm.shutdown first, then
// both get SIGTERM and, after the grace, SIGKILL.
func (b *backend) terminateVMM(ctx context.Context, rec *vmRecord, pid int) error {
	sock := apiSocketPath(rec.RunDir)
	if b.kind == kindCH {
		return b.forceTerminate(ctx, newCHClient(sock), rec.ID, sock, pid)
	}
	return terminateProcess(ctx, pid, b.binaryName(), sock, b.terminateGrace())
}

// vmRestore restores a VM, running, stopped or in error, from one of its own snapshots, in place:
// same ID, name, netns, TAPs, MACs and IPs; CPU, memory and storage are the snapshot's.
func (a *app) vmRestore(cmd *cobra.Command, args []string) error {
	ctx := cmd.Context()
	logger := a.log.with("cmd.vm.restore")
	vmRef := args[0]
	fromDir, _ := cmd.Flags().GetString("from-dir")
	switch {
	case fromDir != "" && len(args) > 1:
		return fmt.Errorf("--from-dir and positional SNAPSHOT are mutually exclusive")
	case fromDir != "":
		return fmt.Errorf("cocoon-sim: %q is not simulated", "vm restore --from-dir")
	case len(args) < 2:
		return fmt.Errorf("snapshot is required (or use --from-dir)")
	}
	snapRef := args[1]
	owner, store, err := a.vmOwnerAndSnapshots(ctx, vmRef)
	if err != nil {
		return err
	}
	vm, err := owner.inspect(ctx, vmRef)
	if err != nil {
		return fmt.Errorf("find VM %s: %w", vmRef, err)
	}
	snap, err := store.inspect(ctx, snapRef)
	if err != nil {
		return fmt.Errorf("inspect snapshot: %w", err)
	}
	if _, ok := vm.SnapshotIDs[snap.ID]; !ok {
		return fmt.Errorf("snapshot %s does not belong to VM %s", snapRef, vmRef)
	}
	onDemand, err := snapshotBackedMemory(cmd.Flags())
	if err != nil {
		return err
	}
	cfg := vm.Config
	if snap.CPU > 0 {
		cfg.CPU = snap.CPU
	}
	if snap.Memory > 0 {
		cfg.Memory = snap.Memory
	}
	if snap.Storage > 0 {
		cfg.Storage = snap.Storage
	}
	dataDir, _, err := store.dataDir(ctx, snap.ID)
	if err != nil {
		return fmt.Errorf("restore: open snapshot: %w", err)
	}
	jsonOut := wantJSON(cmd)
	if !jsonOut {
		logger.Infof("restoring VM %s from snapshot %s (direct) ...", vm.ID, snap.ID)
	}
	if vm.State != cocoon.VMStateRunning {
		// A stopped VM (a hibernated one after a host reboot) gets vm start's network self-heal.
		a.recoverNetworks(ctx, owner, []string{vm.ID})
	}
	restored, err := owner.restore(ctx, vm.ID, cfg, dataDir, onDemand)
	if err != nil {
		return fmt.Errorf("restore: %w", err)
	}
	a.reseedAfterRestore(ctx, restored)
	if jsonOut {
		return outputJSON(cmd.OutOrStdout(), restored)
	}
	logger.Infof("VM %s restored (state: %s)", restored.ID, restored.State)
	return nil
}

// reseedAfterRestore is v0.5's restore epilogue: fresh entropy only (the machine-id is the VM's
// own), best effort.
func (a *app) reseedAfterRestore(ctx context.Context, vm *cocoon.VM) {
	if !a.profile.Agent || vm.Config.Windows || vsockSocket(vm) == "" {
		return
	}
	if err := reseedVM(ctx, vm, false); err != nil {
		a.log.with("cmd.vm.reseed").Warnf("reseed signal failed (agent >= v0.1.6 required): %v; run 'cocoon vm reseed %s' after fixing", err, vm.ID)
	}
}

// restore is cocoon's DirectRestoreSequence: the VM must be running, stopped or in error; a
// running hypervisor is killed, the run dir gets the snapshot's files, and a fresh hypervisor
// restores and resumes the guest in the VM's own netns, on its own TAPs.
func (b *backend) restore(ctx context.Context, vmID string, cfg cocoon.VMConfig, srcDir string, onDemand bool) (*cocoon.VM, error) {
	if err := validateHostCPU(cfg.CPU); err != nil {
		return nil, err
	}
	rec, err := b.loadRecord(ctx, vmID)
	if err != nil {
		return nil, err
	}
	switch rec.State {
	case cocoon.VMStateRunning, cocoon.VMStateStopped, cocoon.VMStateError:
	default:
		return nil, fmt.Errorf("vm %s is %s and cannot be restored", vmID, rec.State)
	}
	if err := validateStorageConfigs(rec.StorageConfigs); err != nil {
		return nil, fmt.Errorf("storage invariants violated: %w", err)
	}
	if err := ensureDirs(rec.RunDir, rec.LogDir); err != nil {
		return nil, fmt.Errorf("ensure dirs: %w", err)
	}
	origin := rec.State
	if err := b.withRunningVM(ctx, &rec, func(pid int) error { return b.terminateVMM(ctx, &rec, pid) }); err != nil && !errors.Is(err, errVMNotRunning) {
		if origin != cocoon.VMStateStopped {
			b.markError(ctx, vmID)
		}
		return nil, fmt.Errorf("stop running VM: %w", err)
	}
	b.cleanupRuntimeFiles(rec.RunDir)
	fail := func(err error) (*cocoon.VM, error) {
		if origin != cocoon.VMStateStopped {
			b.markError(ctx, vmID)
		}
		return nil, err
	}
	if err := populateRunDir(rec.RunDir, srcDir, b.kind == kindFC, onDemand); err != nil {
		return fail(err)
	}
	rec.Config = cfg
	var pid int
	if b.kind == kindFC {
		pid, err = b.fcRestoreAfterExtract(ctx, &rec)
	} else {
		pid, err = b.chRestoreAfterExtract(ctx, &rec, onDemand)
	}
	if err != nil {
		return fail(err)
	}
	if err := b.finalizeRestore(ctx, vmID, cfg); err != nil {
		b.abortLaunch(ctx, pid, rec.RunDir)
		return fail(fmt.Errorf("update record: %w", err))
	}
	return b.inspect(ctx, vmID)
}

// populateRunDir replaces the snapshot files of a VM's run dir with a snapshot's: what an earlier
// snapshot or clone left (memory, config, state, sidecar, data disks) goes, and every file of the
// snapshot is unlinked before its copy, so nothing is written through a link into a snapshot.
func populateRunDir(runDir, srcDir string, fc, onDemand bool) error {
	entries, err := os.ReadDir(runDir)
	if err != nil {
		return fmt.Errorf("clean old snapshot files: %w", err)
	}
	for _, e := range entries {
		name := e.Name()
		stale := strings.HasPrefix(name, "memory-range") || name == "config.json" || name == "state.json" ||
			name == snapshotMetaFile || name == guest.FCStateFile || name == guest.FCMemoryFile ||
			(strings.HasPrefix(name, "data-") && strings.HasSuffix(name, ".raw"))
		if stale {
			if err := os.Remove(filepath.Join(runDir, name)); err != nil && !errors.Is(err, os.ErrNotExist) {
				return fmt.Errorf("clean old snapshot files: %w", err)
			}
		}
	}
	srcEntries, err := os.ReadDir(srcDir)
	if err != nil {
		return fmt.Errorf("clone snapshot files: read srcDir: %w", err)
	}
	for _, e := range srcEntries {
		if !e.Type().IsRegular() {
			continue
		}
		if err := os.Remove(filepath.Join(runDir, e.Name())); err != nil && !errors.Is(err, os.ErrNotExist) {
			return fmt.Errorf("clean old snapshot files: %w", err)
		}
	}
	if fc {
		err = cloneFCSnapshotFiles(runDir, srcDir)
	} else {
		err = cloneSnapshotFiles(runDir, srcDir, onDemand)
	}
	if err != nil {
		return fmt.Errorf("clone snapshot files: %w", err)
	}
	return nil
}

// chRestoreAfterExtract checks the restored files, points their disks at the VM's run dir,
// launches an empty cloud-hypervisor and restores + resumes the snapshot in it. The snapshot's
// NICs are the VM's own (same TAPs and MACs), so none is swapped.
func (b *backend) chRestoreAfterExtract(ctx context.Context, rec *vmRecord, onDemand bool) (int, error) {
	runDir := rec.RunDir
	configPath := filepath.Join(runDir, "config.json")
	chCfg, raw, err := parseCHConfig(configPath)
	if err != nil {
		return 0, fmt.Errorf("parse CH config: %w", err)
	}
	meta, err := loadSnapshotMeta(runDir)
	if err != nil {
		return 0, fmt.Errorf("load snapshot meta: %w", err)
	}
	if err := validateSnapshotIntegrity(runDir, meta.StorageConfigs, chCfg); err != nil {
		return 0, fmt.Errorf("snapshot integrity: %w", err)
	}
	storage := meta.StorageConfigs
	direct := bootFromPayload(chCfg.Payload).directBoot()
	for _, sc := range storage {
		switch sc.Role {
		case cocoon.StorageRoleCOW:
			sc.Path = filepath.Join(runDir, map[bool]string{true: cowRawFile, false: overlayFile}[direct])
		case cocoon.StorageRoleData:
			sc.Path = filepath.Join(runDir, dataDiskFileName(sc.Serial))
		case cocoon.StorageRoleCidata:
			sc.Path = filepath.Join(runDir, cidataFile)
		}
	}
	if err := verifyBaseFiles(storage, bootFromPayload(chCfg.Payload)); err != nil {
		return 0, fmt.Errorf("verify base files: %w", err)
	}
	spec := &vmSpec{VMConfig: rec.Config, OnDemand: onDemand}
	if err := patchCHConfig(configPath, raw, chCfg, storage, spec, direct, consoleSockPath(runDir)); err != nil {
		return 0, fmt.Errorf("patch CH config: %w", err)
	}
	if err := patchStateJSON(filepath.Join(runDir, "state.json"), diskPathReplacements(chCfg, storage)); err != nil {
		return 0, fmt.Errorf("patch state.json: %w", err)
	}
	sock := apiSocketPath(runDir)
	args := []string{"--api-socket", sock}
	b.saveCmdline(runDir, args)
	pid, err := b.launch(ctx, rec, args)
	if err != nil {
		return 0, fmt.Errorf("launch CH: %w", err)
	}
	hc := newCHClient(sock)
	if err := hc.restore(ctx, runDir, onDemand); err != nil {
		b.abortLaunch(ctx, pid, runDir)
		return 0, fmt.Errorf("vm.restore: %w", err)
	}
	if err := hc.resume(ctx); err != nil {
		b.abortLaunch(ctx, pid, runDir)
		return 0, fmt.Errorf("vm.resume: %w", err)
	}
	return pid, nil
}

// fcRestoreAfterExtract launches an empty Firecracker and loads the snapshot with the VM's own
// TAPs and vsock socket, as a Firecracker clone does.
func (b *backend) fcRestoreAfterExtract(ctx context.Context, rec *vmRecord) (int, error) {
	runDir := rec.RunDir
	meta, err := loadSnapshotMeta(runDir)
	if err != nil {
		return 0, fmt.Errorf("load snapshot meta: %w", err)
	}
	for _, name := range []string{guest.FCStateFile, guest.FCMemoryFile} {
		if _, err := os.Stat(filepath.Join(runDir, name)); err != nil {
			return 0, fmt.Errorf("snapshot file %s missing: %w", name, err)
		}
	}
	if err := validateStorageConfigs(meta.StorageConfigs); err != nil {
		return 0, fmt.Errorf("sidecar invalid: %w", err)
	}
	storage := meta.StorageConfigs
	snapshotPaths := make([]string, len(storage))
	for i, sc := range storage {
		snapshotPaths[i] = sc.Path
		switch sc.Role {
		case cocoon.StorageRoleCOW:
			sc.Path = filepath.Join(runDir, cowRawFile)
		case cocoon.StorageRoleData:
			sc.Path = filepath.Join(runDir, dataDiskFileName(sc.Serial))
		}
	}
	pid, err := b.launch(ctx, rec, b.fcArgs(rec))
	if err != nil {
		return 0, fmt.Errorf("launch FC: %w", err)
	}
	if err := b.fcLoadClone(ctx, newFCClient(apiSocketPath(runDir)), runDir, rec.NetworkConfigs, storage, snapshotPaths); err != nil {
		b.abortLaunch(ctx, pid, runDir)
		return 0, err
	}
	return pid, nil
}
