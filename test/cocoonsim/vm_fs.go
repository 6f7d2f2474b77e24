package cocoonsim

import (
	"context"
	"errors"
	"fmt"
	"path/filepath"

	"github.com/spf13/cobra"

	"github.com/cocoonstack/cocoon-cri/pkg/cocoon"
	"github.com/cocoonstack/cocoon-cri/test/cocoonsim/guest"
)

// cocoon v0.5's `vm fs attach|detach` (cmd/vm/attach.go, extend/fs/fs.go,
// hypervisor/cloudhypervisor/extend.go): a vhost-user-fs device, whose backend (virtiofsd) the
// user runs, hot-added to a running Cloud Hypervisor VM created with --shared-memory. The guest
// mounts it by its tag (`mount -t virtiofs TAG DIR`). Runtime only: it does not outlive the
// VM's hypervisor process, and nothing re-attaches it at the next start.

// fsTagRE is cocoon's rule for a tag: also the suffix of the device ID cocoon-fs-<tag>.
var fsTagRE = lazyRegexp(`^[a-zA-Z0-9][a-zA-Z0-9_-]{0,35}$`)

const (
	fsIDPrefix          = "cocoon-fs-"
	fsDefaultNumQueues  = 1
	fsDefaultQueueSize  = 1024
	chStatePaused       = "Paused"
	errUnsupportedFs    = "backend does not support fs attach"
	errPausedForCapture = "vm is paused (snapshot or hibernate in flight); retry after it completes"
)

func (a *app) fsCommand() *cobra.Command {
	fsCmd := &cobra.Command{Use: "fs", Short: "Attach/detach a vhost-user-fs share to a running VM (CH only)"}
	attach := &cobra.Command{Use: "attach VM", Short: "Attach a vhost-user-fs device to a running VM", Args: cobra.ExactArgs(1), RunE: a.fsAttach}
	attach.Flags().String("socket", "", "absolute path to a virtiofsd unix socket (required)")
	attach.Flags().String("tag", "", "guest mount tag (required; also detach key)")
	attach.Flags().Int("num-queues", 0, "request queues (0 = default 1)")
	attach.Flags().Int("queue-size", 0, "queue depth (0 = default 1024)")
	_ = attach.MarkFlagRequired("socket")
	_ = attach.MarkFlagRequired("tag")
	attach.Flags().StringP("output", "o", "", "output format: json")
	detach := &cobra.Command{Use: "detach VM", Short: "Detach a vhost-user-fs device from a running VM", Args: cobra.ExactArgs(1), RunE: a.fsDetach}
	detach.Flags().String("tag", "", "guest mount tag (required)")
	_ = detach.MarkFlagRequired("tag")
	detach.Flags().StringP("output", "o", "", "output format: json")
	fsCmd.AddCommand(attach, detach)
	return fsCmd
}

// attachedFs is a vhost-user-fs device as `vm inspect` lists it under attached_devices.fs.
type attachedFs struct {
	ID     string `json:"id"`
	Tag    string `json:"tag"`
	Socket string `json:"socket"`
}

// fsSpec is cocoon's fs.Spec.
type fsSpec struct {
	socket, tag          string
	numQueues, queueSize int
}

// normalize is cocoon's Spec.Normalize: required fields, the tag rule, then the queue defaults.
func (s *fsSpec) normalize() error {
	switch {
	case s.socket == "":
		return errors.New("socket is required")
	case !filepath.IsAbs(s.socket):
		return fmt.Errorf("socket must be absolute, got %q", s.socket)
	case s.tag == "":
		return errors.New("tag is required")
	case !fsTagRE().MatchString(s.tag):
		return fmt.Errorf("tag %q invalid: must match [A-Za-z0-9][A-Za-z0-9_-]{0,35}", s.tag)
	case s.numQueues < 0:
		return fmt.Errorf("num-queues must be non-negative, got %d", s.numQueues)
	case s.queueSize < 0:
		return fmt.Errorf("queue-size must be non-negative, got %d", s.queueSize)
	}
	if s.numQueues == 0 {
		s.numQueues = fsDefaultNumQueues
	}
	if s.queueSize == 0 {
		s.queueSize = fsDefaultQueueSize
	}
	return nil
}

