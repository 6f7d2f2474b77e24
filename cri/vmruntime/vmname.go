package vmruntime

import (
	"regexp"
	"strings"
)

// VMNamePrefix starts the name of every VM cocoon-cri makes. Startup reconcile recognises its own
// VMs by it.
const VMNamePrefix = "cri-"

// vmIDChars is how much of the container ID a VM name carries: it makes the name unique per
// container while leaving room for the pod and container names people look for in vm list.
const vmIDChars = 12

// maxVMName is cocoon's limit: ^[a-zA-Z0-9][a-zA-Z0-9._-]{0,62}$.
const maxVMName = 63

// Runs of anything else, dashes included, become one dash.
var vmNameUnsafe = regexp.MustCompile(`[^a-zA-Z0-9._]+`)

// vmName is deterministic, so a retried or interrupted start finds the VM it may have made:
// cri-<container ID prefix>-<pod>-<container>, cut to cocoon's 63 characters.
func vmName(containerID, podName, containerName string) string {
	readable := vmNameUnsafe.ReplaceAllString(podName+"-"+containerName, "-")
	name := VMNamePrefix + containerID[:vmIDChars] + "-" + readable
	if len(name) > maxVMName {
		name = name[:maxVMName]
	}
	return strings.TrimRight(name, "-._")
}
