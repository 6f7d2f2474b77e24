package vmruntime

import (
	"archive/tar"
	"bytes"
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"maps"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/cocoonstack/cocoon-cri/imagestore"
	"github.com/cocoonstack/cocoon-cri/pkg/cocoon"
)

// fakeCocoon is cocoon in memory, behind the runtime's Cocoon seam and imagestore's: VMs,
// snapshots and images are records, a "hypervisor" is a PID, a guest is a function that answers
// vm exec. It keeps cocoon's semantics where the runtime relies on them (docs/cocoon-contract.md)
// and is no kinder than cocoon:
//   - deletes are not idempotent: vm rm, snapshot rm and image rm of a missing object fail with
//     ErrNotFound; vm rm of a running VM without force fails with ErrInUse;
//   - VM and snapshot names are unique (ErrAlreadyExists) and must match cocoon's pattern;
//   - vm clone needs a name and an existing snapshot, and takes sizes only where this cocoon can
//     resize a clone (v0.3.8); vm create checks cocoon's minimums and that the image exists;
//   - a created VM runs only after vm start; vm stop of a stopped VM succeeds;
//   - snapshot save of a VM that does not run fails, as does one with a disk or share attached;
//   - vm exec, reseed and the attach commands exist only where the capabilities say so.
//
// The interface is pkg/cocoon's client, not cocoon's command line: what the client does on top of
// cocoon (inspecting a clone that printed pid 0, looking a saved or imported snapshot up by name)
// is already done in what the fake returns.
//
// Every call that can fail is recorded and can be made to fail (faults). A client made by
// WithNetwork shares the state and records the network a VM was made with.
type fakeCocoon struct {
	*fakeCocoonState
	cniConfDir, cniBinDir string
	dns                   []string
}

type fakeCocoonState struct {
	faults

	mu        sync.Mutex
	caps      cocoon.Capabilities
	serial    int
	vms       map[string]*fakeVM       // by ID
	snapshots map[string]*fakeSnapshot // by name
	images    map[string]*cocoon.Image // by name
	exports   map[string][]byte        // what each snapshot export wrote, by snapshot name
	// duringSave, when set, runs inside every snapshot save with the context the save was given,
	// as if the guest were paused then.
	duringSave func(ctx context.Context)
	watchers   map[chan cocoon.VMEvent]struct{}
	pid        func() int
	exec       fakeGuest
	// plugin, when set, is run as cocoon runs a sandbox's attach plugin: ADD when a VM is made,
	// DEL when it is removed.
	plugin fakeAttachPlugin
}

// fakeAttachPlugin is the attach plugin's effect on the pod network (fakeNetwork's).
type fakeAttachPlugin interface {
	attachAdd(cniConfDir, vmNetNS string) error
	attachDel(cniConfDir, vmNetNS string)
}

// runAttachPlugin runs the plugin's ADD for a new VM, which cocoon does not keep when it fails.
func (f *fakeCocoon) runAttachPlugin(v *fakeVM, args ...string) error {
	if f.plugin == nil || v.cniConfDir == "" || len(v.NetworkConfigs) == 0 {
		return nil
	}
	if err := f.plugin.attachAdd(v.cniConfDir, v.NetworkConfigs[0].NetnsPath); err != nil {
		delete(f.vms, v.ID)
		return cocoonErr(nil, "cni add: "+err.Error(), args...)
	}
	return nil
}

// fakeGuest answers vm exec in a VM's guest.
type fakeGuest func(ctx context.Context, vm cocoon.VM, argv []string, o cocoon.ExecOptions) (int, error)

type fakeVM struct {
	cocoon.VM
	cniConfDir string   // the --cni-conf-dir of the call that made it
	attached   []string // hot-added: "disk NAME", "device ID", "fs TAG"
	// copied: a clone whose memory was copied from its snapshot, which it then no longer needs.
	copied bool
}

type fakeSnapshot struct {
	cocoon.Snapshot
	archive []byte // what snapshot export writes
	ofVM    string // the VM a hibernation saved, which alone may restore it
}

// The capabilities of the two cocoon releases cocoon-cri supports (docs/cocoon-contract.md
// section 0).
var (
	capsV038 = cocoon.Capabilities{Version: "v0.3.8", CloneResize: true, CloneOnDemand: true}
	capsV05  = cocoon.Capabilities{Version: "v0.5.1", Exec: true, CloneRestoreMode: true, ReseedMachineID: true,
		DiskAttach: true, DeviceAttach: true, FsAttach: true, Hibernate: true, RestoreMode: true, SnapshotDirs: true}
)

// fakeDeadPIDs numbers the hypervisors of the fake's VMs by default: above any pid_max (at most
// 2^22), so no process has such a PID. The runtime then sees a hypervisor it cannot observe (no
// /proc entry, never alive); a test that needs a live one gives the fake a real process's PID
// (setPID).
const fakeDeadPIDs = 1 << 30

// fakeRunDir stands for cocoon's --run-dir in the paths the fake reports.
const fakeRunDir = "/fake-cocoon/run"

