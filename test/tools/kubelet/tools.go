//go:build tools

// Package tools pins the kubelet the conformance test drives: k8s.io/kubernetes cannot be
// installed with go install (its staging modules are replace directives), so it gets a module of
// its own, apart from crictl's and critest's.
package tools

import _ "k8s.io/kubernetes/cmd/kubelet"
