package cocoonsim

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"syscall"
	"time"

	"github.com/cocoonstack/cocoon-cri/test/cocoonsim/guest"
	"github.com/cocoonstack/cocoon-cri/test/cocoonsim/internal/nocloud"
)

// SeedOCIImage stores an OCI image under rootDir exactly as `cocoon image import NAME layer.tar`
// leaves it (index entry, layer blob, boot files), but without running mkfs.erofs, which this host
// may lack. Tests and demos use it to get an image that `vm create`/`vm run` can boot; the layer
// must hold boot/vmlinuz and boot/initrd.img (testimage.WriteOCILayer writes one). It returns the
// image ID ("sha256:...").
func SeedOCIImage(ctx context.Context, rootDir, name string, layer io.Reader) (string, error) {
	store, err := newOCIStore(rootDir)
	if err != nil {
		return "", fmt.Errorf("init oci backend: %w", err)
	}
	digest, err := store.importLayers(ctx, name, "process layer", []io.Reader{layer}, false)
	if err != nil {
		return "", fmt.Errorf("seed image %s: %w", name, err)
	}
	return digest, nil
}

// CidataFiles reads a cloud image VM's cloud-init seed (the path of its storage config with role
// cidata) as its guest does, and returns the NoCloud files on it by name: meta-data, user-data
// and, when the VM has NICs, network-config. Anything but the FAT12 seed cocoon writes is an error.
func CidataFiles(path string) (map[string][]byte, error) {
	seed, err := nocloud.Read(path)
	if err != nil {
		return nil, err
	}
	files := map[string][]byte{nocloud.MetaDataFile: seed.MetaData, nocloud.UserDataFile: seed.UserData}
	if seed.NetworkConfig != nil {
		files[nocloud.NetworkConfigFile] = seed.NetworkConfig
	}
	return files, nil
}

// GuestOSPID returns the PID of the guest OS process of a running simulated VM, given the
// hypervisor's PID (vm inspect's pid), or 0 when the VM runs no guest. Its network and UTS
// namespaces are the guest's: `nsenter -t PID -n -u CMD` runs CMD "inside the guest".
func GuestOSPID(hypervisorPID int) (int, error) {
	return guest.OSPID(hypervisorPID)
}

// KillGuests SIGKILLs every simulated hypervisor whose pid file lies under runDir (the
// --run-dir given to the simulator) and waits for them, and for their guest OS processes, to go.
// Test harnesses call it on cleanup, also after failures, so no guest outlives a test. A pid
// whose command line does not name its own VM directory (a recycled PID) is left alone.
func KillGuests(runDir string) error {
	var errs []error
	for _, kind := range []backendKind{kindCH, kindFC} {
		pidFiles, err := filepath.Glob(filepath.Join(runDir, kind.dir, "*", kind.pidFile))
		if err != nil {
			return err
		}
		for _, pidFile := range pidFiles {
			if err := killGuest(pidFile); err != nil {
				errs = append(errs, err)
			}
		}
	}
	return errors.Join(errs...)
}

func killGuest(pidFile string) error {
	pid, err := readPIDFile(pidFile)
	if err != nil {
		if errors.Is(err, os.ErrNotExist) {
			return nil
		}
		return err
	}
	if !verifyProcessCmdline(pid, "", apiSocketPath(filepath.Dir(pidFile))) {
		held, err := guest.ReleaseZombie(pid)
		if !held || err != nil {
			return err
		}
		return waitGone(pidFile, pid)
	}
	osPID, _ := guest.OSPID(pid)
	if err := syscall.Kill(pid, syscall.SIGKILL); err != nil && !errors.Is(err, syscall.ESRCH) {
		return fmt.Errorf("kill guest %d (%s): %w", pid, pidFile, err)
	}
	// The guest OS process ends by itself once its hypervisor is gone. Under NoReapEnv the killed
	// hypervisor stays a zombie until its shim lets go.
	return waitGone(pidFile, pid, osPID)
}

func waitGone(pidFile string, pids ...int) error {
	for _, p := range pids {
		gone := func() (bool, error) {
			if held, err := guest.ReleaseZombie(p); held || err != nil {
				return false, err
			}
			return !isProcessAlive(p), nil
		}
		if err := waitFor(context.Background(), killWaitTimeout, 10*time.Millisecond, gone); err != nil {
			return fmt.Errorf("guest %d (%s) still alive after SIGKILL: %w", p, pidFile, err)
		}
	}
	return nil
}
