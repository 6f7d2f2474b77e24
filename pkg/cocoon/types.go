package cocoon

import "time"

// The JSON shapes cocoon prints (docs/cocoon-contract.md section 1.3). They are shared
// by the client and by the test simulator, so both read and write exactly one transcript of the
// contract.

// VMState is a VM record's state as cocoon prints it.
type VMState string

const (
	VMStateCreating VMState = "creating"
	VMStateCreated  VMState = "created"
	VMStateRunning  VMState = "running"
	VMStateStopped  VMState = "stopped"
	VMStateError    VMState = "error"
	// VMStateStale is synthetic: the record says running but the hypervisor PID is dead. vm inspect
	// and status events show it; vm list -o json does not.
	VMStateStale VMState = "stopped (stale)"
)

// Hypervisor names as they appear in JSON. The on-disk directories drop the hyphen.
const (
	HypervisorCloudHypervisor = "cloud-hypervisor"
	HypervisorFirecracker     = "firecracker"
)

// Image types.
const (
	ImageTypeOCI      = "oci"
	ImageTypeCloudImg = "cloudimg"
)

// Config is the resource block shared by VM and snapshot records. Every field is omitempty.
type Config struct {
	CPU           int    `json:"cpu,omitempty"`
	Memory        int64  `json:"memory,omitempty"`
	Storage       int64  `json:"storage,omitempty"`
	QueueSize     int    `json:"queue_size,omitempty"`
	DiskQueueSize int    `json:"disk_queue_size,omitempty"`
	Image         string `json:"image,omitempty"`
	ImageDigest   string `json:"image_digest,omitempty"`
	ImageType     string `json:"image_type,omitempty"`
	Network       string `json:"network,omitempty"`
	NoDirectIO    bool   `json:"no_direct_io,omitempty"`
	Windows       bool   `json:"windows,omitempty"`
	// SharedMemory: the VM's RAM is shared (cloud-hypervisor memory shared=on), which vm fs attach
	// needs; fixed at create, inherited by snapshots and clones (v0.5, --shared-memory).
	SharedMemory bool `json:"shared_memory,omitempty"`
}

// VMConfig is a VM's configuration.
type VMConfig struct {
	Config
	Name string `json:"name"`
}

// VM is printed by vm inspect, vm create|run|clone -o json and vm list -o json, and appears inside
// status events.
type VM struct {
	ID         string   `json:"id"`
	Hypervisor string   `json:"hypervisor,omitempty"`
	State      VMState  `json:"state"`
	Config     VMConfig `json:"config"`
	PID        int      `json:"pid"`
	SocketPath string   `json:"socket_path,omitempty"`
	// VsockSocket is the hybrid vsock socket of the guest agent (v0.5; empty on v0.3.8).
	VsockSocket    string              `json:"vsock_socket,omitempty"`
	NetworkConfigs []*NetworkConfig    `json:"network_configs,omitempty"`
	StorageConfigs []*StorageConfig    `json:"storage_configs,omitempty"`
	FirstBooted    bool                `json:"first_booted"`
	SnapshotIDs    map[string]struct{} `json:"snapshot_ids,omitempty"`
	CreatedAt      time.Time           `json:"created_at"`
	UpdatedAt      time.Time           `json:"updated_at"`
	StartedAt      *time.Time          `json:"started_at,omitempty"`
	StoppedAt      *time.Time          `json:"stopped_at,omitempty"`
}

// NetworkConfig describes one guest NIC.
type NetworkConfig struct {
	Tap       string   `json:"tap"`
	Mac       string   `json:"mac"`
	NumQueues int      `json:"num_queues"`
	QueueSize int      `json:"queue_size"`
	Backend   string   `json:"backend,omitempty"`
	BridgeDev string   `json:"bridge_dev,omitempty"`
	NetnsPath string   `json:"netns_path,omitempty"`
	Network   *Network `json:"network,omitempty"`
}

// Network is a NIC's static guest address; nil means DHCP or no address.
type Network struct {
	IP      string `json:"ip,omitempty"`
	Gateway string `json:"gateway,omitempty"`
	Prefix  int    `json:"prefix,omitempty"`
}

// StorageRole says what a VM disk is for.
type StorageRole string

const (
	StorageRoleLayer  StorageRole = "layer"
	StorageRoleCOW    StorageRole = "cow"
	StorageRoleCidata StorageRole = "cidata"
	StorageRoleData   StorageRole = "data"
)

// StorageConfig describes one VM disk.
type StorageConfig struct {
	Path       string      `json:"path"`
	RO         bool        `json:"ro"`
	Serial     string      `json:"serial"`
	Role       StorageRole `json:"role"`
	MountPoint string      `json:"mount_point,omitempty"`
	FSType     string      `json:"fstype,omitempty"`
	DirectIO   *bool       `json:"direct_io,omitempty"`
}

// Image is printed by image inspect and image list -o json.
type Image struct {
	ID        string    `json:"id"`
	Name      string    `json:"name"`
	Type      string    `json:"type"`
	Size      int64     `json:"size"`
	CreatedAt time.Time `json:"created_at"`
}

// SnapshotConfig is a snapshot's configuration.
type SnapshotConfig struct {
	Config
	ID           string              `json:"id,omitempty"`
	Name         string              `json:"name"`
	Description  string              `json:"description,omitempty"`
	ImageBlobIDs map[string]struct{} `json:"image_blob_ids,omitempty"`
	Hypervisor   string              `json:"hypervisor,omitempty"`
	NICs         int                 `json:"nics,omitempty"`
}

// Snapshot is printed by snapshot inspect and snapshot list -o json.
type Snapshot struct {
	SnapshotConfig
	CreatedAt time.Time `json:"created_at"`
}

// SnapshotExport is snapshot.json, the first entry of a snapshot archive.
type SnapshotExport struct {
	Config  SnapshotConfig `json:"config"`
	Version int            `json:"version"`
}

// SnapshotExportVersion is the only archive version cocoon accepts.
const SnapshotExportVersion = 1

// BatchResult is printed by vm start|stop|rm -o json when every ref succeeded.
type BatchResult struct {
	Succeeded []string `json:"succeeded"`
}

// Event is one line of vm status --event --format json.
type Event struct {
	Event string `json:"event"`
	VM    VM     `json:"vm"`
}

// Event kinds.
const (
	EventAdded    = "ADDED"
	EventModified = "MODIFIED"
	EventDeleted  = "DELETED"
)
