package vfio_test

import (
	"errors"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"testing"

	"github.com/cocoonstack/cocoon-cri/pkg/vfio"
	"github.com/cocoonstack/cocoon-cri/test/fakesysfs"
)

func TestClassify(t *testing.T) {
	dir := t.TempDir()
	group := fakesysfs.GroupNode(t, dir, "12")
	container := fakesysfs.GroupNode(t, dir, "vfio")
	noiommu := fakesysfs.GroupNode(t, dir, "noiommu-3")
	other := fakesysfs.GroupNode(t, dir, "devices")
	regular := filepath.Join(dir, "vfio", "7")
	if err := os.WriteFile(regular, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	notVFIODir := filepath.Join(t.TempDir(), "12")
	if err := os.WriteFile(notVFIODir, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		path      string
		mode      fs.FileMode
		wantNode  vfio.Node
		wantGroup string
	}{
		{group, 0, vfio.Group, "12"},
		{container, 0, vfio.Container, ""},
		{noiommu, 0, vfio.NoIOMMUGroup, "3"},
		{other, 0, vfio.NotVFIO, ""},
		{regular, 0, vfio.NotVFIO, ""},
		{"/dev/fuse", fs.ModeDevice | fs.ModeCharDevice, vfio.NotVFIO, ""},
		{"/dev/vfio/5", fs.ModeDevice | fs.ModeCharDevice, vfio.Group, "5"},
		{"/dev/vfio/5", fs.ModeDevice, vfio.NotVFIO, ""},
	} {
		mode := tc.mode
		if mode == 0 {
			info, err := os.Stat(tc.path)
			if err != nil {
				t.Fatal(err)
			}
			mode = info.Mode()
		}
		node, group := vfio.Classify(tc.path, mode)
		if node != tc.wantNode || group != tc.wantGroup {
			t.Errorf("Classify(%s, %v) = %v %q, want %v %q", tc.path, mode, node, group, tc.wantNode, tc.wantGroup)
		}
	}
}

func TestGroupDevices(t *testing.T) {
	root := t.TempDir()
	fakesysfs.AddPCIDevice(t, root, "7", "0000:01:00.1", "")
	fakesysfs.AddPCIDevice(t, root, "7", "0000:01:00.0", vfio.Driver)
	fakesysfs.AddPCIDevice(t, root, "8", "0000:02:00.0", "nvidia")
	sys := vfio.Sysfs(root)

	devs, err := sys.GroupDevices("7")
	if err != nil {
		t.Fatal(err)
	}
	want := []vfio.Device{{BDF: "0000:01:00.0", Driver: vfio.Driver}, {BDF: "0000:01:00.1"}}
	if !slices.Equal(devs, want) {
		t.Errorf("group 7: %v, want %v", devs, want)
	}
	devs, err = sys.GroupDevices("8")
	if err != nil || !slices.Equal(devs, []vfio.Device{{BDF: "0000:02:00.0", Driver: "nvidia"}}) {
		t.Errorf("group 8: %v, %v", devs, err)
	}
	if _, err := sys.GroupDevices("9"); !errors.Is(err, vfio.ErrNoGroup) {
		t.Errorf("group 9: %v, want ErrNoGroup", err)
	}
	if err := os.MkdirAll(filepath.Join(root, "kernel", "iommu_groups", "10", "devices"), 0o755); err != nil {
		t.Fatal(err)
	}
	if _, err := sys.GroupDevices("10"); err == nil {
		t.Error("an empty group was listed without an error")
	}
}
