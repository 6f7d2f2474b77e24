//go:build tools

// Package tools pins the etcd that hack/cluster.sh runs under its API server, built from etcd's
// own module. A module of its own: etcd's server dependencies must not move the kubelet's.
package tools

import _ "go.etcd.io/etcd/server/v3"