func (a *app) fsAttach(cmd *cobra.Command, args []string) error {
	ctx := cmd.Context()
	vm, err := a.fsTarget(ctx, "fs attach", args[0])
	if err != nil {
		return err
	}
	spec := fsSpec{}
	spec.socket, _ = cmd.Flags().GetString("socket")
	spec.tag, _ = cmd.Flags().GetString("tag")
	spec.numQueues, _ = cmd.Flags().GetInt("num-queues")
	spec.queueSize, _ = cmd.Flags().GetInt("queue-size")
	if err := spec.normalize(); err != nil {
		return err
	}
	hc, info, err := runningCHInfoForOp(ctx, vm)
	if err != nil {
		return err
	}
	if !info.Config.Memory.Shared {
		return errors.New("fs attach requires the VM to be created with --shared-memory (current memory shared=off; cannot be flipped on a running VM)")
	}
	id := fsIDPrefix + spec.tag
	for _, f := range info.Config.Fs {
		switch {
		case f.Tag == spec.tag:
			return fmt.Errorf("fs tag %q already attached", spec.tag)
		case f.ID == id:
			return fmt.Errorf("fs id %q already attached", id)
		}
	}
	got, err := hc.addFs(ctx, guest.Fs{ID: id, Tag: spec.tag, Socket: spec.socket, NumQueues: spec.numQueues, QueueSize: spec.queueSize})
	if err != nil {
		return fmt.Errorf("vm.add-fs: %w", err)
	}
	if got == "" {
		got = id
	}
	return a.attachResult(cmd, "cmd.vm.fs.attach", map[string]string{"vm": args[0], "tag": spec.tag, "id": got}, "attached fs tag=%s id=%s vm=%s", spec.tag, got, args[0])
}

func (a *app) fsDetach(cmd *cobra.Command, args []string) error {
	ctx := cmd.Context()
	vm, err := a.fsTarget(ctx, "fs detach", args[0])
	if err != nil {
		return err
	}
	tag, _ := cmd.Flags().GetString("tag")
	if tag == "" {
		return errors.New("tag is required")
	}
	hc, info, err := runningCHInfoForOp(ctx, vm)
	if err != nil {
		return err
	}
	id := ""
	for _, f := range info.Config.Fs {
		if f.Tag == tag {
			id = f.ID
			break
		}
	}
	if id == "" {
		return fmt.Errorf("fs tag %q not attached", tag)
	}
	if err := hc.removeDevice(ctx, id); err != nil {
		return fmt.Errorf("vm.remove-device %s: %w", id, err)
	}
	return a.attachResult(cmd, "cmd.vm.fs.detach", map[string]string{"vm": args[0], "tag": tag}, "detached fs tag=%s vm=%s", tag, args[0])
}

// fsTarget is the VM ref names; a Firecracker VM takes no vhost-user-fs device.
func (a *app) fsTarget(ctx context.Context, op, ref string) (*cocoon.VM, error) {
	owner, vm, err := a.resolveAttachTarget(ctx, op, ref)
	if err != nil {
		return nil, err
	}
	if owner.kind == kindFC {
		return nil, fmt.Errorf("%s: backend %s: %s", op, cocoon.HypervisorFirecracker, errUnsupportedFs)
	}
	return vm, nil
}

// runningCHInfoForOp is the running VM's API and a vm.info read before a device change, which
// cocoon refuses while a snapshot holds the VM paused.
func runningCHInfoForOp(ctx context.Context, vm *cocoon.VM) (*chClient, *chInfo, error) {
	hc, err := runningCH(vm)
	if err != nil {
		return nil, nil, err
	}
	info, err := hc.info(ctx)
	if err != nil {
		return nil, nil, fmt.Errorf("vm.info: %w", err)
	}
	if info.State == chStatePaused {
		return nil, nil, errors.New(errPausedForCapture)
	}
	return hc, info, nil
}

// attachedFsDevices are the running VM's vhost-user-fs devices, as inspect shows them.
func attachedFsDevices(ctx context.Context, vm *cocoon.VM) []attachedFs {
	info := runningCHInfo(ctx, vm)
	if info == nil {
		return nil
	}
	var devs []attachedFs
	for _, f := range info.Config.Fs {
		devs = append(devs, attachedFs{ID: f.ID, Tag: f.Tag, Socket: f.Socket})
	}
	return devs
}