// newFakeCocoon is a v0.3.8 cocoon with nothing in it: no vm exec, so guests are left as cocoon
// made them and nothing runs in the background of a start.
func newFakeCocoon() *fakeCocoon {
	st := &fakeCocoonState{
		caps: capsV038, vms: map[string]*fakeVM{}, snapshots: map[string]*fakeSnapshot{},
		images: map[string]*cocoon.Image{}, exports: map[string][]byte{}, watchers: map[chan cocoon.VMEvent]struct{}{},
	}
	st.exec = st.defaultGuest
	return &fakeCocoon{fakeCocoonState: st}
}

var (
	_ Cocoon            = (*fakeCocoon)(nil)
	_ imagestore.Cocoon = (*fakeCocoon)(nil)
)

// --- test controls, outside the seams ---

func (f *fakeCocoonState) setCaps(c cocoon.Capabilities) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.caps = c
}

// setPID makes fn give the hypervisor PID of each VM that starts from now on.
func (f *fakeCocoonState) setPID(fn func() int) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.pid = fn
}

// setGuest makes g answer vm exec from now on.
func (f *fakeCocoonState) setGuest(g fakeGuest) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.exec = g
}

// defaultGuest runs every command with exit 0 and no output; poweroff powers the VM off.
func (f *fakeCocoonState) defaultGuest(_ context.Context, vm cocoon.VM, argv []string, _ cocoon.ExecOptions) (int, error) {
	if len(argv) > 0 && argv[0] == "poweroff" {
		f.setVMState(vm.ID, cocoon.VMStateStopped)
	}
	return 0, nil
}

// addVM puts a VM into cocoon as if made outside this test's RPCs; an empty ID gets one.
func (f *fakeCocoonState) addVM(vm cocoon.VM) cocoon.VM {
	f.mu.Lock()
	defer f.mu.Unlock()
	if vm.ID == "" {
		vm.ID = f.newID("FAKEVM")
	}
	f.vms[vm.ID] = &fakeVM{VM: vm}
	f.emit(cocoon.VMAdded, vm)
	return vm
}

// putSnapshot puts a snapshot into cocoon as if saved or imported outside this test's RPCs.
func (f *fakeCocoonState) putSnapshot(cfg cocoon.SnapshotConfig) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.addSnapshot(cfg, fakeSnapshotArchive(cfg, "memory of "+cfg.Name))
}

// copiedClone says whether a clone copied its snapshot's memory.
func (f *fakeCocoonState) copiedClone(ref string) bool {
	f.mu.Lock()
	defer f.mu.Unlock()
	v := f.vmByRef(ref)
	return v != nil && v.copied
}

// vm is a VM as vm inspect would show it, without recording a call.
func (f *fakeCocoonState) vm(ref string) (cocoon.VM, bool) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if v := f.vmByRef(ref); v != nil {
		return v.VM, true
	}
	return cocoon.VM{}, false
}

// vmConfDir is the --cni-conf-dir the VM was made with.
func (f *fakeCocoonState) vmConfDir(ref string) string {
	f.mu.Lock()
	defer f.mu.Unlock()
	if v := f.vmByRef(ref); v != nil {
		return v.cniConfDir
	}
	return ""
}

// vmNames lists the VMs' names, sorted.
func (f *fakeCocoonState) vmNames() []string {
	f.mu.Lock()
	defer f.mu.Unlock()
	var names []string
	for _, v := range f.vms {
		names = append(names, v.Config.Name)
	}
	slices.Sort(names)
	return names
}

// snapshotNames lists the snapshots' names, sorted.
// snapshotsNamed are the names of the snapshots whose name starts with prefix, sorted.
func (f *fakeCocoonState) snapshotsNamed(prefix string) []string {
	var out []string
	for _, name := range f.snapshotNames() {
		if strings.HasPrefix(name, prefix) {
			out = append(out, name)
		}
	}
	return out
}

func (f *fakeCocoonState) snapshotNames() []string {
	f.mu.Lock()
	defer f.mu.Unlock()
	return slices.Sorted(maps.Keys(f.snapshots))
}

// exported is what the export of the named snapshot wrote.
func (f *fakeCocoonState) exported(name string) []byte {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.exports[name]
}

// setVMState changes a VM's state behind cocoon-cri's back (its guest powered off, its hypervisor
// died) and tells the event stream.
func (f *fakeCocoonState) setVMState(ref string, state cocoon.VMState) {
	f.mu.Lock()
	defer f.mu.Unlock()
	v := f.vmByRef(ref)
	if v == nil {
		return
	}
	v.State = state
	if state != cocoon.VMStateRunning {
		v.PID, v.SocketPath, v.attached = 0, "", nil
	}
	f.emit(cocoon.VMModified, v.VM)
}

// forgetVM removes a VM behind cocoon-cri's back (cocoon vm rm by hand).
func (f *fakeCocoonState) forgetVM(ref string) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if v := f.vmByRef(ref); v != nil {
		delete(f.vms, v.ID)
		f.emit(cocoon.VMDeleted, v.VM)
	}
}

