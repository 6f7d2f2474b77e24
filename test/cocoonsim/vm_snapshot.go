package cocoonsim

import (
	"context"
	"encoding/json"
	"fmt"
	"maps"
	"os"
	"path/filepath"

	"github.com/cocoonstack/cocoon-cri/pkg/cocoon"
	"github.com/cocoonstack/cocoon-cri/test/cocoonsim/guest"
)

// snapshotMetaFile is the disk sidecar of a CH snapshot: what config.json cannot say about each
// disk (role, mount point, ...), in config.json's disk order.
const snapshotMetaFile = "cocoon.json"

type snapshotMeta struct {
	StorageConfigs []*cocoon.StorageConfig `json:"storage_configs"`
	BootConfig     *bootConfig             `json:"boot_config,omitempty"`
	// CPU and Memory are filled by Firecracker only, whose vmstate cannot be read for them.
	CPU    int   `json:"cpu,omitempty"`
	Memory int64 `json:"memory,omitempty"`
}

// snapshot captures a running VM into a temporary directory inside its run dir: pause, the
// hypervisor's snapshot, copy the COW and data disks, resume; then the sidecar and the guest
// behaviour file. It returns the snapshot config (with a new ID recorded on the VM) and that
// directory.
func (b *backend) snapshot(ctx context.Context, ref string) (*cocoon.SnapshotConfig, string, error) {
	vmID, err := b.resolveRef(ctx, ref)
	if err != nil {
		return nil, "", err
	}
	rec, err := b.loadRecord(ctx, vmID)
	if err != nil {
		return nil, "", err
	}
	if err := validateStorageConfigs(rec.StorageConfigs); err != nil {
		return nil, "", fmt.Errorf("storage invariants violated: %w", err)
	}
	direct := rec.BootConfig.directBoot()
	cowName := map[bool]string{true: cowRawFile, false: overlayFile}[direct]
	tmpDir, err := os.MkdirTemp(rec.RunDir, "snapshot-")
	if err != nil {
		return nil, "", fmt.Errorf("create temp dir: %w", err)
	}
	fail := func(err error) (*cocoon.SnapshotConfig, string, error) {
		_ = os.RemoveAll(tmpDir)
		return nil, "", err
	}
	pause, resume, capture := b.snapshotOps(rec.RunDir, tmpDir)
	if err := b.withRunningVM(ctx, &rec, func(int) error {
		if b.kind == kindCH {
			// cocoon v0.5 refuses a snapshot that would not restore: what was hot-attached is not
			// part of the VM's configuration.
			vm := b.toVM(&rec)
			vm.State = cocoon.VMStateRunning
			if err := hotAttachedError(ctx, vm); err != nil {
				return err
			}
		}
		if err := pause(ctx); err != nil {
			return fmt.Errorf("pause: %w", err)
		}
		captureErr := captureDisks(ctx, capture, tmpDir, filepath.Join(rec.RunDir, cowName), cowName, rec.StorageConfigs)
		if resumeErr := resume(context.WithoutCancel(ctx)); resumeErr != nil && captureErr == nil {
			return fmt.Errorf("snapshot data captured but resume failed: %w", resumeErr)
		}
		return captureErr
	}); err != nil {
		return fail(fmt.Errorf("snapshot VM %s: %w", vmID, err))
	}
	cfg, err := b.finalizeCapture(ctx, vmID, &rec, tmpDir)
	if err != nil {
		return fail(err)
	}
	return cfg, tmpDir, nil
}

// finalizeCapture completes a captured snapshot directory outside the hypervisor's own files
// (the cloud-init seed, the guest behaviour file, the cocoon.json sidecar) and records a new
// snapshot ID on the VM (cocoon's finalizeSnapshot).
func (b *backend) finalizeCapture(ctx context.Context, vmID string, rec *vmRecord, tmpDir string) (*cocoon.SnapshotConfig, error) {
	if !rec.BootConfig.directBoot() && !rec.Config.Windows {
		if src := filepath.Join(rec.RunDir, cidataFile); validFile(src) {
			if err := reflinkCopy(filepath.Join(tmpDir, cidataFile), src); err != nil {
				return nil, fmt.Errorf("copy cidata: %w", err)
			}
		}
	}
	if src := filepath.Join(rec.RunDir, guest.SpecFile); validFile(src) {
		if err := copyFile(filepath.Join(tmpDir, guest.SpecFile), src); err != nil {
			return nil, fmt.Errorf("copy guest behaviour: %w", err)
		}
	}
	if err := b.writeSnapshotMeta(tmpDir, rec); err != nil {
		return nil, fmt.Errorf("write snapshot metadata: %w", err)
	}
	snapID, err := b.recordSnapshot(ctx, vmID)
	if err != nil {
		return nil, err
	}
	return &cocoon.SnapshotConfig{
		Config: rec.Config.Config, ID: snapID, Hypervisor: b.kind.typ,
		NICs: len(rec.NetworkConfigs), ImageBlobIDs: maps.Clone(rec.ImageBlobIDs),
	}, nil
}

