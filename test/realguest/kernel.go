package realguest

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
)

// kernel is one unpacked Debian kernel: its image and the modules built for the same version.
type kernel struct {
	version    string
	image      string // boot/vmlinuz-<version>
	modulesDir string // lib/modules/<version>, with the modules.dep depmod wrote
}

// findKernel picks the newest kernel under root whose modules are there too; a vmlinuz without
// its modules.dep is unusable, since the guest's NIC driver is a module.
func findKernel(root string) (*kernel, error) {
	images, err := filepath.Glob(filepath.Join(root, "boot", "vmlinuz-*"))
	if err != nil {
		return nil, fmt.Errorf("look for kernels under %s: %w", root, err)
	}
	slices.Sort(images)
	for _, image := range slices.Backward(images) {
		version := strings.TrimPrefix(filepath.Base(image), "vmlinuz-")
		modulesDir := filepath.Join(root, "lib", "modules", version)
		if _, err := os.Stat(filepath.Join(modulesDir, "modules.dep")); err != nil {
			if errors.Is(err, os.ErrNotExist) {
				continue
			}
			return nil, fmt.Errorf("kernel %s: %w", version, err)
		}
		return &kernel{version: version, image: image, modulesDir: modulesDir}, nil
	}
	return nil, fmt.Errorf("no kernel with modules.dep under %s: %w", root, ErrNotInstalled)
}
