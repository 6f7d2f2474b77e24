//go:build tools

// Package tools pins the containerd the passthrough tests run beside cocoon-cri, as on a kubeadm
// node: the daemon and its runc shim, built from containerd's own module so the tests need no
// package of it. A module of its own: containerd's dependencies must not move crictl's or the
// kubelet's.
package tools

import (
	_ "github.com/containerd/containerd/v2/cmd/containerd"
	_ "github.com/containerd/containerd/v2/cmd/containerd-shim-runc-v2"
	_ "github.com/containerd/containerd/v2/cmd/ctr"
)