// snapshotOps are the hypervisor's pause, resume and snapshot (into dir) calls.
func (b *backend) snapshotOps(runDir, dir string) (pause, resume, capture func(context.Context) error) {
	sock := apiSocketPath(runDir)
	if b.kind == kindFC {
		fc := newFCClient(sock)
		return func(ctx context.Context) error { return fcSetState(ctx, fc, "Paused") },
			func(ctx context.Context) error { return fcSetState(ctx, fc, "Resumed") },
			func(ctx context.Context) error {
				return fc.memoryTransfer(ctx, "snapshot/create", map[string]string{
					"snapshot_path": filepath.Join(dir, guest.FCStateFile), "mem_file_path": filepath.Join(dir, guest.FCMemoryFile)})
			}
	}
	hc := newCHClient(sock)
	return hc.pause, hc.resume, func(ctx context.Context) error { return hc.snapshot(ctx, dir) }
}

// captureDisks runs inside the pause window: the hypervisor's own snapshot, then the writable
// disks.
func captureDisks(ctx context.Context, capture func(context.Context) error, tmpDir, cowPath, cowName string, storage []*cocoon.StorageConfig) error {
	if err := capture(ctx); err != nil {
		return fmt.Errorf("snapshot: %w", err)
	}
	if err := reflinkCopy(filepath.Join(tmpDir, cowName), cowPath); err != nil {
		return fmt.Errorf("copy COW: %w", err)
	}
	for _, sc := range storage {
		if sc.Role != cocoon.StorageRoleData {
			continue
		}
		if err := reflinkCopy(filepath.Join(tmpDir, dataDiskFileName(sc.Serial)), sc.Path); err != nil {
			return fmt.Errorf("copy data disk %s: %w", sc.Serial, err)
		}
	}
	return nil
}

// writeSnapshotMeta writes cocoon.json: for cloud-hypervisor by walking the disks of the
// snapshot's config.json; for Firecracker the record's disks, boot (without its command line,
// which a clone rebuilds), CPU and memory.
func (b *backend) writeSnapshotMeta(dir string, rec *vmRecord) error {
	if b.kind == kindFC {
		meta := snapshotMeta{CPU: rec.Config.CPU, Memory: rec.Config.Memory}
		if rec.BootConfig != nil {
			boot := *rec.BootConfig
			boot.Cmdline = ""
			meta.BootConfig = &boot
		}
		for _, sc := range rec.StorageConfigs {
			copied := *sc
			meta.StorageConfigs = append(meta.StorageConfigs, &copied)
		}
		return writeJSONFile(filepath.Join(dir, snapshotMetaFile), meta)
	}
	chCfg, _, err := parseCHConfig(filepath.Join(dir, "config.json"))
	if err != nil {
		return fmt.Errorf("parse snapshot config: %w", err)
	}
	byPath := map[string]*cocoon.StorageConfig{}
	for _, sc := range rec.StorageConfigs {
		byPath[sc.Path] = sc
	}
	meta := snapshotMeta{BootConfig: rec.BootConfig}
	for _, d := range chCfg.Disks {
		sc, ok := byPath[d.Path]
		if !ok {
			return fmt.Errorf("snapshot config has disk %q not present in VM record", d.Path)
		}
		copied := *sc
		meta.StorageConfigs = append(meta.StorageConfigs, &copied)
	}
	return writeJSONFile(filepath.Join(dir, snapshotMetaFile), meta)
}

func writeJSONFile(path string, v any) error {
	data, err := json.Marshal(v)
	if err != nil {
		return fmt.Errorf("marshal %s: %w", filepath.Base(path), err)
	}
	return os.WriteFile(path, data, 0o600)
}

func loadSnapshotMeta(dir string) (*snapshotMeta, error) {
	data, err := os.ReadFile(filepath.Join(dir, snapshotMetaFile)) //nolint:gosec // snapshot copy
	if err != nil {
		return nil, fmt.Errorf("read %s: %w", snapshotMetaFile, err)
	}
	var meta snapshotMeta
	if err := json.Unmarshal(data, &meta); err != nil {
		return nil, fmt.Errorf("decode %s: %w", snapshotMetaFile, err)
	}
	return &meta, nil
}

// parseCHConfig reads a CH config.json both typed and raw (patching keeps unknown keys).
func parseCHConfig(path string) (*guest.VMConfig, []byte, error) {
	data, err := os.ReadFile(path) //nolint:gosec // snapshot copy
	if err != nil {
		return nil, nil, fmt.Errorf("read %s: %w", path, err)
	}
	var cfg guest.VMConfig
	if err := json.Unmarshal(data, &cfg); err != nil {
		return nil, nil, fmt.Errorf("decode %s: %w", path, err)
	}
	return &cfg, data, nil
}

// hotAttachedError is cocoon's refusal to snapshot a VM with hot-attached devices, in its order:
// vhost-user-fs shares, then passed-through PCI devices, then disks.
func hotAttachedError(ctx context.Context, vm *cocoon.VM) error {
	const detach = "detach before snapshot or hibernate"
	if fs := attachedFsDevices(ctx, vm); len(fs) > 0 {
		return fmt.Errorf("hot-attached vhost-user-fs %q: %s", fs[0].Tag, detach)
	}
	if devs := attachedPCIDevices(ctx, vm); len(devs) > 0 {
		return fmt.Errorf("hot-attached device %q: %s", guest.SysfsPCIPrefix+devs[0].BDF, detach)
	}
	if disks := attachedDisks(ctx, vm); len(disks) > 0 {
		return fmt.Errorf("hot-attached disk %q: %s", disks[0].Name, detach)
	}
	return nil
}