// fakeSnapshotArchive is a snapshot archive as cocoon exports one: snapshot.json first, then the
// hypervisor's files, the guest's memory standing for itself.
func fakeSnapshotArchive(cfg cocoon.SnapshotConfig, memory string) []byte {
	manifest, err := json.Marshal(cocoon.SnapshotExport{Config: cfg, Version: cocoon.SnapshotExportVersion})
	if err != nil {
		panic(err)
	}
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	for _, f := range []struct {
		name string
		body []byte
	}{{"snapshot.json", manifest}, {"config.json", []byte(`{}`)}, {"memory-ranges", []byte(memory)}} {
		if err := tw.WriteHeader(&tar.Header{Name: f.name, Mode: 0o640, Size: int64(len(f.body))}); err != nil {
			panic(err)
		}
		if _, err := tw.Write(f.body); err != nil {
			panic(err)
		}
	}
	if err := tw.Close(); err != nil {
		panic(err)
	}
	return buf.Bytes()
}

// --- inside: the caller holds f.mu ---

func (f *fakeCocoonState) newID(prefix string) string {
	f.serial++
	return fmt.Sprintf("%s%0*d", prefix, 26-len(prefix), f.serial)
}

func (f *fakeCocoonState) vmByRef(ref string) *fakeVM {
	if v, ok := f.vms[ref]; ok {
		return v
	}
	for _, v := range f.vms {
		if v.Config.Name == ref {
			return v
		}
	}
	return nil
}

func (f *fakeCocoonState) snapshotByRef(ref string) *fakeSnapshot {
	if s, ok := f.snapshots[ref]; ok {
		return s
	}
	for _, s := range f.snapshots {
		if s.ID == ref {
			return s
		}
	}
	return nil
}

func (f *fakeCocoonState) emit(kind cocoon.VMEventType, vm cocoon.VM) {
	for ch := range f.watchers {
		select {
		case ch <- cocoon.VMEvent{Event: kind, VM: vm}:
		default: // a watcher that fell far behind misses events, as a restarted stream would
		}
	}
}

func (f *fakeCocoonState) hypervisorPID() int {
	if f.pid != nil {
		return f.pid()
	}
	return fakeDeadPIDs + f.serial
}

// boot makes v run: a hypervisor PID, its API socket, and a vsock for the agent where cocoon has
// vm exec.
func (f *fakeCocoonState) boot(v *fakeVM) {
	f.serial++
	v.State, v.PID = cocoon.VMStateRunning, f.hypervisorPID()
	dir := fakeRunDir + "/" + dirName(v.Hypervisor) + "/" + v.ID
	v.SocketPath = dir + "/api.sock"
	if f.caps.Exec {
		v.VsockSocket = dir + "/vsock.uds"
	}
	now := time.Unix(1_700_000_000, 0).Add(time.Duration(f.serial) * time.Second)
	v.StartedAt = &now
}

func dirName(hypervisor string) string {
	if hypervisor == cocoon.HypervisorFirecracker {
		return "firecracker"
	}
	return "cloudhypervisor"
}

// fakeVMName is cocoon's pattern of VM names.
var fakeVMName = regexp.MustCompile(`^[a-zA-Z0-9][a-zA-Z0-9._-]{0,62}$`)

func (f *fakeCocoonState) checkNewName(name string, args ...string) error {
	if !fakeVMName.MatchString(name) {
		return cocoonErr(cocoon.ErrInvalid, fmt.Sprintf("vm name %q is invalid", name), args...)
	}
	if f.vmByRef(name) != nil {
		return cocoonErr(cocoon.ErrAlreadyExists, fmt.Sprintf("vm name %q already exists", name), args...)
	}
	return nil
}

// newVM records a VM made by a call of this client, with its NICs in a namespace of cocoon's
// and its writable disk.
func (f *fakeCocoon) newVM(name, hypervisor string, cfg cocoon.Config, nics int) *fakeVM {
	id := f.newID("FAKEVM")
	v := &fakeVM{VM: cocoon.VM{ID: id, Hypervisor: hypervisor, State: cocoon.VMStateCreated, Config: cocoon.VMConfig{Config: cfg, Name: name}},
		cniConfDir: f.cniConfDir}
	for i := range nics {
		v.NetworkConfigs = append(v.NetworkConfigs, &cocoon.NetworkConfig{
			Tap: fmt.Sprintf("tap%d", i), Mac: fmt.Sprintf("02:00:00:00:%02x:%02x", f.serial%256, i), NetnsPath: "/var/run/netns/cocoon-" + id,
		})
	}
	v.StorageConfigs = []*cocoon.StorageConfig{{Path: fakeRunDir + "/" + dirName(hypervisor) + "/" + id + "/cow.raw", Role: cocoon.StorageRoleCOW}}
	f.vms[id] = v
	return v
}

func notFoundVM(ref string, args ...string) error {
	return cocoonErr(cocoon.ErrNotFound, fmt.Sprintf("vm %s: VM not found", ref), args...)
}

func notRunning(ref string, args ...string) error {
	return cocoonErr(nil, fmt.Sprintf("vm is not running: %s", ref), args...)
}

// --- the seams ---

func (f *fakeCocoon) Binary() string { return "cocoon (in-process fake)" }

func (f *fakeCocoon) Version(context.Context) (*cocoon.VersionInfo, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if err := f.call("Version"); err != nil {
		return nil, err
	}
	return &cocoon.VersionInfo{Version: f.caps.Version}, nil
}

