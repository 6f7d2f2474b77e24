package store

import (
	"encoding/json"
	"maps"
	"slices"
	"time"

	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/proto"
	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"
)

// Proto stores a CRI message as protojson inside a record, so records stay readable and survive
// field additions in the CRI.
type Proto[M proto.Message] struct{ Msg M }

// MarshalJSON implements json.Marshaler.
func (p Proto[M]) MarshalJSON() ([]byte, error) { return protojson.Marshal(p.Msg) }

// UnmarshalJSON implements json.Unmarshaler.
func (p *Proto[M]) UnmarshalJSON(data []byte) error {
	var zero M
	msg := zero.ProtoReflect().Type().New().Interface().(M)
	if err := (protojson.UnmarshalOptions{DiscardUnknown: true}).Unmarshal(data, msg); err != nil {
		return err
	}
	p.Msg = msg
	return nil
}

// SandboxState is a sandbox's lifecycle state.
type SandboxState string

const (
	// SandboxCreating marks a RunPodSandbox that has not finished. A record left in this state by a
	// crash is rolled back at startup, so the kubelet's retry starts clean.
	SandboxCreating SandboxState = "creating"
	SandboxReady    SandboxState = "ready"
	SandboxNotReady SandboxState = "notready"
)

// Sandbox is a pod sandbox.
type Sandbox struct {
	ID string `json:"id"`
	// Name is unique among sandboxes: the kubelet's metadata name_namespace_uid_attempt.
	Name           string                              `json:"name"`
	State          SandboxState                        `json:"state"`
	Config         Proto[*runtimeapi.PodSandboxConfig] `json:"config"`
	RuntimeHandler string                              `json:"runtime_handler"`
	// NetNS is the path of the pod's network namespace; empty once removed.
	NetNS     string    `json:"netns,omitempty"`
	CreatedAt int64     `json:"created_at"` // Unix nanoseconds
	VM        VMOptions `json:"vm"`
	// Network is the pod's CNI attachment. It is recorded before CNI ADD runs, so a crash during
	// ADD leaves what DEL needs to release the IP.
	Network *PodNetwork `json:"network,omitempty"`
}

// PodNetwork is a sandbox's attachment to the cluster network.
type PodNetwork struct {
	// ConfList is the CNI configuration the sandbox was added with, kept for DEL: the node's
	// configuration may change while the pod lives.
	ConfList json.RawMessage `json:"conf_list"`
	// Result is the CNI ADD result; nil until ADD succeeded, and again after DEL.
	Result json.RawMessage `json:"result,omitempty"`
	// IPs are the pod's addresses, the primary first.
	IPs []string `json:"ips,omitempty"`
	// MAC is the pod interface's hardware address: the guest NIC takes it.
	MAC string `json:"mac,omitempty"`
	// Released is set once CNI DEL succeeded (StopPodSandbox), so DEL runs once.
	Released bool `json:"released,omitempty"`
}

// VMOptions are the pod's cocoon settings, parsed from its annotations when the sandbox is made.
type VMOptions struct {
	Backend    string `json:"backend,omitempty"` // cocoon.Hypervisor*; empty = cloud-hypervisor
	NoDirectIO bool   `json:"no_direct_io,omitempty"`
	Storage    int64  `json:"storage,omitempty"` // COW disk bytes; 0 = default
	Windows    bool   `json:"windows,omitempty"`
	Network    string `json:"network,omitempty"` // CNI conflist name for cocoon
	// ForkFrom is the pod (NAMESPACE/NAME) whose running VM the pod's VM is a copy of.
	ForkFrom string `json:"fork_from,omitempty"`
	// HibernateAfter is how long the pod's VM must be idle before it hibernates; 0 never.
	HibernateAfter time.Duration `json:"hibernate_after,omitempty"`
}

func (s *Sandbox) key() string          { return s.ID }
func (s *Sandbox) uniqueKeys() []string { return []string{"name/" + s.Name} }
func (s *Sandbox) clone() *Sandbox {
	c := *s
	if s.Network != nil {
		n := *s.Network
		n.IPs = slices.Clone(s.Network.IPs)
		c.Network = &n
	}
	return &c
}

