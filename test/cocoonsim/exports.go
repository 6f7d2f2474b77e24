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

// KillGuests SIGKILLs every simulated hypervisor whose pid file lies under runDir (the
// --run-dir given to the simulator) and waits for them to go. Test harnesses call it on cleanup,
// also after failures, so no guest outlives a test. A pid whose command line does not name its
// own VM directory (a recycled PID) is left alone.
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
		return nil
	}
	if err := syscall.Kill(pid, syscall.SIGKILL); err != nil && !errors.Is(err, syscall.ESRCH) {
		return fmt.Errorf("kill guest %d (%s): %w", pid, pidFile, err)
	}
	gone := func() (bool, error) { return !isProcessAlive(pid), nil }
	if err := waitFor(context.Background(), killWaitTimeout, 10*time.Millisecond, gone); err != nil {
		return fmt.Errorf("guest %d (%s) still alive after SIGKILL: %w", pid, pidFile, err)
	}
	return nil
}
