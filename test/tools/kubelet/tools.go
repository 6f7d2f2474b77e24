//go:build tools

// Package tools pins the Kubernetes binaries the tests drive: the kubelet of the conformance
// tests, and the cluster of hack/cluster.sh (kube-apiserver, kube-controller-manager,
// kube-scheduler, kube-proxy) with kubectl. k8s.io/kubernetes cannot be installed with go install (its
// staging modules are replace directives), so it gets a module of its own, apart from crictl's
// and critest's.
package tools

import (
	_ "k8s.io/kubernetes/cmd/kube-apiserver"
	_ "k8s.io/kubernetes/cmd/kube-controller-manager"
	_ "k8s.io/kubernetes/cmd/kube-proxy"
	_ "k8s.io/kubernetes/cmd/kube-scheduler"
	_ "k8s.io/kubernetes/cmd/kubectl"
	_ "k8s.io/kubernetes/cmd/kubelet"
)