// SandboxNameKey is the unique key a sandbox name is indexed under (for Table.Lookup).
func SandboxNameKey(name string) string { return "name/" + name }

// ContainerState is a container's lifecycle state.
type ContainerState string

const (
	ContainerCreated ContainerState = "created"
	ContainerRunning ContainerState = "running"
	ContainerExited  ContainerState = "exited"
)

// Container is a container: one VM over its life.
type Container struct {
	ID        string `json:"id"`
	SandboxID string `json:"sandbox_id"`
	// Name is unique among containers: name_sandboxname_attempt.
	Name   string                             `json:"name"`
	Config Proto[*runtimeapi.ContainerConfig] `json:"config"`
	// ImageRef is the image as the user named it; ImageID the record it resolved to.
	ImageRef string         `json:"image_ref"`
	ImageID  string         `json:"image_id"`
	State    ContainerState `json:"state"`
	// LogPath is the container's CRI log file (sandbox log directory + config log path), or empty.
	LogPath    string `json:"log_path,omitempty"`
	CreatedAt  int64  `json:"created_at"`
	StartedAt  int64  `json:"started_at,omitempty"`
	FinishedAt int64  `json:"finished_at,omitempty"`
	ExitCode   int32  `json:"exit_code,omitempty"`
	Reason     string `json:"reason,omitempty"`
	Message    string `json:"message,omitempty"`
	// MainDetached: the container's command runs in its guest apart from any session of
	// cocoon-cri's, its output in pipes there that cocoon-cri follows, so that a hibernation or a
	// restart of cocoon-cri does not cut it. Recorded before the command is launched.
	MainDetached bool `json:"main_detached,omitempty"`
	VM           VM   `json:"vm"`
}

// VMMode says how a container's VM is made.
type VMMode string

const (
	// VMClone clones a cocoon snapshot (vm clone).
	VMClone VMMode = "clone"
	// VMBoot boots a cocoon image (vm create, then vm start).
	VMBoot VMMode = "boot"
)

// VM is the cocoon VM behind a container: the spec decided at CreateContainer and, once started,
// cocoon's ID and the hypervisor PID.
type VM struct {
	Name       string `json:"name"`
	Mode       VMMode `json:"mode"`
	Source     string `json:"source"` // local snapshot or image name in cocoon, or a snapshot directory (FromDir)
	CPU        int    `json:"cpu"`
	Memory     int64  `json:"memory"`
	Storage    int64  `json:"storage"`
	Backend    string `json:"backend"`
	NoDirectIO bool   `json:"no_direct_io,omitempty"`
	Windows    bool   `json:"windows,omitempty"`
	Network    string `json:"network,omitempty"`
	// NICs is the --nics to give cocoon; 0 keeps a snapshot's count.
	NICs int `json:"nics,omitempty"`
	// DirectBoot: the guest boots its kernel directly (an OCI VM image, or a snapshot of a VM that
	// did). See cocoon.StopsAtOnce.
	DirectBoot bool `json:"direct_boot,omitempty"`
	// FromDir: Source is a snapshot directory (a pod checkpoint's container), which the clone
	// reads in place (cocoon vm clone --from-dir) and never changes.
	FromDir bool `json:"from_dir,omitempty"`
	// OnDemand marks a clone that reads its memory lazily from the source snapshot, which must stay
	// on disk while the VM exists.
	OnDemand bool `json:"on_demand,omitempty"`
	// NetNS is the network namespace cocoon made for the VM; the pod interface lives there while the
	// VM runs.
	NetNS string `json:"netns,omitempty"`
	// PullBase makes a clone fetch the snapshot's base image by its recorded digest when the node
	// lacks it: a snapshot holds the VM's state, not the image its disks build on.
	PullBase bool   `json:"pull_base,omitempty"`
	ID       string `json:"id,omitempty"`
	PID      int    `json:"pid,omitempty"`
	// GuestExec is how commands reach this VM's guest, once learned: "cocoon vm exec" once its
	// cocoon-agent answered; "ssh" or "" once it was found to have none (cocoon says it has no
	// vsock device, or the agent did not answer within the guest-ready timeout of the start).
	// GuestExecKnown says whether it was learned at all.
	GuestExec      string `json:"guest_exec,omitempty"`
	GuestExecKnown bool   `json:"guest_exec_known,omitempty"`
	// APISocket is the hypervisor's API socket (cocoon's socket_path): where its console is found.
	APISocket string `json:"api_socket,omitempty"`
	// PIDStart is when the hypervisor started (clock ticks since boot). With PID it names the
	// process: statistics must not read a later process that reuses the PID.
	PIDStart uint64 `json:"pid_start,omitempty"`
	// COWPath is the VM's writable disk; its allocated bytes are the container's writable layer.
	COWPath string `json:"cow_path,omitempty"`
	// Cgroup is the cgroup the hypervisor was put in (<cgroup_parent>/<container ID>), and
	// CgroupCreated the topmost cgroup cocoon-cri had to make for it: both go when the VM does.
	Cgroup        string `json:"cgroup,omitempty"`
	CgroupCreated string `json:"cgroup_created,omitempty"`
	// SSHHostKey is the guest sshd's host key as first seen (authorized_keys format); a different
	// key later is refused.
	SSHHostKey string `json:"ssh_host_key,omitempty"`
	// SharedMemory: the VM's RAM is shared with the host (cocoon --shared-memory, or a snapshot
	// made with it), so it can take a virtio-fs share.
	SharedMemory bool `json:"shared_memory,omitempty"`
	// Share is the virtio-fs share of the container's directory volumes, while it exists.
	Share Share `json:"share,omitzero"`
	// ForkOf is the running container whose VM this one is a copy of (the pod's fork-from): its
	// VM is saved at StartContainer and this one cloned from the save, which Source then names.
	ForkOf string `json:"fork_of,omitempty"`
	// Hibernation is where the VM's state is kept while it hibernates.
	Hibernation Hibernation `json:"hibernation,omitzero"`
	// Pooled: the VM came from a warm pool (Name is the pool VM's), handed to the container at
	// StartContainer instead of a clone. Recorded before the hand-over, so that a restart finds
	// one it cut short.
	Pooled bool `json:"pooled,omitempty"`
	// GuestNIC is the guest's name of the VM's NIC, where it is known: a pool learns it when it
	// makes the VM.
	GuestNIC string `json:"guest_nic,omitempty"`
}

