package vmruntime

import (
	"context"
	"fmt"

	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"

	"github.com/cocoonstack/cocoon-cri/imagestore"
)

// ImageFsInfo reports the bytes and inodes that images (cocoon's root dir) and containers (the
// VMs' writable disks in cocoon's run dir) use, for the kubelet's eviction and image GC.
func (s *Runtime) ImageFsInfo(ctx context.Context, _ *runtimeapi.ImageFsInfoRequest) (*runtimeapi.ImageFsInfoResponse, error) {
	images, containers, at, err := s.images.FsUsage(ctx)
	if err != nil {
		return nil, fmt.Errorf("measure disk usage: %w", err)
	}
	return &runtimeapi.ImageFsInfoResponse{
		ImageFilesystems:     []*runtimeapi.FilesystemUsage{fsUsage(images, at.UnixNano())},
		ContainerFilesystems: []*runtimeapi.FilesystemUsage{fsUsage(containers, at.UnixNano())},
	}, nil
}

func fsUsage(u imagestore.Usage, at int64) *runtimeapi.FilesystemUsage {
	return &runtimeapi.FilesystemUsage{
		Timestamp:  at,
		FsId:       &runtimeapi.FilesystemIdentifier{Mountpoint: u.Dir},
		UsedBytes:  &runtimeapi.UInt64Value{Value: u.Bytes},
		InodesUsed: &runtimeapi.UInt64Value{Value: u.Inodes},
	}
}