func (f *fakeCocoon) Capabilities(context.Context) (cocoon.Capabilities, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if err := f.call("Capabilities"); err != nil {
		return cocoon.Capabilities{}, err
	}
	return f.caps, nil
}

func (f *fakeCocoon) WithNetwork(cniConfDir, cniBinDir string, dns []string) Cocoon {
	return &fakeCocoon{fakeCocoonState: f.fakeCocoonState, cniConfDir: cniConfDir, cniBinDir: cniBinDir, dns: dns}
}

func (f *fakeCocoon) VMClone(_ context.Context, snapshot string, o cocoon.CloneOptions) (*cocoon.VM, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	args := []string{"vm", "clone", "--name", o.Name, snapshot}
	if err := f.call("VMClone", o.Name, snapshot); err != nil {
		return nil, err
	}
	if o.Name == "" {
		// pkg/cocoon refuses it before running cocoon.
		return nil, fmt.Errorf("clone %s: a VM name is required: %w", snapshot, cocoon.ErrInvalid)
	}
	snap := f.snapshotByRef(snapshot)
	if o.FromDir {
		args = []string{"vm", "clone", "--name", o.Name, "--from-dir", snapshot}
		var err error
		if snap, err = readFakeSnapshotDir(snapshot); err != nil {
			return nil, cocoonErr(nil, "load envelope: "+err.Error(), args...)
		}
	}
	if snap == nil {
		return nil, cocoonErr(cocoon.ErrNotFound, fmt.Sprintf("snapshot %s: snapshot not found", snapshot), args...)
	}
	if err := f.checkNewName(o.Name, args...); err != nil {
		return nil, err
	}
	cfg := snap.Config
	if f.caps.CloneResize {
		switch {
		case o.CPU > 0 && o.CPU < cfg.CPU, o.Memory > 0 && o.Memory < cfg.Memory, o.Storage > 0 && o.Storage < cfg.Storage:
			return nil, cocoonErr(cocoon.ErrInvalid, "clone resources below snapshot minimum", args...)
		}
		cfg.CPU, cfg.Memory, cfg.Storage = max(cfg.CPU, o.CPU), max(cfg.Memory, o.Memory), max(cfg.Storage, o.Storage)
	}
	cfg.NoDirectIO = o.NoDirectIO
	nics := snap.NICs
	if o.NICs > 0 && snap.Hypervisor != cocoon.HypervisorFirecracker {
		nics = o.NICs
	}
	v := f.newVM(o.Name, cmp.Or(snap.Hypervisor, cocoon.HypervisorCloudHypervisor), cfg, nics)
	if err := f.runAttachPlugin(v, args...); err != nil {
		return nil, err
	}
	v.copied = o.CopyMemory || !o.OnDemand && !f.caps.CloneRestoreMode
	f.boot(v)
	f.emit(cocoon.VMAdded, v.VM)
	vm := v.VM
	return &vm, nil
}

func (f *fakeCocoon) VMCreate(_ context.Context, image string, o cocoon.CreateOptions) (*cocoon.VM, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	args := []string{"vm", "create", "--name", o.Name, image}
	if err := f.call("VMCreate", o.Name, image); err != nil {
		return nil, err
	}
	if err := f.checkNewName(o.Name, args...); err != nil {
		return nil, err
	}
	img, ok := f.images[image]
	switch {
	case !ok:
		return nil, cocoonErr(cocoon.ErrNotFound, fmt.Sprintf("image %q not found in any backend", image), args...)
	case o.Memory < MinMemory:
		return nil, cocoonErr(cocoon.ErrInvalid, "memory must be at least 512M", args...)
	case o.Storage < MinStorage:
		return nil, cocoonErr(cocoon.ErrInvalid, "storage must be at least 10G", args...)
	case o.CPU < 1:
		return nil, cocoonErr(cocoon.ErrInvalid, "cpu must be at least 1", args...)
	case o.Firecracker && img.Type != cocoon.ImageTypeOCI:
		return nil, cocoonErr(cocoon.ErrInvalid, "--fc requires OCI images (direct kernel boot)", args...)
	case o.SharedMemory && !f.caps.FsAttach:
		return nil, cocoonErr(cocoon.ErrUnsupported, "unknown flag: --shared-memory", args...)
	}
	hypervisor := cocoon.HypervisorCloudHypervisor
	if o.Firecracker {
		hypervisor = cocoon.HypervisorFirecracker
	}
	v := f.newVM(o.Name, hypervisor, cocoon.Config{
		CPU: o.CPU, Memory: o.Memory, Storage: o.Storage, Image: image, ImageType: img.Type,
		Network: o.Network, NoDirectIO: o.NoDirectIO, Windows: o.Windows, SharedMemory: o.SharedMemory,
	}, o.NICs)
	if err := f.runAttachPlugin(v, args...); err != nil {
		return nil, err
	}
	f.emit(cocoon.VMAdded, v.VM)
	vm := v.VM
	return &vm, nil
}

