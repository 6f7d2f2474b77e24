package realguest

import (
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
)

func writeModuleIndex(t *testing.T, dep, builtin string) *moduleIndex {
	t.Helper()
	dir := t.TempDir()
	if err := os.WriteFile(filepath.Join(dir, "modules.dep"), []byte(dep), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "modules.builtin"), []byte(builtin), 0o644); err != nil {
		t.Fatal(err)
	}
	idx, err := readModuleIndex(dir)
	if err != nil {
		t.Fatal(err)
	}
	return idx
}

// The shape of Debian 6.1's modules.dep for the guest's modules: shared dependencies are loaded
// once, each before whatever needs it.
func TestLoadOrderPutsDependenciesFirst(t *testing.T) {
	idx := writeModuleIndex(t, `
kernel/drivers/virtio/virtio.ko: kernel/drivers/virtio/virtio_ring.ko
kernel/drivers/virtio/virtio_ring.ko:
kernel/drivers/virtio/virtio_pci.ko: kernel/drivers/virtio/virtio_pci_modern_dev.ko kernel/drivers/virtio/virtio.ko kernel/drivers/virtio/virtio_ring.ko
kernel/drivers/virtio/virtio_pci_modern_dev.ko:
kernel/drivers/net/virtio_net.ko: kernel/drivers/net/net_failover.ko kernel/net/core/failover.ko kernel/drivers/virtio/virtio.ko kernel/drivers/virtio/virtio_ring.ko
kernel/drivers/net/net_failover.ko: kernel/net/core/failover.ko
kernel/net/core/failover.ko:
kernel/drivers/input/evdev.ko:
`, "kernel/drivers/acpi/button.ko\n")

	order, err := idx.loadOrder([]string{"virtio_pci", "virtio_net", "button", "evdev"})
	if err != nil {
		t.Fatal(err)
	}
	want := []string{
		"kernel/drivers/virtio/virtio_pci_modern_dev.ko",
		"kernel/drivers/virtio/virtio_ring.ko",
		"kernel/drivers/virtio/virtio.ko",
		"kernel/drivers/virtio/virtio_pci.ko",
		"kernel/net/core/failover.ko",
		"kernel/drivers/net/net_failover.ko",
		"kernel/drivers/net/virtio_net.ko",
		"kernel/drivers/input/evdev.ko",
	}
	if !slices.Equal(order, want) {
		t.Fatalf("load order\n%s\nwant\n%s", strings.Join(order, "\n"), strings.Join(want, "\n"))
	}
}

func TestLoadOrderNamesWhatIsMissing(t *testing.T) {
	idx := writeModuleIndex(t, "kernel/a.ko: kernel/b.ko\n", "")
	if _, err := idx.loadOrder([]string{"virtio_net"}); err == nil || !strings.Contains(err.Error(), "virtio_net") {
		t.Errorf("unknown module: %v", err)
	}
	if _, err := idx.loadOrder([]string{"a"}); err == nil || !strings.Contains(err.Error(), "kernel/b.ko") {
		t.Errorf("dependency missing from modules.dep: %v", err)
	}
}