// Hibernation is a running container's VM saved and its hypervisor ended (cocoon vm hibernate):
// the container stays RUNNING, and the VM resumes from Snapshot on use (cocoon vm restore).
type Hibernation struct {
	// Snapshot is the cocoon snapshot holding the VM's memory and disk. It is recorded before
	// cocoon is asked, so that a restart finds what a hibernation cut short.
	Snapshot string `json:"snapshot,omitempty"`
	// Since is when the VM hibernated (Unix nanoseconds); 0 while the hibernation is under way.
	Since int64 `json:"since,omitempty"`
}

// Hibernated says whether the VM is saved and its hypervisor gone.
func (v *VM) Hibernated() bool { return v.Hibernation.Since != 0 }

// Share is the virtio-fs share a VM's guest mounts the container's directory volumes from: a
// directory holding one bind mount of each volume, served by a virtiofsd of its own. Dir and
// Socket are recorded before anything is made, so that whatever a crash leaves is found again.
type Share struct {
	Dir    string `json:"dir,omitempty"`
	Socket string `json:"socket,omitempty"`
	// Volumes is how many bind mounts Dir holds, named 0, 1, ...
	Volumes int `json:"volumes,omitempty"`
	// PID and PIDStart name the virtiofsd process.
	PID      int    `json:"pid,omitempty"`
	PIDStart uint64 `json:"pid_start,omitempty"`
	// Attached: cocoon attached the share to the VM.
	Attached bool `json:"attached,omitempty"`
}

func (c *Container) key() string          { return c.ID }
func (c *Container) uniqueKeys() []string { return []string{"name/" + c.Name} }
func (c *Container) clone() *Container    { n := *c; return &n }

// ContainerNameKey is the unique key a container name is indexed under (for Table.Lookup).
func ContainerNameKey(name string) string { return "name/" + name }

// ImageKind says what a CRI image is in cocoon.
type ImageKind string

