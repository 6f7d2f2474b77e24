package main

import (
	"os"
	"path/filepath"
	"testing"

	"github.com/cocoonstack/cocoon-cri/test/cocoonsim/guest"
)

func TestQCOW2TakesGuestFlags(t *testing.T) {
	path := filepath.Join(t.TempDir(), "disk.qcow2")
	root := rootCommand()
	root.SetArgs([]string{"qcow2", "--size", "2G", "--http-port", "80", "--fail-boot", "-o", path})
	if err := root.Execute(); err != nil {
		t.Fatal(err)
	}
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close() //nolint:errcheck
	data, err := guest.ReadQCOW2Spec(f)
	if err != nil {
		t.Fatal(err)
	}
	if spec, err := guest.ParseSpec(data); err != nil || spec != (guest.Spec{HTTPPort: 80, FailBoot: true}) {
		t.Fatalf("behaviour in the image: %+v, %v", spec, err)
	}
}
