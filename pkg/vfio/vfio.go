// Package vfio finds the PCI devices behind a VFIO group's device node. A device plugin hands a
// passthrough device (a GPU, a NIC's virtual function) to a container as /dev/vfio/<group>, often
// with the container node /dev/vfio/vfio; a VM takes the group's PCI devices instead, by address,
// and the kernel's sysfs says which they are.
package vfio

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
)

// Driver is the host driver a device must be bound to before a hypervisor can take it.
const Driver = "vfio-pci"

// groupRE is a group node's name: the IOMMU group's number. noiommu-<n> groups (VFIO without
// an IOMMU) are told apart, since no hypervisor passes them through.
var groupRE = regexp.MustCompile(`^(noiommu-)?([0-9]+)$`)

// Node is what a host device path is to VFIO.
type Node int

const (
	// NotVFIO is any other path.
	NotVFIO Node = iota
	// Container is /dev/vfio/vfio, the node a process opens to use groups: a hypervisor opens
	// its own, so a VM needs nothing for it.
	Container
	// Group is /dev/vfio/<group>.
	Group
	// NoIOMMUGroup is /dev/vfio/noiommu-<group>, unsafe mode without an IOMMU.
	NoIOMMUGroup
)

// Classify says what a host path is to VFIO, from its name and type: a character device in a
// directory named vfio. The group's number is returned for the group kinds.
func Classify(hostPath string, mode fs.FileMode) (Node, string) {
	if mode&fs.ModeCharDevice == 0 || filepath.Base(filepath.Dir(hostPath)) != "vfio" {
		return NotVFIO, ""
	}
	name := filepath.Base(hostPath)
	if name == "vfio" {
		return Container, ""
	}
	m := groupRE.FindStringSubmatch(name)
	switch {
	case m == nil:
		return NotVFIO, ""
	case m[1] != "":
		return NoIOMMUGroup, m[2]
	}
	return Group, m[2]
}

// Device is one PCI device of a group.
type Device struct {
	// BDF is its full PCI address, 0000:01:00.0.
	BDF string
	// Driver is the host driver it is bound to, empty when none.
	Driver string
}

// Sysfs reads devices under a sysfs root: /sys on a node, another directory where the node's
// sysfs is mounted elsewhere (or a test's tree).
type Sysfs string

// ErrNoGroup is returned for a group sysfs does not list.
var ErrNoGroup = errors.New("no such IOMMU group")

// GroupDevices lists the group's PCI devices, sorted by address.
func (s Sysfs) GroupDevices(group string) ([]Device, error) {
	dir := filepath.Join(string(s), "kernel", "iommu_groups", group, "devices")
	entries, err := os.ReadDir(dir)
	switch {
	case errors.Is(err, fs.ErrNotExist):
		return nil, fmt.Errorf("%w %s (%s is missing)", ErrNoGroup, group, dir)
	case err != nil:
		return nil, fmt.Errorf("list IOMMU group %s: %w", group, err)
	case len(entries) == 0:
		return nil, fmt.Errorf("IOMMU group %s has no devices", group)
	}
	devs := make([]Device, 0, len(entries))
	for _, e := range entries {
		driver, err := s.driver(e.Name())
		if err != nil {
			return nil, err
		}
		devs = append(devs, Device{BDF: e.Name(), Driver: driver})
	}
	slices.SortFunc(devs, func(a, b Device) int { return strings.Compare(a.BDF, b.BDF) })
	return devs, nil
}

// driver is the name of the driver bound to the device: the last element of its driver link.
func (s Sysfs) driver(bdf string) (string, error) {
	target, err := os.Readlink(filepath.Join(string(s), "bus", "pci", "devices", bdf, "driver"))
	switch {
	case errors.Is(err, fs.ErrNotExist):
		return "", nil
	case err != nil:
		return "", fmt.Errorf("driver of PCI device %s: %w", bdf, err)
	}
	return filepath.Base(target), nil
}