const (
	// ImageSnapshot is a cocoon snapshot: containers clone it.
	ImageSnapshot ImageKind = "snapshot"
	// ImageCloud is a cloud (OS disk) image: containers boot it with UEFI.
	ImageCloud ImageKind = "cloudimg"
	// ImageOCI is an OCI VM image (kernel and initrd in layers): containers direct-boot it.
	ImageOCI ImageKind = "oci"
)

// Image is a CRI image and the cocoon artifact behind it.
type Image struct {
	// ID is the image's digest ("sha256:<hex>").
	ID          string    `json:"id"`
	RepoTags    []string  `json:"repo_tags,omitempty"`
	RepoDigests []string  `json:"repo_digests,omitempty"`
	Size        int64     `json:"size"`
	Kind        ImageKind `json:"kind"`
	// LocalName is the artifact's name in cocoon (snapshot name or image name), or the snapshot
	// directory of a FromDir image.
	LocalName string `json:"local_name"`
	// FromDir: the image is a snapshot directory outside cocoon (a pod checkpoint's container),
	// cloned in place with vm clone --from-dir. It is the checkpoint's owner's: cocoon-cri only
	// reads it, and removing the image drops only the record.
	FromDir bool `json:"from_dir,omitempty"`
	// Labels are the image's labels (OCI image config); cocoon.ssh.* ones set the guest login.
	Labels map[string]string `json:"labels,omitempty"`
	// Snapshot describes a snapshot artifact: the floor of every clone's resources.
	Snapshot  *SnapshotInfo `json:"snapshot,omitempty"`
	CreatedAt int64         `json:"created_at"`
	// Removed marks an image the CRI no longer shows whose artifact is still needed by a
	// container (a clone reading the snapshot's memory on demand, or a container not yet
	// started). The artifact is deleted once nothing needs it.
	Removed bool `json:"removed,omitempty"`
}

// SnapshotInfo is what a clone needs to know about its source snapshot.
type SnapshotInfo struct {
	CPU        int    `json:"cpu"`
	Memory     int64  `json:"memory"`
	Storage    int64  `json:"storage"`
	NICs       int    `json:"nics"`
	Hypervisor string `json:"hypervisor"`
	ImageType  string `json:"image_type,omitempty"`
	Windows    bool   `json:"windows,omitempty"`
	// BaseImage is the image the snapshot's disks build on, as cocoon recorded it, and BaseDigest
	// the digest it recorded with it.
	BaseImage  string `json:"base_image,omitempty"`
	BaseDigest string `json:"base_digest,omitempty"`
}

func (i *Image) key() string { return i.ID }

// uniqueKeys are the image's references: a tag or digest reference names one image.
func (i *Image) uniqueKeys() []string {
	return append(slices.Clone(i.RepoTags), i.RepoDigests...)
}

func (i *Image) clone() *Image {
	c := *i
	c.RepoTags = slices.Clone(i.RepoTags)
	c.RepoDigests = slices.Clone(i.RepoDigests)
	c.Labels = maps.Clone(i.Labels)
	if i.Snapshot != nil {
		s := *i.Snapshot
		c.Snapshot = &s
	}
	return &c
}

// PoolVM is a VM of a warm pool: cloned from a snapshot image ahead of any pod, on a placeholder
// network of its own, and handed to a pod's container at StartContainer instead of a clone. It
// belongs to no pod until then. The record is written before cocoon is asked, so that a restart
// finds what a fill cut short.
type PoolVM struct {
	// Name is the VM's name in cocoon (cri-pool-<random>), and the record's key.
	Name string `json:"name"`
	// Image is the image record's ID, and Ref the pool's reference as configured.
	Image string `json:"image"`
	Ref   string `json:"ref"`
	// Spec is the VM as a pod of the image with no limits and no annotations would have it: a pod
	// whose own spec differs cannot take this VM.
	Spec VM `json:"spec"`
	// Ready: the VM is cloned, placed and its guest answers; it can be handed over.
	Ready     bool      `json:"ready,omitempty"`
	CreatedAt time.Time `json:"created_at"`
}

func (p *PoolVM) key() string { return p.Name }

func (p *PoolVM) uniqueKeys() []string { return nil }

func (p *PoolVM) clone() *PoolVM {
	c := *p
	return &c
}
