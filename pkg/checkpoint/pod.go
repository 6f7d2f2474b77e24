package checkpoint

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"time"
)

// PodFile describes a pod checkpoint directory (CheckpointPod's output_path): the pod, and each
// of its containers, as a snapshot directory (<container ID>/, cocoon's snapshot export --to-dir)
// with its metadata where cocoon can write and clone those, and as a checkpoint archive
// (<container ID>.tar, as CheckpointContainer writes it) elsewhere.
const PodFile = "pod.json"

// PodCheckpoint is PodFile.
type PodCheckpoint struct {
	Version        int         `json:"version"`
	CreatedAt      time.Time   `json:"createdAt"`
	Pod            Pod         `json:"pod"`
	RuntimeHandler string      `json:"runtimeHandler"`
	Containers     []PodMember `json:"containers"`
}

// PodMember is one container of a pod checkpoint.
type PodMember struct {
	Name string `json:"name"`
	// Archive is the container's checkpoint archive, a file name in the directory.
	Archive string `json:"archive,omitempty"`
	// Snapshot is the container's snapshot directory, a directory name in the directory, and
	// Metadata what an archive's first entry would say of it.
	Snapshot string    `json:"snapshot,omitempty"`
	Metadata *Metadata `json:"metadata,omitempty"`
}

// ReadPod reads the PodFile of the pod checkpoint directory dir: of this FormatVersion, with a
// container at least. An error that is not the file's absence wraps ErrInvalid.
func ReadPod(dir string) (*PodCheckpoint, error) {
	data, err := os.ReadFile(filepath.Join(dir, PodFile))
	if err != nil {
		return nil, err
	}
	var pc PodCheckpoint
	if err := json.Unmarshal(data, &pc); err != nil || pc.Version != FormatVersion || len(pc.Containers) == 0 {
		return nil, fmt.Errorf("%s is not a cocoon-cri pod checkpoint of version %d: %s unreadable: %w", dir, FormatVersion, PodFile, ErrInvalid)
	}
	return &pc, nil
}