func (f *fakeCocoon) VMStart(_ context.Context, id string) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	if err := f.call("VMStart", id); err != nil {
		return err
	}
	v := f.vmByRef(id)
	if v == nil {
		return notFoundVM(id, "vm", "start", id)
	}
	if v.State == cocoon.VMStateRunning {
		return nil
	}
	f.boot(v)
	f.emit(cocoon.VMModified, v.VM)
	return nil
}

func (f *fakeCocoon) VMStop(_ context.Context, id string, _ cocoon.StopOptions) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	if err := f.call("VMStop", id); err != nil {
		return err
	}
	v := f.vmByRef(id)
	if v == nil {
		return notFoundVM(id, "vm", "stop", id)
	}
	if v.State == cocoon.VMStateRunning {
		v.State, v.PID, v.SocketPath, v.attached = cocoon.VMStateStopped, 0, "", nil
		f.emit(cocoon.VMModified, v.VM)
	}
	return nil
}

func (f *fakeCocoon) VMRemove(_ context.Context, id string, force bool) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	args := []string{"vm", "rm", id}
	if err := f.call("VMRemove", id); err != nil {
		return err
	}
	v := f.vmByRef(id)
	switch {
	case v == nil:
		return notFoundVM(id, args...)
	case v.State == cocoon.VMStateRunning && !force:
		return cocoonErr(cocoon.ErrInUse, fmt.Sprintf("vm %s is running (force required)", id), args...)
	}
	delete(f.vms, v.ID)
	if f.plugin != nil && v.cniConfDir != "" && len(v.NetworkConfigs) > 0 {
		f.plugin.attachDel(v.cniConfDir, v.NetworkConfigs[0].NetnsPath)
	}
	f.emit(cocoon.VMDeleted, v.VM)
	return nil
}

func (f *fakeCocoon) VMInspect(_ context.Context, ref string) (*cocoon.VM, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if err := f.call("VMInspect", ref); err != nil {
		return nil, err
	}
	v := f.vmByRef(ref)
	if v == nil {
		return nil, notFoundVM(ref, "vm", "inspect", ref)
	}
	vm := v.VM
	return &vm, nil
}

func (f *fakeCocoon) VMList(context.Context) ([]cocoon.VM, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if err := f.call("VMList"); err != nil {
		return nil, err
	}
	var out []cocoon.VM
	for _, id := range slices.Sorted(maps.Keys(f.vms)) {
		out = append(out, f.vms[id].VM)
	}
	return out, nil
}

func (f *fakeCocoon) VMExec(ctx context.Context, id string, argv []string, o cocoon.ExecOptions) (int, error) {
	f.mu.Lock()
	args := []string{"vm", "exec", id}
	first := ""
	if len(argv) > 0 {
		first = argv[0]
	}
	err := f.call("VMExec", id, first)
	v := f.vmByRef(id)
	switch {
	case err != nil:
	case !f.caps.Exec:
		err = cocoonErr(cocoon.ErrUnsupported, `unknown command "exec" for "cocoon vm"`, args...)
	case v == nil:
		err = notFoundVM(id, args...)
	case v.State != cocoon.VMStateRunning:
		err = notRunning(id, args...)
	case v.VsockSocket == "":
		err = cocoonErr(cocoon.ErrNoVsock, "exec: vsock not configured for this VM (recreate the VM to enable agent exec)", args...)
	}
	guest := f.exec
	var vm cocoon.VM
	if v != nil {
		vm = v.VM
	}
	f.mu.Unlock()
	if err != nil {
		return -1, err
	}
	return guest(ctx, vm, argv, o)
}

func (f *fakeCocoon) VMReseed(_ context.Context, id string, _ bool) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	args := []string{"vm", "reseed", id}
	if err := f.call("VMReseed", id); err != nil {
		return err
	}
	return f.runningVM(id, f.caps.ReseedMachineID, "reseed", args)
}

// runningVM checks what every command on a running VM checks: that this cocoon has the command,
// that the VM exists and that it runs.
func (f *fakeCocoonState) runningVM(id string, has bool, command string, args []string) error {
	v := f.vmByRef(id)
	switch {
	case !has:
		return cocoonErr(cocoon.ErrUnsupported, fmt.Sprintf("unknown command %q for \"cocoon vm\"", command), args...)
	case v == nil:
		return notFoundVM(id, args...)
	case v.State != cocoon.VMStateRunning:
		return notRunning(id, args...)
	}
	return nil
}

func (f *fakeCocoon) attach(id, what, command string, has bool, args []string) error {
	if err := f.runningVM(id, has, command, args); err != nil {
		return err
	}
	v := f.vmByRef(id)
	if v.Hypervisor == cocoon.HypervisorFirecracker {
		return cocoonErr(nil, command+": backend firecracker: backend does not support "+command, args...)
	}
	if slices.Contains(v.attached, what) {
		return cocoonErr(nil, what+" already attached", args...)
	}
	v.attached = append(v.attached, what)
	return nil
}

func (f *fakeCocoon) VMDiskAttach(_ context.Context, id, _, name string, _ bool) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	if err := f.call("VMDiskAttach", id, name); err != nil {
		return err
	}
	return f.attach(id, "disk "+name, "disk attach", f.caps.DiskAttach, []string{"vm", "disk", "attach", "--name", name, id})
}

