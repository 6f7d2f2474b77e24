package vmruntime

import (
	"cmp"
	"fmt"

	"k8s.io/apimachinery/pkg/api/resource"
	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"

	"github.com/cocoonstack/cocoon-cri/pkg/cocoon"
	"github.com/cocoonstack/cocoon-cri/pkg/store"
)

// planVM decides the VM a container gets: clone a snapshot image or boot a VM image, and its size.
//
// Size: vCPUs from the CPU limit (quota/period), else the CPU request (shares), rounded up; memory
// from the memory limit. A boot with neither gets the configured defaults; a clone gets the
// snapshot's size, which is also its floor (a memory snapshot cannot shrink), and grows to the
// limits only where cocoon can resize a clone (cloneResizes: v0.3.8, cloud-hypervisor). Elsewhere
// it runs at the snapshot's size, which honours the limits as the ceilings they are; a storage
// annotation it cannot honour is refused. Memory is raised to cocoon's 512 MiB minimum and vCPUs
// are capped at the host's cores, which cocoon cannot exceed.
func (s *Runtime) planVM(id string, cfg *runtimeapi.ContainerConfig, sb *store.Sandbox, img *store.Image, cloneResizes bool) (store.VM, error) {
	md := sb.Config.Msg.GetMetadata()
	vm := store.VM{
		Name:       vmName(id, md.GetName(), cfg.GetMetadata().GetName()),
		Source:     img.LocalName,
		NoDirectIO: sb.VM.NoDirectIO,
	}
	cpus, memory := s.requestedSize(cfg.GetLinux().GetResources())

	switch img.Kind {
	case store.ImageSnapshot:
		snap := img.Snapshot
		if snap == nil {
			return vm, fmt.Errorf("image %s has no snapshot description; re-import it", img.ID)
		}
		firecracker := snap.Hypervisor == cocoon.HypervisorFirecracker
		switch {
		case snap.Hypervisor != cocoon.HypervisorCloudHypervisor && !firecracker:
			return vm, invalid("image %s is a snapshot taken under %q, a hypervisor cocoon-cri does not know: use one taken under %s or %s",
				img.RepoTags, snap.Hypervisor, cocoon.HypervisorCloudHypervisor, cocoon.HypervisorFirecracker)
		case sb.VM.Backend != "" && sb.VM.Backend != snap.Hypervisor:
			return vm, invalid("annotation %s=%s, but image %s is a snapshot taken under %s, and a clone runs under its snapshot's hypervisor: "+
				"drop the annotation or use a snapshot taken under %s", AnnotationBackend, sb.VM.Backend, img.RepoTags, snap.Hypervisor, sb.VM.Backend)
		case firecracker && snap.NICs == 0:
			// cloud-hypervisor hot-plugs the pod's NIC into such a clone; Firecracker restores a
			// snapshot's devices as they were.
			return vm, invalid("image %s is a Firecracker snapshot of a VM without a NIC, and Firecracker cannot add one to a clone, "+
				"so the pod's network could not reach it: take the snapshot from a VM with one NIC", img.RepoTags)
		}
		if snap.NICs > 1 {
			return vm, invalid("image %s is a snapshot of a VM with %d NICs; a pod has one network interface, so its VM must have one NIC",
				img.RepoTags, snap.NICs)
		}
		// A restored guest has its snapshot's memory and cannot shrink: in a pod cgroup limited below
		// it, the hypervisor would be OOM-killed as the guest touches its memory.
		if limit := cfg.GetLinux().GetResources().GetMemoryLimitInBytes(); limit > 0 && snap.Memory > limit {
			return vm, invalid("image %s is a snapshot of a VM with %s of memory, more than the container's memory limit of %s: "+
				"a restored VM cannot shrink; raise the limit to at least %s or use a smaller snapshot",
				img.RepoTags, quantity(snap.Memory), quantity(limit), quantity(snap.Memory))
		}
		if s.cfg.MaxStorage > 0 && snap.Storage > s.cfg.MaxStorage {
			return vm, invalid("image %s is a snapshot of a VM with a %s disk, above the %s this node allows (--max-storage)",
				img.RepoTags, quantity(snap.Storage), quantity(s.cfg.MaxStorage))
		}
		vm.Mode = store.VMClone
		vm.Backend = snap.Hypervisor
		if snap.NICs == 0 {
			vm.NICs = 1
		}
		// cocoon refuses to resize a Firecracker clone in every release.
		cloneResizes = cloneResizes && !firecracker
		vm.CPU, vm.Memory, vm.Storage = snap.CPU, snap.Memory, snap.Storage
		vm.Windows = snap.Windows
		vm.DirectBoot = snap.ImageType != cocoon.ImageTypeCloudImg
		vm.PullBase = snap.BaseImage != ""
		if cloneResizes {
			vm.CPU, vm.Memory = max(vm.CPU, cpus), max(vm.Memory, memory)
		}
		// Firecracker maps a clone's memory from its own hard link of the snapshot's: the snapshot
		// may go. A snapshot directory is its owner's: its clone takes the memory in cocoon's
		// default way (a private map of its own link to the file) rather than reading it lazily.
		vm.OnDemand = !firecracker && !img.FromDir
		vm.FromDir = img.FromDir
		switch {
		case cloneResizes:
			vm.Storage = max(vm.Storage, sb.VM.Storage)
		case sb.VM.Storage > vm.Storage:
			return vm, invalid("annotation %s asks for %d bytes of storage, more than the %d of snapshot %s, and this cocoon cannot resize a clone "+
				"(its size is its snapshot's since v0.5): drop the annotation or use a snapshot with a larger disk",
				AnnotationStorage, sb.VM.Storage, vm.Storage, img.RepoTags)
		}
	case store.ImageCloud, store.ImageOCI:
		vm.Mode = store.VMBoot
		vm.NICs = 1
		vm.Backend = cmp.Or(sb.VM.Backend, cocoon.HypervisorCloudHypervisor)
		vm.Windows = sb.VM.Windows
		vm.DirectBoot = img.Kind == store.ImageOCI
		if vm.Backend == cocoon.HypervisorFirecracker && img.Kind != store.ImageOCI {
			return vm, invalid("image %s is a cloud image (UEFI boot), and Firecracker boots OCI VM images only (direct kernel boot): "+
				"drop annotation %s=%s or use an OCI VM image", img.RepoTags, AnnotationBackend, cocoon.HypervisorFirecracker)
		}
		if img.Kind == store.ImageOCI && vm.Windows {
			return vm, invalid("image %s is an OCI VM image (direct kernel boot); Windows guests need a cloud image: drop annotation %s=windows",
				img.RepoTags, AnnotationOS)
		}
		vm.CPU = cpus
		if vm.CPU == 0 {
			vm.CPU = s.cfg.DefaultVCPUs
		}
		vm.Memory = memory
		if vm.Memory == 0 {
			vm.Memory = s.cfg.DefaultMemory
		}
		vm.Storage = sb.VM.Storage
		if vm.Storage == 0 {
			vm.Storage = s.cfg.DefaultStorage
		}
	default:
		return vm, fmt.Errorf("image %s has unknown kind %q", img.ID, img.Kind)
	}
	vm.CPU = min(max(vm.CPU, 1), s.cfg.HostCPUs)
	vm.Memory = max(roundUpMiB(vm.Memory), MinMemory)
	vm.Storage = max(vm.Storage, MinStorage)
	return vm, nil
}

// quantity writes bytes as Kubernetes does (1Gi, 1536Mi).
func quantity(bytes int64) string {
	return resource.NewQuantity(bytes, resource.BinarySI).String()
}

// requestedSize reads vCPUs and memory bytes from the container's resources; 0 means unset.
func (s *Runtime) requestedSize(r *runtimeapi.LinuxContainerResources) (cpus int, memory int64) {
	switch {
	case r.GetCpuQuota() > 0 && r.GetCpuPeriod() > 0:
		cpus = int((r.GetCpuQuota() + r.GetCpuPeriod() - 1) / r.GetCpuPeriod())
	case r.GetCpuShares() > minShares:
		cpus = int((r.GetCpuShares() + sharesPerCPU - 1) / sharesPerCPU)
	}
	return cpus, r.GetMemoryLimitInBytes()
}

// The kubelet's CPU shares: 1024 per CPU requested, and 2 for a container that requests none.
const (
	sharesPerCPU = 1024
	minShares    = 2
)

func roundUpMiB(n int64) int64 {
	const mib = 1 << 20
	return (n + mib - 1) / mib * mib
}
