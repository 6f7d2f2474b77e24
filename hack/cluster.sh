#!/usr/bin/env bash
# hack/cluster.sh up [--nodes N] | down: a Kubernetes of N nodes (1 to 3, default 1) on this
# machine, to try cocoon-cri with kubectl.
#
# up builds what it needs (make setup build tools; the first time takes a while) and starts, in
# private network namespaces with every file under one directory, on every node: cocoon-cri on the
# cocoon simulator with containerd beside it through passthrough, a CNI bridge with the node's pod
# subnet (10.88.<i>.0/24), the kubelet (cocoon-node, cocoon-node-2, cocoon-node-3) and kube-proxy;
# on the first node etcd, kube-apiserver, kube-controller-manager, kube-scheduler and CoreDNS (the
# kube-dns Service, 10.96.0.10, every pod's resolver). The nodes
# share one network (10.89.0.0/24) with routes to each other's pod subnets, and a registry on it
# (10.89.0.1:5000, plain HTTP) that every node pulls from. It applies deploy/runtimeclass.yaml,
# imports two VM images on every node (cocoon.local/agent-sandbox:v1, a busybox guest serving HTTP
# on port 80; cocoon.local/crashing:v1, whose VM crashes 10 s after it starts) and prints the
# environment for kubectl, crictl (the first node) and the registry. down stops everything and
# removes it.
#
# One cluster at a time: it links the first node's namespace to the host with 10.89.255.1/30,
# where kubectl reaches the API server, and routes the nodes' network through it.
# COCOON_CLUSTER_DIR is where it lives (/tmp/cocoon-cluster).
set -euo pipefail
cd "$(dirname "$0")/.."
dir=${COCOON_CLUSTER_DIR:-/tmp/cocoon-cluster}
bin=${COCOON_CRI_BIN:-$PWD/bin}
export COCOON_CRI_BIN=$bin

running() { [ -f "$dir/pid" ] && kill -0 "$(cat "$dir/pid")" 2>/dev/null; }

up() {
  nodes=1
  while [ $# -gt 0 ]; do
    case $1 in
      --nodes) nodes=${2:-}; shift 2 || { usage; exit 2; } ;;
      --nodes=*) nodes=${1#--nodes=}; shift ;;
      *) usage; exit 2 ;;
    esac
  done
  case $nodes in
    1|2|3) ;;
    *) echo "cluster.sh: --nodes $nodes: a cluster has 1 to 3 nodes" >&2; exit 2 ;;
  esac
  if running; then
    echo "cluster.sh: a cluster is up already in $dir: hack/cluster.sh down first" >&2
    exit 1
  fi
  rm -rf "$dir"
  mkdir -p "$dir"
  # The cluster is test/cmd/cocoon-cluster, the end-to-end tests' harness as a program (make
  # build builds it beside cocoon-cri and the simulator, which it runs); COCOON_CLUSTER_SERVER is
  # one already built (the tests pass their own, beside their race-built cocoon-cri). It serves
  # until SIGTERM, in a session of its own, so the terminal's ^C does not reach it.
  server=${COCOON_CLUSTER_SERVER:-}
  if [ -z "$server" ]; then
    make -s setup build tools
    server=$PWD/bin/cocoon-cluster
  fi
  setsid "$server" --dir "$dir" --nodes "$nodes" </dev/null >"$dir/cluster.log" 2>&1 &
  echo $! >"$dir/pid"
  for _ in $(seq 600); do
    [ -f "$dir/env" ] && break
    if ! running; then
      echo "cluster.sh: the cluster did not come up; the end of $dir/cluster.log:" >&2
      tail -40 "$dir/cluster.log" >&2
      exit 1
    fi
    sleep 1
  done
  if [ ! -f "$dir/env" ]; then
    echo "cluster.sh: the cluster is not up after 10 minutes; see $dir/cluster.log, then hack/cluster.sh down" >&2
    exit 1
  fi
  cat "$dir/env"
  cat >&2 <<TXT
# kubectl is $bin/kubectl; crictl's endpoint is the first node's. A VM pod:
#   $bin/kubectl run vm --image cocoon.local/agent-sandbox:v1 --image-pull-policy Never \\
#     --overrides '{"spec": {"runtimeClassName": "cocoon"}}'
# cocoon-cri's log: $(sed -n 's/^log=//p' "$dir/node"); hack/cluster.sh down removes it all.
TXT
}

down() {
  if running; then
    pid=$(cat "$dir/pid")
    kill -TERM "$pid"
    # The server removes pods, VMs, namespaces and files before it exits.
    for _ in $(seq 180); do kill -0 "$pid" 2>/dev/null || break; sleep 1; done
    if kill -0 "$pid" 2>/dev/null; then
      echo "cluster.sh: the cluster did not stop within 3 minutes (PID $pid); see $dir/cluster.log" >&2
      exit 1
    fi
  fi
  rm -rf "$dir"
}

usage() { echo "usage: hack/cluster.sh up [--nodes 1|2|3] | down" >&2; }

case ${1:-} in
  up) shift; up "$@" ;;
  down) down ;;
  *)
    usage
    exit 2
    ;;
esac
