package cocoonsim

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"time"

	"github.com/cocoonstack/cocoon-cri/pkg/cocoon"
)

var (
	errVMNotFound   = errors.New("VM not found")
	errVMNotRunning = errors.New("VM not running")
	errVMAmbiguous  = errors.New("VM ref resolves to multiple backends")
)

// bootConfig is how a VM boots (cocoon's types.BootConfig): a kernel for direct boot, firmware
// for UEFI.
type bootConfig struct {
	KernelPath   string `json:"kernel_path,omitempty"`
	InitrdPath   string `json:"initrd_path,omitempty"`
	Cmdline      string `json:"cmdline,omitempty"`
	FirmwarePath string `json:"firmware_path,omitempty"`
}

func (b *bootConfig) directBoot() bool { return b != nil && b.KernelPath != "" }

// vmRecord is one entry of <root>/<backend>/db/vms.json (cocoon's hypervisor.VMRecord): the
// printed VM plus what only the backend needs.
type vmRecord struct {
	cocoon.VM
	BootConfig   *bootConfig         `json:"boot_config,omitempty"`
	ImageBlobIDs map[string]struct{} `json:"image_blob_ids,omitempty"`
	RunDir       string              `json:"run_dir,omitempty"`
	LogDir       string              `json:"log_dir,omitempty"`
}

// vmIndex is the whole vms.json.
type vmIndex struct {
	VMs   map[string]*vmRecord `json:"vms"`
	Names map[string]string    `json:"names"`
}

func (idx *vmIndex) initMaps() {
	if idx.VMs == nil {
		idx.VMs = map[string]*vmRecord{}
	}
	if idx.Names == nil {
		idx.Names = map[string]string{}
	}
}

func (b *backend) resolveRef(ctx context.Context, ref string) (string, error) {
	var id string
	return id, b.db.With(ctx, func(idx *vmIndex) error {
		var err error
		id, err = resolveRef(idx.VMs, idx.Names, ref, errVMNotFound)
		return err
	})
}

func (b *backend) resolveRefs(ctx context.Context, refs []string) ([]string, error) {
	var ids []string
	return ids, b.db.With(ctx, func(idx *vmIndex) error {
		var err error
		ids, err = resolveRefs(idx.VMs, idx.Names, refs, errVMNotFound)
		return err
	})
}

// inspect returns the printed form of one VM (not reconciled).
func (b *backend) inspect(ctx context.Context, ref string) (*cocoon.VM, error) {
	var vm *cocoon.VM
	return vm, b.db.With(ctx, func(idx *vmIndex) error {
		id, err := resolveRef(idx.VMs, idx.Names, ref, errVMNotFound)
		if err != nil {
			return err
		}
		vm = b.toVM(idx.VMs[id])
		return nil
	})
}

func (b *backend) list(ctx context.Context) ([]*cocoon.VM, error) {
	var vms []*cocoon.VM
	return vms, b.db.With(ctx, func(idx *vmIndex) error {
		for _, rec := range idx.VMs {
			if rec != nil {
				vms = append(vms, b.toVM(rec))
			}
		}
		return nil
	})
}

// toVM is what cocoon prints for a record: the PID (from the pid file) and API socket appear only
// while the record says running, whether or not that process still exists.
func (b *backend) toVM(rec *vmRecord) *cocoon.VM {
	vm := rec.VM
	vm.Hypervisor = b.kind.typ
	if vm.State == cocoon.VMStateRunning {
		vm.SocketPath = apiSocketPath(rec.RunDir)
		vm.PID, _ = readPIDFile(b.pidFilePath(rec.RunDir))
	}
	vm.SnapshotIDs = maps.Clone(vm.SnapshotIDs)
	return &vm
}

func (b *backend) loadRecord(ctx context.Context, id string) (vmRecord, error) {
	var rec vmRecord
	return rec, b.db.With(ctx, func(idx *vmIndex) error {
		r := idx.VMs[id]
		if r == nil {
			return fmt.Errorf("%q not found", id)
		}
		rec = *r
		return nil
	})
}

// reserveVM writes the "creating" placeholder that claims the name.
func (b *backend) reserveVM(ctx context.Context, id string, cfg cocoon.VMConfig, blobIDs map[string]struct{}, runDir, logDir string) error {
	now := time.Now()
	return b.db.Update(ctx, func(idx *vmIndex) error {
		if idx.VMs[id] != nil {
			return fmt.Errorf("id collision %q (retry)", id)
		}
		if dup, ok := idx.Names[cfg.Name]; ok {
			return fmt.Errorf("vm name %q already exists (id: %s)", cfg.Name, dup)
		}
		idx.VMs[id] = &vmRecord{
			VM: cocoon.VM{
				ID: id, Hypervisor: b.kind.typ, State: cocoon.VMStateCreating,
				Config: cfg, CreatedAt: now, UpdatedAt: now,
			},
			ImageBlobIDs: blobIDs,
			RunDir:       runDir,
			LogDir:       logDir,
		}
		idx.Names[cfg.Name] = id
		return nil
	})
}