func (f *fakeCocoon) VMDeviceAttach(_ context.Context, vm, bdf, id string) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	if err := f.call("VMDeviceAttach", vm, bdf); err != nil {
		return err
	}
	return f.attach(vm, "device "+id, "device attach", f.caps.DeviceAttach, []string{"vm", "device", "attach", "--pci", bdf, "--id", id, vm})
}

func (f *fakeCocoon) VMFsAttach(_ context.Context, vm, _, tag string) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	args := []string{"vm", "fs", "attach", "--tag", tag, vm}
	if err := f.call("VMFsAttach", vm, tag); err != nil {
		return err
	}
	if v := f.vmByRef(vm); v != nil && !v.Config.SharedMemory && f.caps.FsAttach {
		return cocoonErr(nil, "fs attach requires the VM to be created with --shared-memory", args...)
	}
	return f.attach(vm, "fs "+tag, "fs attach", f.caps.FsAttach, args)
}

func (f *fakeCocoon) VMFsDetach(_ context.Context, vm, tag string) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	args := []string{"vm", "fs", "detach", "--tag", tag, vm}
	if err := f.call("VMFsDetach", vm, tag); err != nil {
		return err
	}
	if err := f.runningVM(vm, f.caps.FsAttach, "fs detach", args); err != nil {
		return err
	}
	v := f.vmByRef(vm)
	i := slices.Index(v.attached, "fs "+tag)
	if i < 0 {
		return cocoonErr(nil, fmt.Sprintf("fs tag %q not attached", tag), args...)
	}
	v.attached = slices.Delete(v.attached, i, i+1)
	return nil
}

// WatchVMs reports every VM as ADDED, then each change as it happens, until ctx ends.
func (f *fakeCocoon) WatchVMs(ctx context.Context, _ time.Duration, fn func(cocoon.VMEvent)) error {
	f.mu.Lock()
	if err := f.call("WatchVMs"); err != nil {
		f.mu.Unlock()
		return err
	}
	ch := make(chan cocoon.VMEvent, 256)
	var initial []cocoon.VMEvent
	for _, id := range slices.Sorted(maps.Keys(f.vms)) {
		initial = append(initial, cocoon.VMEvent{Event: cocoon.VMAdded, VM: f.vms[id].VM})
	}
	f.watchers[ch] = struct{}{}
	f.mu.Unlock()
	defer func() {
		f.mu.Lock()
		delete(f.watchers, ch)
		f.mu.Unlock()
	}()
	for _, ev := range initial {
		fn(ev)
	}
	for {
		select {
		case <-ctx.Done():
			return nil
		case ev := <-ch:
			fn(ev)
		}
	}
}

func (f *fakeCocoon) SnapshotSave(ctx context.Context, vm, name, description string) (*cocoon.Snapshot, error) {
	if f.duringSave != nil {
		f.duringSave(ctx)
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	args := []string{"snapshot", "save", "--name", name, vm}
	if err := f.call("SnapshotSave", vm, name); err != nil {
		return nil, err
	}
	v := f.vmByRef(vm)
	switch {
	case v == nil:
		return nil, notFoundVM(vm, args...)
	case v.State != cocoon.VMStateRunning:
		return nil, cocoonErr(nil, "VM not running", args...)
	case len(v.attached) > 0:
		return nil, cocoonErr(cocoon.ErrInUse, fmt.Sprintf("hot-attached %s: detach before snapshot or hibernate", v.attached[0]), args...)
	case f.snapshots[name] != nil:
		return nil, cocoonErr(cocoon.ErrAlreadyExists, fmt.Sprintf("snapshot name %q already exists", name), args...)
	}
	cfg := cocoon.SnapshotConfig{Config: v.Config.Config, Name: name, Description: description, Hypervisor: v.Hypervisor, NICs: len(v.NetworkConfigs)}
	return f.addSnapshot(cfg, fakeSnapshotArchive(cfg, "memory of "+v.ID)), nil
}

// VMHibernate saves a running VM into a snapshot of its own and stops it, as cocoon's vm
// hibernate does in one pause, on either hypervisor; a failure leaves the VM running.
func (f *fakeCocoon) VMHibernate(_ context.Context, vm, name string) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	args := []string{"vm", "hibernate", "--name", name, vm}
	if err := f.call("VMHibernate", vm, name); err != nil {
		return err
	}
	v := f.vmByRef(vm)
	switch {
	case !f.caps.Hibernate:
		return cocoonErr(nil, `unknown command "hibernate" for "cocoon vm"`, args...)
	case v == nil:
		return notFoundVM(vm, args...)
	case v.State != cocoon.VMStateRunning:
		return cocoonErr(nil, fmt.Sprintf("hibernate VM %s: VM not running", v.ID), args...)
	case len(v.attached) > 0:
		return cocoonErr(cocoon.ErrInUse, fmt.Sprintf("hot-attached %s: detach before snapshot or hibernate", v.attached[0]), args...)
	case f.snapshots[name] != nil:
		return cocoonErr(cocoon.ErrAlreadyExists, fmt.Sprintf("snapshot name %q already exists", name), args...)
	}
	cfg := cocoon.SnapshotConfig{Config: v.Config.Config, Name: name, Hypervisor: v.Hypervisor, NICs: len(v.NetworkConfigs)}
	f.addSnapshot(cfg, fakeSnapshotArchive(cfg, "memory of "+v.ID))
	f.snapshots[name].ofVM = v.ID
	v.State, v.PID, v.SocketPath = cocoon.VMStateStopped, 0, ""
	f.emit(cocoon.VMModified, v.VM)
	return nil
}

