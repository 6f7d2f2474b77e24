//go:build tools

// Package tools pins the test clients cocoon-cri is driven by: crictl and critest from cri-tools.
// `make tools` builds them into bin/ from this module, so the versions live in go.mod, not in scripts.
package tools

import (
	_ "sigs.k8s.io/cri-tools/cmd/crictl"
	_ "sigs.k8s.io/cri-tools/pkg/benchmark"
	_ "sigs.k8s.io/cri-tools/pkg/validate"
)
