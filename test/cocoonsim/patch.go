package cocoonsim

import (
	"encoding/json"
	"fmt"
	"os"

	"github.com/cocoonstack/cocoon-cri/pkg/cocoon"
	"github.com/cocoonstack/cocoon-cri/test/cocoonsim/guest"
)

// patchCHConfig rewrites a cloned snapshot's config.json for the new VM (disk paths and
// settings, console devices, vCPUs, memory and balloon) while keeping keys it does not know,
// as cocoon's patchCHConfig.
func patchCHConfig(path string, raw []byte, chCfg *guest.VMConfig, storage []*cocoon.StorageConfig, spec *vmSpec, direct bool, consoleSock string) error {
	var cfg map[string]json.RawMessage
	if err := json.Unmarshal(raw, &cfg); err != nil {
		return fmt.Errorf("decode raw %s: %w", path, err)
	}
	var disks []map[string]json.RawMessage
	if d, ok := cfg["disks"]; ok {
		if err := json.Unmarshal(d, &disks); err != nil {
			return fmt.Errorf("patch disks: decode array: %w", err)
		}
	}
	if len(storage) != len(disks) {
		return fmt.Errorf("disk count mismatch: storageConfigs=%d, CH config=%d", len(storage), len(disks))
	}
	queueSize := spec.DiskQueueSize
	if queueSize <= 0 {
		queueSize = defaultDiskQueueSize
	}
	for i, sc := range storage {
		directIO := !sc.RO && !spec.NoDirectIO
		if sc.DirectIO != nil {
			directIO = *sc.DirectIO
		}
		setJSON(disks[i], "path", sc.Path)
		setJSON(disks[i], "queue_size", queueSize)
		setJSON(disks[i], "direct", directIO)
	}
	if len(disks) > 0 {
		setJSON(cfg, "disks", disks)
	}
	if direct {
		setJSON(cfg, "serial", guest.RuntimeFile{Mode: guest.ModeOff})
		setJSON(cfg, "console", guest.RuntimeFile{Mode: guest.ModePty})
	} else {
		setJSON(cfg, "serial", guest.RuntimeFile{Mode: guest.ModeSocket, Socket: consoleSock})
		setJSON(cfg, "console", guest.RuntimeFile{Mode: guest.ModeOff})
	}
	if spec.CPU > 0 {
		if err := patchObject(cfg, "cpus", "boot_vcpus", spec.CPU); err != nil {
			return fmt.Errorf("patch cpus: %w", err)
		}
	}
	if spec.Memory > 0 {
		if err := patchObject(cfg, "memory", "size", spec.Memory); err != nil {
			return fmt.Errorf("patch memory: %w", err)
		}
		switch {
		case spec.Windows || spec.Memory < minBalloonMemory:
			delete(cfg, "balloon")
		case chCfg.Balloon != nil:
			if err := patchObject(cfg, "balloon", "size", spec.Memory/balloonDivisor); err != nil {
				return fmt.Errorf("patch balloon: %w", err)
			}
		default:
			setJSON(cfg, "balloon", guest.Balloon{Size: spec.Memory / balloonDivisor, DeflateOnOOM: true, FreePageReporting: true})
		}
	}
	out, err := json.Marshal(cfg)
	if err != nil {
		return fmt.Errorf("marshal patched config: %w", err)
	}
	return os.WriteFile(path, out, 0o600)
}

func setJSON(obj map[string]json.RawMessage, key string, value any) {
	raw, _ := json.Marshal(value) // values are plain data and always marshal
	obj[key] = raw
}

func patchObject(cfg map[string]json.RawMessage, key, field string, value any) error {
	obj := map[string]json.RawMessage{}
	if raw, ok := cfg[key]; ok {
		if err := json.Unmarshal(raw, &obj); err != nil {
			return fmt.Errorf("decode object: %w", err)
		}
	}
	setJSON(obj, field, value)
	setJSON(cfg, key, obj)
	return nil
}

// diskPathReplacements maps the snapshot's disk paths to the clone's, for state.json.
func diskPathReplacements(chCfg *guest.VMConfig, storage []*cocoon.StorageConfig) map[string]string {
	m := map[string]string{}
	for i := range min(len(chCfg.Disks), len(storage)) {
		if storage[i].Path != chCfg.Disks[i].Path {
			m[chCfg.Disks[i].Path] = storage[i].Path
		}
	}
	return m
}

// patchStateJSON replaces disk paths (string values under "path" or "disk_path") in state.json.
func patchStateJSON(path string, replacements map[string]string) error {
	if len(replacements) == 0 {
		return nil
	}
	data, err := os.ReadFile(path) //nolint:gosec // clone run dir
	if err != nil {
		return fmt.Errorf("read %s: %w", path, err)
	}
	var root any
	if err := json.Unmarshal(data, &root); err != nil {
		return fmt.Errorf("decode %s: %w", path, err)
	}
	out, err := json.Marshal(replacePaths(root, "", replacements))
	if err != nil {
		return fmt.Errorf("marshal patched state: %w", err)
	}
	return os.WriteFile(path, out, 0o600)
}

func replacePaths(v any, key string, replacements map[string]string) any {
	switch val := v.(type) {
	case map[string]any:
		for k, child := range val {
			val[k] = replacePaths(child, k, replacements)
		}
	case []any:
		for i, child := range val {
			val[i] = replacePaths(child, "", replacements)
		}
	case string:
		if newPath, ok := replacements[val]; ok && (key == "path" || key == "disk_path") {
			return newPath
		}
	}
	return v
}
