package vmruntime

import (
	"context"

	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"
)

// Version reports the CRI version the kubelet checks ("0.1.0") and cocoon-cri's own version.
func (s *Runtime) Version(context.Context, *runtimeapi.VersionRequest) (*runtimeapi.VersionResponse, error) {
	return &runtimeapi.VersionResponse{
		Version:           KubeletAPIVersion,
		RuntimeName:       RuntimeName,
		RuntimeVersion:    s.cfg.Version,
		RuntimeApiVersion: RuntimeAPIVersion,
	}, nil
}
