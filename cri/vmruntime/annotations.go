package vmruntime

import (
	"fmt"
	"strings"
	"time"

	"k8s.io/apimachinery/pkg/api/resource"

	"github.com/cocoonstack/cocoon-cri/pkg/cocoon"
	"github.com/cocoonstack/cocoon-cri/pkg/store"
)

// Pod annotation keys, the ones vk-cocoon users already write (cocoon-common meta), so a pod moves
// from vk-cocoon to cocoon-cri unchanged where the key means the same thing.
const (
	AnnotationBackend    = "vm.cocoonstack.io/backend"
	AnnotationNoDirectIO = "vm.cocoonstack.io/no-direct-io"
	AnnotationStorage    = "cocoonset.cocoonstack.io/storage"
	AnnotationOS         = "cocoonset.cocoonstack.io/os"
	AnnotationNetwork    = "cocoonset.cocoonstack.io/network"
	// AnnotationHibernateAfter is cocoon-cri's own: how long the pod's VM may sit idle before it
	// hibernates (docs/hibernation.md).
	AnnotationHibernateAfter = "vm.cocoonstack.io/hibernate-after"
	// AnnotationForkFrom is vk-cocoon's key, naming a pod (NAMESPACE/NAME) of this node rather than
	// a VM: the pod's VM starts as a copy of that pod's running VM (docs/hibernation.md, Fork).
	AnnotationForkFrom = "vm.cocoonstack.io/fork-from"
)

// MinHibernateAfter is the shortest idle period a pod may ask for.
const MinHibernateAfter = time.Second

// parseVMOptions reads the pod's cocoon annotations. Unlike vk-cocoon, which reads anything but
// "true" as false, a malformed value is refused: a typo must not silently change the VM.
func parseVMOptions(annotations map[string]string) (store.VMOptions, error) {
	var o store.VMOptions
	if v, ok := annotations[AnnotationBackend]; ok {
		switch v {
		case cocoon.HypervisorCloudHypervisor, cocoon.HypervisorFirecracker:
			o.Backend = v
		default:
			return o, fmt.Errorf("annotation %s=%q: want %q or %q", AnnotationBackend, v, cocoon.HypervisorCloudHypervisor, cocoon.HypervisorFirecracker)
		}
	}
	if v, ok := annotations[AnnotationNoDirectIO]; ok {
		switch v {
		case "true":
			o.NoDirectIO = true
		case "false":
		default:
			return o, fmt.Errorf("annotation %s=%q: want \"true\" or \"false\"", AnnotationNoDirectIO, v)
		}
	}
	if v, ok := annotations[AnnotationStorage]; ok {
		q, err := resource.ParseQuantity(v)
		if err != nil {
			return o, fmt.Errorf("annotation %s=%q: not a quantity such as 20Gi: %v", AnnotationStorage, v, err)
		}
		if q.Value() < MinStorage {
			return o, fmt.Errorf("annotation %s=%q: cocoon needs at least 10G of storage", AnnotationStorage, v)
		}
		o.Storage = q.Value()
	}
	if v, ok := annotations[AnnotationOS]; ok {
		switch v {
		case "linux", "android":
		case "windows":
			o.Windows = true
		default:
			return o, fmt.Errorf("annotation %s=%q: want linux, windows or android", AnnotationOS, v)
		}
	}
	if v, ok := annotations[AnnotationNetwork]; ok {
		if strings.TrimSpace(v) == "" {
			return o, fmt.Errorf("annotation %s is empty: name a CNI network or drop the annotation", AnnotationNetwork)
		}
		o.Network = v
	}
	if v, ok := annotations[AnnotationForkFrom]; ok {
		namespace, name, found := strings.Cut(v, "/")
		if !found || namespace == "" || name == "" || strings.Contains(name, "/") {
			return o, fmt.Errorf("annotation %s=%q: want NAMESPACE/NAME of a pod on this node", AnnotationForkFrom, v)
		}
		o.ForkFrom = v
	}
	if v, ok := annotations[AnnotationHibernateAfter]; ok {
		d, err := ParseHibernateAfter(v)
		if err != nil {
			return o, fmt.Errorf("annotation %s=%q: %w", AnnotationHibernateAfter, v, err)
		}
		o.HibernateAfter = d
	}
	return o, nil
}

// ParseHibernateAfter reads an idle period: a Go duration of at least MinHibernateAfter, or 0 for
// never.
func ParseHibernateAfter(v string) (time.Duration, error) {
	d, err := time.ParseDuration(v)
	switch {
	case err != nil:
		return 0, fmt.Errorf("not a duration such as 10m: %v", err)
	case d < 0, d > 0 && d < MinHibernateAfter:
		return 0, fmt.Errorf("want 0 (never) or at least %s", MinHibernateAfter)
	}
	return d, nil
}