// VMRestore runs a VM again from a snapshot a hibernation of that VM saved, in a new hypervisor.
func (f *fakeCocoon) VMRestore(_ context.Context, vm, snapshot string) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	args := []string{"vm", "restore", vm, snapshot}
	if err := f.call("VMRestore", vm, snapshot); err != nil {
		return err
	}
	v, snap := f.vmByRef(vm), f.snapshotByRef(snapshot)
	switch {
	case !f.caps.Hibernate:
		return cocoonErr(nil, `unknown command "restore" for "cocoon vm"`, args...)
	case v == nil:
		return notFoundVM(vm, args...)
	case snap == nil:
		return cocoonErr(cocoon.ErrNotFound, fmt.Sprintf("snapshot %s: snapshot not found", snapshot), args...)
	case snap.ofVM != v.ID:
		return cocoonErr(nil, fmt.Sprintf("snapshot %s does not belong to VM %s", snapshot, vm), args...)
	}
	f.boot(v)
	f.emit(cocoon.VMModified, v.VM)
	return nil
}

func (f *fakeCocoon) SnapshotInspect(_ context.Context, ref string) (*cocoon.Snapshot, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if err := f.call("SnapshotInspect", ref); err != nil {
		return nil, err
	}
	snap := f.snapshotByRef(ref)
	if snap == nil {
		return nil, cocoonErr(cocoon.ErrNotFound, fmt.Sprintf("snapshot %s: snapshot not found", ref), "snapshot", "inspect", ref)
	}
	out := snap.Snapshot
	return &out, nil
}

func (f *fakeCocoon) SnapshotList(context.Context) ([]cocoon.Snapshot, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if err := f.call("SnapshotList"); err != nil {
		return nil, err
	}
	out := make([]cocoon.Snapshot, 0, len(f.snapshots))
	for _, snap := range f.snapshots {
		out = append(out, snap.Snapshot)
	}
	return out, nil
}

func (f *fakeCocoonState) addSnapshot(cfg cocoon.SnapshotConfig, archive []byte) *cocoon.Snapshot {
	cfg.ID = f.newID("FAKESNAP")
	s := &fakeSnapshot{Snapshot: cocoon.Snapshot{SnapshotConfig: cfg, CreatedAt: time.Unix(1_700_000_000, 0)}, archive: archive}
	f.snapshots[cfg.Name] = s
	snap := s.Snapshot
	return &snap
}

// SnapshotExport writes the archive. Made to fail, it writes part of it first, as an export cut
// short does.
func (f *fakeCocoon) SnapshotExport(_ context.Context, ref string, w io.Writer) error {
	f.mu.Lock()
	err := f.call("SnapshotExport", ref)
	snap := f.snapshotByRef(ref)
	var archive []byte
	if snap != nil {
		archive = snap.archive
		if err == nil {
			f.exports[snap.Name] = archive
		}
	}
	f.mu.Unlock()
	switch {
	case err != nil:
		_, _ = w.Write(archive[:min(100, len(archive))])
		return err
	case snap == nil:
		return cocoonErr(cocoon.ErrNotFound, fmt.Sprintf("snapshot %s: snapshot not found", ref), "snapshot", "export", "-o", "-", ref)
	}
	_, err = w.Write(archive)
	return err
}

// SnapshotExportToDir writes the snapshot's files into dir, snapshot.json last, as cocoon's
// export --to-dir does; a failure leaves what it had written, as cocoon's does.
func (f *fakeCocoon) SnapshotExportToDir(_ context.Context, ref, dir string) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	args := []string{"snapshot", "export", "--to-dir", dir, ref}
	injected := f.call("SnapshotExportToDir", ref, dir)
	snap := f.snapshotByRef(ref)
	if snap == nil {
		return cocoonErr(cocoon.ErrNotFound, "export-to-dir: snapshot not found", args...)
	}
	if err := os.MkdirAll(dir, 0o750); err != nil {
		return cocoonErr(nil, "export-to-dir: "+err.Error(), args...)
	}
	if entries, err := os.ReadDir(dir); err != nil || len(entries) > 0 {
		return cocoonErr(nil, fmt.Sprintf("export-to-dir: target dir %s is not empty", dir), args...)
	}
	var envelope []byte
	tr := tar.NewReader(bytes.NewReader(snap.archive))
	for {
		hdr, err := tr.Next()
		if errors.Is(err, io.EOF) {
			break
		}
		body, readErr := io.ReadAll(tr)
		if err = cmp.Or(err, readErr); err != nil {
			return err
		}
		if hdr.Name == "snapshot.json" {
			envelope = body
			continue
		}
		if err := os.WriteFile(filepath.Join(dir, hdr.Name), body, 0o640); err != nil {
			return cocoonErr(nil, "export-to-dir: "+err.Error(), args...)
		}
		if injected != nil {
			return injected
		}
	}
	if injected != nil {
		return injected
	}
	return os.WriteFile(filepath.Join(dir, "snapshot.json"), envelope, 0o644)
}

