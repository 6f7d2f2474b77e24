package cri

import (
	"context"

	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"
)

// Backend is a CRI runtime the edge hands requests to: the node's container runtime through
// passthrough, or cocoon-cri's own VM runtime. The edge knows nothing of how either works; it
// decides which one a request belongs to and merges what both answer.
type Backend interface {
	runtimeapi.RuntimeServiceServer
	runtimeapi.ImageServiceServer
}

// VMBackend is cocoon-cri's own runtime. Besides the CRI it answers the questions routing asks,
// from its records and without waiting on cocoon: the edge calls these on every routed request.
type VMBackend interface {
	Backend
	// HandlerName is the RuntimeClass handler the VM runtime serves.
	HandlerName() string
	// ServesHandler reports whether RunPodSandbox with this runtime handler makes a VM pod.
	ServesHandler(handler string) bool
	// OwnsSandbox and OwnsContainer report whether an ID (or an ID prefix) names one of its
	// records, an ambiguous prefix among them included (the VM runtime then explains).
	OwnsSandbox(idOrPrefix string) bool
	OwnsContainer(idOrPrefix string) bool
	// HoldsVMArtifact reports whether it holds a cocoon artifact (a snapshot or a cloud image,
	// which no container runtime can use) by this reference, ID or ID prefix.
	HoldsVMArtifact(ref string) bool
	// IsVMArtifact resolves ref in its registry and reports whether it is a cocoon artifact
	// (a snapshot or a cloud image) that only the VM runtime can use.
	IsVMArtifact(ctx context.Context, ref string, auth *runtimeapi.AuthConfig) (bool, error)
	// NotePull tells the VM runtime that the other runtime pulled ref with auth: a VM pod that
	// then needs ref as an OCI VM image brings it into cocoon with the same credentials.
	NotePull(ref string, auth *runtimeapi.AuthConfig)
	// CgroupDriver is the cgroup driver the VM runtime places VMs with.
	CgroupDriver() runtimeapi.CgroupDriver
}
