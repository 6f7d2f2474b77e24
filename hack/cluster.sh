#!/usr/bin/env bash
# hack/cluster.sh up|down: a one-node Kubernetes on this machine, to try cocoon-cri with kubectl.
#
# up builds what it needs (make setup build tools; the first time takes a while) and starts, in
# private network namespaces with every file under one directory: cocoon-cri on the cocoon
# simulator with containerd beside it through passthrough, a CNI bridge, etcd, kube-apiserver,
# kube-controller-manager, kube-scheduler and the kubelet (node cocoon-node). It applies
# deploy/runtimeclass.yaml, imports two VM images (cocoon.local/agent-sandbox:v1, a busybox guest
# serving HTTP on port 80; cocoon.local/crashing:v1, whose VM crashes 10 s after it starts) and
# prints the environment for kubectl and crictl. down stops everything and removes it.
#
# One cluster at a time: it links the node's namespace to the host with 10.89.255.1/30, where
# kubectl reaches the API server. COCOON_CLUSTER_DIR is where it lives (/tmp/cocoon-cluster).
set -euo pipefail
cd "$(dirname "$0")/.."
dir=${COCOON_CLUSTER_DIR:-/tmp/cocoon-cluster}
bin=${COCOON_CRI_BIN:-$PWD/bin}
export COCOON_CRI_BIN=$bin

running() { [ -f "$dir/pid" ] && kill -0 "$(cat "$dir/pid")" 2>/dev/null; }

up() {
  if running; then
    echo "cluster.sh: a cluster is up already in $dir: hack/cluster.sh down first" >&2
    exit 1
  fi
  rm -rf "$dir"
  mkdir -p "$dir"
  # COCOON_CLUSTER_SERVER: an end-to-end test binary already built (the tests pass their own).
  server=${COCOON_CLUSTER_SERVER:-}
  if [ -z "$server" ]; then
    make -s setup build tools
    go test -c -o "$dir/e2e.test" ./test/e2e
    server=$dir/e2e.test
  fi
  # The cluster is the end-to-end tests' node and control plane, served until SIGTERM; a session
  # of its own, so the terminal's ^C does not reach it.
  COCOON_CLUSTER_SERVE_DIR=$dir setsid "$server" -test.run '^TestServeCluster$' -test.v -test.timeout 0 \
    </dev/null >"$dir/cluster.log" 2>&1 &
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
# kubectl is $bin/kubectl. A VM pod:
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

case ${1:-} in
  up) up ;;
  down) down ;;
  *)
    echo "usage: hack/cluster.sh up|down" >&2
    exit 2
    ;;
esac