// readFakeSnapshotDir reads a snapshot directory's snapshot.json as vm clone --from-dir does.
func readFakeSnapshotDir(dir string) (*fakeSnapshot, error) {
	data, err := os.ReadFile(filepath.Join(dir, "snapshot.json"))
	if err != nil {
		return nil, fmt.Errorf("snapshot.json missing in %s: snapshot envelope missing", dir)
	}
	var envelope cocoon.SnapshotExport
	if err := json.Unmarshal(data, &envelope); err != nil || envelope.Version != cocoon.SnapshotExportVersion {
		return nil, fmt.Errorf("decode %s: not a snapshot envelope", filepath.Join(dir, "snapshot.json"))
	}
	return &fakeSnapshot{Snapshot: cocoon.Snapshot{SnapshotConfig: envelope.Config}}, nil
}

func (f *fakeCocoon) SnapshotRemove(_ context.Context, ref string) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	if err := f.call("SnapshotRemove", ref); err != nil {
		return err
	}
	snap := f.snapshotByRef(ref)
	if snap == nil {
		return cocoonErr(cocoon.ErrNotFound, fmt.Sprintf("snapshot %s: snapshot not found", ref), "snapshot", "rm", ref)
	}
	delete(f.snapshots, snap.Name)
	return nil
}

// SnapshotImport reads a snapshot archive (snapshot.json first) to its end, as cocoon reads its
// stdin.
func (f *fakeCocoon) SnapshotImport(_ context.Context, r io.Reader, name, description string) (*cocoon.Snapshot, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	args := []string{"snapshot", "import", "--name", name}
	if err := f.call("SnapshotImport", name); err != nil {
		return nil, err
	}
	data, err := io.ReadAll(r)
	if err != nil {
		return nil, err
	}
	if f.snapshots[name] != nil {
		return nil, cocoonErr(cocoon.ErrAlreadyExists, fmt.Sprintf("snapshot name %q already exists", name), args...)
	}
	var manifest cocoon.SnapshotExport
	tr := tar.NewReader(bytes.NewReader(data))
	hdr, err := tr.Next()
	if err == nil && hdr.Name != "snapshot.json" {
		err = errors.New("the first entry is not snapshot.json")
	}
	if err == nil {
		err = json.NewDecoder(tr).Decode(&manifest)
	}
	if err != nil || manifest.Version != cocoon.SnapshotExportVersion {
		return nil, cocoonErr(cocoon.ErrInvalid, "invalid snapshot archive", args...)
	}
	cfg := manifest.Config
	cfg.Name, cfg.Description = name, description
	return f.addSnapshot(cfg, data), nil
}

// qcow2Magic starts a cloud image.
var qcow2Magic = []byte{'Q', 'F', 'I', 0xfb}

func (f *fakeCocoon) ImageImport(_ context.Context, r io.Reader, name string) (*cocoon.Image, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	args := []string{"image", "import", name}
	if err := f.call("ImageImport", name); err != nil {
		return nil, err
	}
	data, err := io.ReadAll(r)
	if err != nil {
		return nil, err
	}
	if !bytes.HasPrefix(data, qcow2Magic) {
		return nil, cocoonErr(cocoon.ErrInvalid, "cannot detect file type", args...)
	}
	return f.addImage(name, cocoon.ImageTypeCloudImg, int64(len(data))), nil
}

func (f *fakeCocoonState) addImage(name, kind string, size int64) *cocoon.Image {
	img := &cocoon.Image{ID: f.newID("FAKEIMG"), Name: name, Type: kind, Size: size, CreatedAt: time.Unix(1_700_000_000, 0)}
	f.images[name] = img
	out := *img
	return &out
}

func (f *fakeCocoon) ImagePull(_ context.Context, ref string, _ cocoon.PullOptions) (*cocoon.Image, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if err := f.call("ImagePull", ref); err != nil {
		return nil, err
	}
	return f.addImage(ref, cocoon.ImageTypeOCI, 1<<20), nil
}

func (f *fakeCocoon) ImageInspect(_ context.Context, ref string) (*cocoon.Image, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if err := f.call("ImageInspect", ref); err != nil {
		return nil, err
	}
	for _, img := range f.images {
		if img.Name == ref || img.ID == ref {
			out := *img
			return &out, nil
		}
	}
	return nil, cocoonErr(cocoon.ErrNotFound, fmt.Sprintf("image %q: not found in any backend", ref), "image", "inspect", ref)
}

func (f *fakeCocoon) ImageRemove(_ context.Context, ref string) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	if err := f.call("ImageRemove", ref); err != nil {
		return err
	}
	if _, ok := f.images[ref]; !ok {
		return cocoonErr(cocoon.ErrNotFound, fmt.Sprintf("image %q not found in any backend", ref), "image", "rm", ref)
	}
	delete(f.images, ref)
	return nil
}
