package cocoonsim

import (
	"context"
	"fmt"
	"path/filepath"
	"strings"

	"github.com/cocoonstack/cocoon-cri/pkg/cocoon"
)

// Data disk filesystems.
const (
	fsTypeExt4 = "ext4"
	fsTypeNone = "none"
)

// minDataDiskSize is cocoon's 16 MiB floor for --data-disk.
const minDataDiskSize int64 = 16 << 20

var dataDiskNameRe = lazyRegexp(`^[a-z][a-z0-9_-]{0,19}$`)

// dataDiskSpec is one parsed --data-disk.
type dataDiskSpec struct {
	Name          string
	Size          int64
	FSType        string
	MountPoint    string
	MountPointSet bool
	DirectIO      *bool
}

func validDataDiskName(s string) bool {
	return dataDiskNameRe().MatchString(s) && !strings.HasPrefix(s, "cocoon-")
}

// dataDiskFileName is the file a data disk lives in, inside the VM's run directory.
func dataDiskFileName(serial string) string { return "data-" + serial + ".raw" }

// parseDataDiskFlags parses and normalises every --data-disk (cocoon's parseDataDiskFlags).
func parseDataDiskFlags(raw []string) ([]dataDiskSpec, error) {
	specs := make([]dataDiskSpec, 0, len(raw))
	for _, s := range raw {
		spec, err := parseDataDiskSpec(s)
		if err != nil {
			return nil, err
		}
		specs = append(specs, spec)
	}
	return specs, normalizeDataDiskSpecs(specs)
}

func parseDataDiskSpec(s string) (dataDiskSpec, error) {
	var spec dataDiskSpec
	if s == "" {
		return spec, fmt.Errorf("--data-disk: empty spec")
	}
	for part := range strings.SplitSeq(s, ",") {
		key, val, ok := strings.Cut(part, "=")
		if !ok {
			return spec, fmt.Errorf("--data-disk: %q is not key=value", part)
		}
		key, val = strings.TrimSpace(key), strings.TrimSpace(val)
		switch key {
		case "size":
			n, err := ramInBytes(val)
			if err != nil {
				return spec, fmt.Errorf("--data-disk: invalid size %q: %w", val, err)
			}
			if n < minDataDiskSize {
				return spec, fmt.Errorf("--data-disk: size %s below 16MiB minimum", val)
			}
			spec.Size = n
		case "name":
			if !validDataDiskName(val) {
				return spec, fmt.Errorf("--data-disk: invalid name %q (must match [a-z][a-z0-9_-]{0,19}, no cocoon- prefix)", val)
			}
			spec.Name = val
		case "fstype":
			if val != fsTypeExt4 && val != fsTypeNone {
				return spec, fmt.Errorf("--data-disk: unsupported fstype %q (only ext4, none in Phase 1)", val)
			}
			spec.FSType = val
		case "mount":
			spec.MountPoint, spec.MountPointSet = val, true
		case "directio":
			switch val {
			case "on", "off":
				on := val == "on"
				spec.DirectIO = &on
			case "auto":
			default:
				return spec, fmt.Errorf("--data-disk: directio must be on/off/auto, got %q", val)
			}
		default:
			return spec, fmt.Errorf("--data-disk: unknown key %q", key)
		}
	}
	if spec.Size == 0 {
		return spec, fmt.Errorf("--data-disk: size= required")
	}
	return spec, nil
}

func normalizeDataDiskSpecs(specs []dataDiskSpec) error {
	used := map[string]bool{}
	for _, s := range specs {
		if s.Name == "" {
			continue
		}
		if used[s.Name] {
			return fmt.Errorf("--data-disk: name %q duplicated", s.Name)
		}
		used[s.Name] = true
	}
	next := 1
	for i := range specs {
		s := &specs[i]
		if s.FSType == "" {
			s.FSType = fsTypeExt4
		}
		for s.Name == "" {
			if candidate := fmt.Sprintf("data%d", next); !used[candidate] {
				s.Name, used[candidate] = candidate, true
			}
			next++
		}
		if !s.MountPointSet && s.FSType != fsTypeNone {
			s.MountPoint = "/mnt/" + s.Name
		}
		if s.FSType == fsTypeNone && s.MountPoint != "" {
			return fmt.Errorf("--data-disk %s: fstype=none requires empty mount", s.Name)
		}
	}
	return nil
}

// prepareDataDisks creates each data disk as a sparse file (formatted with mkfs.ext4 unless
// fstype=none) and returns its storage config.
func prepareDataDisks(ctx context.Context, runDir string, specs []dataDiskSpec) ([]*cocoon.StorageConfig, error) {
	var out []*cocoon.StorageConfig
	for _, spec := range specs {
		path := filepath.Join(runDir, dataDiskFileName(spec.Name))
		if err := createSparseFile(path, spec.Size); err != nil {
			return nil, fmt.Errorf("data disk %s: %w", spec.Name, err)
		}
		if spec.FSType == fsTypeExt4 {
			if err := mkfsExt4(ctx, path); err != nil {
				return nil, fmt.Errorf("data disk %s: mkfs: %w", spec.Name, err)
			}
		}
		out = append(out, &cocoon.StorageConfig{
			Path: path, Serial: spec.Name, Role: cocoon.StorageRoleData,
			MountPoint: spec.MountPoint, FSType: spec.FSType, DirectIO: spec.DirectIO,
		})
	}
	return out, nil
}