// rollbackCreate drops a placeholder (and its name) after a failed create or clone.
func (b *backend) rollbackCreate(ctx context.Context, id, name string) {
	if err := b.db.Update(ctx, func(idx *vmIndex) error {
		delete(idx.VMs, id)
		if name != "" && idx.Names[name] == id {
			delete(idx.Names, name)
		}
		return nil
	}); err != nil {
		b.log.with(b.kind.typ+".RollbackCreate").Warnf("rollback VM %s (name=%s): %v", id, name, err)
	}
}

// finalizeCreate replaces the placeholder with the prepared VM.
func (b *backend) finalizeCreate(ctx context.Context, id string, vm *cocoon.VM, boot *bootConfig, blobIDs map[string]struct{}) error {
	return b.db.Update(ctx, func(idx *vmIndex) error {
		existing := idx.VMs[id]
		if existing == nil {
			return fmt.Errorf("vm %s disappeared from index", id)
		}
		idx.VMs[id] = &vmRecord{VM: *vm, BootConfig: boot, ImageBlobIDs: blobIDs, RunDir: existing.RunDir, LogDir: existing.LogDir}
		return nil
	})
}

func (b *backend) finalizeClone(ctx context.Context, id string, vm *cocoon.VM, boot *bootConfig) error {
	return b.db.Update(ctx, func(idx *vmIndex) error {
		r := idx.VMs[id]
		if r == nil {
			return fmt.Errorf("vm %s disappeared from index", id)
		}
		r.VM = *vm
		r.BootConfig = boot
		r.FirstBooted = true
		return nil
	})
}

func (b *backend) updateStates(ctx context.Context, ids []string, state cocoon.VMState) error {
	if len(ids) == 0 {
		return nil
	}
	now := time.Now()
	return b.db.Update(ctx, func(idx *vmIndex) error {
		for _, id := range ids {
			r := idx.VMs[id]
			if r == nil {
				continue
			}
			r.State = state
			r.UpdatedAt = now
			switch state {
			case cocoon.VMStateRunning:
				r.StartedAt = &now
			case cocoon.VMStateStopped:
				r.StoppedAt = &now
			}
		}
		return nil
	})
}

func (b *backend) markError(ctx context.Context, id string) {
	if err := b.updateStates(ctx, []string{id}, cocoon.VMStateError); err != nil {
		b.log.with(b.kind.typ+".MarkError").Warnf("mark VM %s error: %v", id, err)
	}
}

// batchMarkStarted marks started VMs running; like cocoon it also refreshes started_at of VMs
// that were already running.
func (b *backend) batchMarkStarted(ctx context.Context, ids []string) error {
	if len(ids) == 0 {
		return nil
	}
	now := time.Now()
	return b.db.Update(ctx, func(idx *vmIndex) error {
		for _, id := range ids {
			if r := idx.VMs[id]; r != nil {
				r.State = cocoon.VMStateRunning
				r.StartedAt = &now
				r.UpdatedAt = now
				r.FirstBooted = true
			}
		}
		return nil
	})
}

// recordSnapshot allocates a snapshot ID and records it on the VM it was taken from.
func (b *backend) recordSnapshot(ctx context.Context, vmID string) (string, error) {
	snapID := generateID()
	if err := b.db.Update(ctx, func(idx *vmIndex) error {
		r := idx.VMs[vmID]
		if r == nil {
			return fmt.Errorf("vm %s disappeared from index", vmID)
		}
		if r.SnapshotIDs == nil {
			r.SnapshotIDs = map[string]struct{}{}
		}
		r.SnapshotIDs[snapID] = struct{}{}
		return nil
	}); err != nil {
		return "", fmt.Errorf("record snapshot on VM: %w", err)
	}
	return snapID, nil
}

func (b *backend) deleteRecord(ctx context.Context, id string) error {
	return b.db.Update(ctx, func(idx *vmIndex) error {
		r := idx.VMs[id]
		if r == nil {
			return errVMNotFound
		}
		delete(idx.Names, r.Config.Name)
		delete(idx.VMs, id)
		return nil
	})
}

// unrecordSnapshot drops a snapshot ID from its VM again after the snapshot failed to persist;
// best effort, as in cocoon (a leftover ID is cosmetic).
func (b *backend) unrecordSnapshot(ctx context.Context, vmID, snapID string) {
	if err := b.db.Update(ctx, func(idx *vmIndex) error {
		if r := idx.VMs[vmID]; r != nil {
			delete(r.SnapshotIDs, snapID)
		}
		return nil
	}); err != nil {
		b.log.with(b.kind.typ+".UnrecordSnapshot").Warnf("unrecord snapshot %s on %s: %v", snapID, vmID, err)
	}
}

// finalizeRestore marks a restored VM running with the configuration its snapshot restored
// (cocoon's FinalizeRestore).
func (b *backend) finalizeRestore(ctx context.Context, id string, cfg cocoon.VMConfig) error {
	now := time.Now()
	return b.db.Update(ctx, func(idx *vmIndex) error {
		r := idx.VMs[id]
		if r == nil {
			return fmt.Errorf("vm %s disappeared from index", id)
		}
		r.Config = cfg
		r.State = cocoon.VMStateRunning
		r.StartedAt, r.StoppedAt, r.UpdatedAt = &now, nil, now
		return nil
	})
}
