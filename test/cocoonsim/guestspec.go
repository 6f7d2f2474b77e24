package cocoonsim

import (
	"archive/tar"
	"bytes"
	"fmt"
	"io"
	"os"
	"path/filepath"

	"github.com/cocoonstack/cocoon-cri/pkg/cocoon"
	"github.com/cocoonstack/cocoon-cri/test/cocoonsim/guest"
)

// installGuestSpec gives a new VM its image's guest behaviour, copied into the run dir where the
// simulated guest reads it at every boot: for an OCI image the behaviour file found at the root
// of its layers (the last layer that has one wins), for a cloud image the JSON in its base
// qcow2's header extension (guest.QCOW2SpecExtension). Images without one get the default guest.
// (Snapshot clones need nothing here: the file travels with the snapshot's data files.)
func installGuestSpec(runDir string, storage []*cocoon.StorageConfig) error {
	var spec []byte
	for _, sc := range storage {
		if sc.Role != cocoon.StorageRoleLayer {
			continue
		}
		found, err := readSpecFromLayer(sc.Path)
		if err != nil {
			return fmt.Errorf("read guest behaviour from %s: %w", sc.Path, err)
		}
		if found != nil {
			spec = found
		}
	}
	if spec == nil {
		return nil
	}
	if _, err := guest.ParseSpec(spec); err != nil {
		return err
	}
	return os.WriteFile(filepath.Join(runDir, guest.SpecFile), spec, 0o600)
}

// readSpecFromLayer looks for the behaviour in a layer blob: a cloud image's qcow2 keeps it in a
// header extension; the simulator stores OCI layers as tars, and a blob that is neither (a real
// EROFS image) simply has none.
func readSpecFromLayer(path string) ([]byte, error) {
	f, err := os.Open(path) //nolint:gosec // image blob
	if err != nil {
		return nil, err
	}
	defer f.Close() //nolint:errcheck
	magic := make([]byte, len(qcow2Magic))
	if _, err := f.ReadAt(magic, 0); err == nil && bytes.Equal(magic, qcow2Magic) {
		return guest.ReadQCOW2Spec(f)
	}
	tr := tar.NewReader(f)
	for {
		hdr, err := tr.Next()
		if err != nil {
			return nil, nil //nolint:nilerr // end of archive, or not a tar at all
		}
		if hdr.Typeflag == tar.TypeReg && filepath.Clean(hdr.Name) == guest.SpecFile {
			return io.ReadAll(tr)
		}
	}
}
