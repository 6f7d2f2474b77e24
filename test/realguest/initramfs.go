package realguest

import (
	"compress/gzip"
	_ "embed"
	"fmt"
	"os"
	"os/exec"
	"path"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
)

//go:embed init.sh
var initScript string

// guestModules are what the guest loads: the virtio-pci transport (the engine's q35 machine, like
// cloud-hypervisor, puts virtio devices on PCI); the NIC; cloud-hypervisor's direct-boot console
// (virtio-console, hvc0); and the ACPI power button with evdev, through which acpid sees it.
var guestModules = []string{"virtio_pci", "virtio_net", "virtio_console", "button", "evdev"}

const (
	helloScript = "#!/bin/sh\nexec cat /etc/realguest/hello\n"
	powerScript = "#!/bin/sh\necho \"" + PowerOffMarker + "\" >/dev/console\nexec poweroff -f\n"
)

// writeInitramfs writes the gzip'd newc archive the guest boots from to dst.
func writeInitramfs(dst, busybox string, k *kernel) (err error) {
	idx, err := readModuleIndex(k.modulesDir)
	if err != nil {
		return fmt.Errorf("kernel %s: %w", k.version, err)
	}
	modules, err := idx.loadOrder(guestModules)
	if err != nil {
		return fmt.Errorf("kernel %s: %w", k.version, err)
	}
	applets, err := busyboxApplets(busybox)
	if err != nil {
		return err
	}
	bin, err := os.ReadFile(busybox)
	if err != nil {
		return fmt.Errorf("read busybox: %w", err)
	}

	f, err := os.Create(dst)
	if err != nil {
		return fmt.Errorf("create initramfs: %w", err)
	}
	defer func() {
		if cerr := f.Close(); err == nil && cerr != nil {
			err = fmt.Errorf("close initramfs: %w", cerr)
		}
	}()
	zw := gzip.NewWriter(f)
	a := &archive{cpio: &cpioWriter{w: zw}, names: map[string]bool{}}

	script := strings.NewReplacer(
		"@PORT@", strconv.Itoa(ServicePort),
		"@READY@", ReadyMarker,
		"@FAILED@", FailedMarker,
		"@NAMESERVERS@", NameserversMarker,
	).Replace(initScript)
	a.file("init", 0o755, []byte(script))
	a.file("bin/busybox", 0o755, bin)
	for _, applet := range applets {
		// The archive's own files win over applets of the same name (busybox has an "init").
		if !a.has(applet) {
			a.symlink(applet, "/bin/busybox")
		}
	}
	a.file("bin/realguest-hello", 0o755, []byte(helloScript))
	a.file("etc/acpi/PWRF/00000080", 0o755, []byte(powerScript))
	a.charDev("dev/console", 5, 1) // the kernel opens it before /init mounts devtmpfs
	for _, dir := range []string{"proc", "sys", "tmp", "var/log", "var/run"} {
		a.mkdirAll(dir)
	}
	var list strings.Builder
	for _, m := range modules {
		data, err := os.ReadFile(filepath.Join(k.modulesDir, m))
		if err != nil {
			return fmt.Errorf("read module: %w", err)
		}
		rel := path.Join(k.version, m)
		a.file(path.Join("lib/modules", rel), 0o644, data)
		fmt.Fprintln(&list, rel)
	}
	a.file("etc/realguest/modules", 0o644, []byte(list.String()))

	if a.err == nil {
		a.err = a.cpio.close()
	}
	if a.err != nil {
		return fmt.Errorf("write initramfs: %w", a.err)
	}
	if err := zw.Close(); err != nil {
		return fmt.Errorf("compress initramfs: %w", err)
	}
	return nil
}

// busyboxApplets asks busybox which applets it has, as paths ("usr/bin/nc").
func busyboxApplets(busybox string) ([]string, error) {
	out, err := exec.Command(busybox, "--list-full").Output()
	if err != nil {
		return nil, fmt.Errorf("list busybox applets: %w", err)
	}
	applets := strings.Fields(string(out))
	if !slices.Contains(applets, "bin/sh") {
		return nil, fmt.Errorf("busybox %s has no bin/sh applet", busybox)
	}
	return applets, nil
}

// archive adds parent directories before their entries, as the kernel's unpacker needs, and
// keeps the first error so the many writes above stay readable.
type archive struct {
	cpio  *cpioWriter
	names map[string]bool // every entry written so far, directories included
	err   error
}

func (a *archive) has(name string) bool { return a.names[name] }

func (a *archive) mkdirAll(dir string) {
	if dir == "." || a.names[dir] {
		return
	}
	a.mkdirAll(path.Dir(dir))
	a.names[dir] = true
	a.do(func() error { return a.cpio.dir(dir) })
}

func (a *archive) file(name string, perm uint32, data []byte) {
	a.add(name, func() error { return a.cpio.file(name, perm, data) })
}

func (a *archive) symlink(name, target string) {
	a.add(name, func() error { return a.cpio.symlink(name, target) })
}

func (a *archive) charDev(name string, major, minor uint32) {
	a.add(name, func() error { return a.cpio.charDev(name, major, minor) })
}

func (a *archive) add(name string, write func() error) {
	a.mkdirAll(path.Dir(name))
	a.names[name] = true
	a.do(write)
}

func (a *archive) do(write func() error) {
	if a.err == nil {
		a.err = write()
	}
}
