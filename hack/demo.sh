#!/usr/bin/env bash
# make demo: start cocoon-cri on the cocoon simulator and run a VM pod through crictl.
# Everything lives in a temporary directory and is stopped and removed at the end, unless
# DEMO_KEEP=1 keeps it running for you to try crictl yourself.
set -euo pipefail
cd "$(dirname "$0")/.."
# DEMO_BIN: where cocoon-cri, cocoon-sim, mktestimage and crictl are (the tests point it at theirs).
bin=${DEMO_BIN:-$PWD/bin}
work=$(mktemp -d /tmp/cocoon-cri-demo.XXXX)
sock=$work/cocoon-cri.sock
cocoon_root=$work/cocoon/root cocoon_run=$work/cocoon/run cocoon_log=$work/cocoon/log
node_ns=$work/node.netns
daemon_pid=
# The simulated VMs' own namespaces (cocoon-<VMID>) stay in the work directory.
export COCOON_SIM_NETNS_DIR=$work/vmnetns

crictl() { "$bin/crictl" --runtime-endpoint "unix://$sock" --image-endpoint "unix://$sock" --timeout 60s "$@"; }
cocoon() { "$bin/cocoon-sim" --root-dir "$cocoon_root" --run-dir "$cocoon_run" --log-dir "$cocoon_log" "$@"; }
on_node() { nsenter --net="$node_ns" -- "$@"; }
step() { printf '\n\033[1m==> %s\033[0m\n' "$*"; }
export CRI_CONFIG_FILE=/dev/null # crictl: no /etc/crictl.yaml needed

teardown() {
  status=$?
  if [ "${DEMO_KEEP:-}" = 1 ] && [ $status -eq 0 ]; then
    return
  fi
  if [ -n "$daemon_pid" ] && kill -0 "$daemon_pid" 2>/dev/null; then
    for pod in $(crictl pods -q 2>/dev/null); do crictl rmp --force "$pod" >/dev/null 2>&1 || true; done
    kill -TERM "$daemon_pid" && wait "$daemon_pid" 2>/dev/null || true
  fi
  # Whatever a failure left: VMs (the simulator's hypervisor processes) and namespaces.
  for vm in $(cocoon vm list -o json 2>/dev/null | grep -o '"id": *"[A-Z0-9]*"' | grep -o '[A-Z0-9]\{26\}'); do
    on_node "$bin/cocoon-sim" --root-dir "$cocoon_root" --run-dir "$cocoon_run" --log-dir "$cocoon_log" vm rm --force "$vm" >/dev/null 2>&1 || true
  done
  for ns in "$work"/netns/* "$work"/vmnetns/* "$node_ns"; do [ -e "$ns" ] && umount -l "$ns" 2>/dev/null; done
  rm -rf "$work"
  [ $status -eq 0 ] || echo "demo failed (exit $status)" >&2
}
trap teardown EXIT

step "Building a VM snapshot image: a cocoon snapshot archive, as 'cocoon snapshot export' writes it"
"$bin/mktestimage" snapshot --name demo --cpu 1 --memory 512M --storage 20G --root-dir "$cocoon_root" --install-base -o "$work/demo-snapshot.tar"
ls -l "$work/demo-snapshot.tar"

step "A node of its own: a private network namespace with a CNI bridge network (Debian's reference plugins)"
touch "$node_ns" && unshare --net="$node_ns" true && on_node ip link set lo up
mkdir -p "$work/net.d"
cat >"$work/net.d/10-pods.conflist" <<JSON
{"cniVersion": "1.0.0", "name": "pods", "plugins": [
  {"type": "bridge", "bridge": "cni0", "isGateway": true,
   "ipam": {"type": "host-local", "ranges": [[{"subnet": "10.88.0.0/24"}]], "routes": [{"dst": "0.0.0.0/0"}], "dataDir": "$work/ipam"}},
  {"type": "portmap", "capabilities": {"portMappings": true}}]}
JSON
cat "$work/net.d/10-pods.conflist"

step "Starting cocoon-cri on the cocoon simulator, in the node's namespace (log: $work/cocoon-cri.log)"
# nsenter execs cocoon-cri, so $! is the daemon's PID.
nsenter --net="$node_ns" -- "$bin/cocoon-cri" --socket "$sock" --state-dir "$work/state" --cocoon-binary "$bin/cocoon-sim" \
  --cocoon-root-dir "$cocoon_root" --cocoon-run-dir "$cocoon_run" --cocoon-log-dir "$cocoon_log" \
  --netns-dir "$work/netns" --cni-conf-dir "$work/net.d" --cni-bin-dir /usr/lib/cni >"$work/cocoon-cri.log" 2>&1 &
daemon_pid=$!
for _ in $(seq 100); do crictl version >/dev/null 2>&1 && break; sleep 0.1; done
crictl version
crictl info -o go-template --template '{{range .status.conditions}}{{.type}}={{.status}} {{end}}{{"\n"}}'

step "Importing the snapshot as the CRI image demo/agent-sandbox:v1"
"$bin/cocoon-cri" image import --socket "$sock" --ref demo/agent-sandbox:v1 "$work/demo-snapshot.tar"
crictl images

step "Running a VM pod: RunPodSandbox, CreateContainer, StartContainer"
cat >"$work/pod.json" <<JSON
{"metadata": {"name": "agent", "namespace": "default", "uid": "demo-uid-1"},
 "hostname": "agent", "log_directory": "$work/pods/agent",
 "labels": {"app": "agent"},
 "annotations": {"cocoonset.cocoonstack.io/storage": "20Gi"}}
JSON
cat >"$work/container.json" <<JSON
{"metadata": {"name": "sandbox"}, "image": {"image": "demo/agent-sandbox:v1"}, "log_path": "sandbox.log",
 "linux": {"resources": {"cpu_period": 100000, "cpu_quota": 100000, "memory_limit_in_bytes": 1073741824}}}
JSON
pod=$(crictl runp --runtime cocoon "$work/pod.json")
echo "sandbox:   $pod"
ctr=$(crictl create --no-pull "$pod" "$work/container.json" "$work/pod.json")
echo "container: $ctr"
crictl start "$ctr" >/dev/null

step "The pod, as the kubelet sees it"
crictl pods
crictl ps
crictl inspectp -o go-template --template 'pod IP {{.status.network.ip}}, pod interface MAC {{.info.network.mac}}{{"\n"}}' "$pod"
crictl inspect -o go-template --template \
  'state {{.status.state}}, VM {{.info.vm.name}} (cocoon ID {{.info.vm.id}}), {{.info.vm.mode}} of {{.info.vm.source}}{{"\n"}}vCPUs {{.info.vm.cpu}}, memory {{.info.vm.memory}} bytes, disk {{.info.vm.storage}} bytes, hypervisor PID {{.info.vm.pid}}{{"\n"}}' "$ctr"

step "The VM, as cocoon sees it"
cocoon vm list
vm_pid=$(crictl inspect -o go-template --template '{{.info.vm.pid}}' "$ctr")
ps -o pid,etime,args -p "$vm_pid" | cut -c1-150

step "Inside the guest: crictl exec (through cocoon vm exec), the VM's console as the container log, stats"
# Exec streams are served on the node's loopback, so crictl exec runs in the node's namespace.
on_node "$bin/crictl" --runtime-endpoint "unix://$sock" --timeout 60s exec "$ctr" \
  sh -c 'echo "guest hostname: $(hostname), address: $(ip -4 -o addr show scope global | awk "{print \$4}")"'
crictl logs --tail 2 "$ctr"
crictl stats "$ctr" | sed "s/\x1b\[2J\x1b\[H//"  # crictl clears the screen first

step "Its state moves: the guest writes to its memory, the pod is checkpointed and restored as a new pod"
on_node "$bin/crictl" --runtime-endpoint "unix://$sock" --timeout 60s exec "$ctr" sh -c 'echo "in memory since $(date -u +%T)" >/dev/shm/note'
"$bin/cocoon-cri" pod checkpoint --socket "$sock" default/agent "$work/checkpoint"  # CheckpointPod
ls "$work/checkpoint"
sed 's/"agent"/"agent-restored"/g; s/demo-uid-1/demo-uid-3/' "$work/pod.json" >"$work/pod3.json"
restored=$("$bin/cocoon-cri" pod restore --socket "$sock" --start "$work/checkpoint" "$work/pod3.json")  # RestorePod, StartContainer
pod3=$(echo "$restored" | head -1)
ctr3=$(echo "$restored" | awk '$1 == "sandbox" {print $2}')
on_node "$bin/crictl" --runtime-endpoint "unix://$sock" --timeout 60s exec "$ctr3" \
  sh -c 'echo "restored pod $(hostname), address $(ip -4 -o addr show scope global | awk "{print \$4}"): $(cat /dev/shm/note)"'

step "A second pod, booted from a cloud image: its guest answers at the pod IP, from the node"
# A clone keeps its snapshot's guest network configuration until reconfigured (docs/networking.md);
# a booted VM takes the pod address from cocoon at boot.
"$bin/mktestimage" qcow2 --size 1G -o "$work/desktop.qcow2"
mkdir -p "$cocoon_root/firmware" && echo firmware >"$cocoon_root/firmware/CLOUDHV.fd" # UEFI firmware on the node
"$bin/cocoon-cri" image import --socket "$sock" --ref demo/desktop:v1 "$work/desktop.qcow2" >/dev/null
sed 's/"agent"/"desktop"/g; s/demo-uid-1/demo-uid-2/' "$work/pod.json" >"$work/pod2.json"
sed 's#demo/agent-sandbox:v1#demo/desktop:v1#' "$work/container.json" >"$work/container2.json"
pod2=$(crictl runp --runtime cocoon "$work/pod2.json")
ctr2=$(crictl create --no-pull "$pod2" "$work/container2.json" "$work/pod2.json")
crictl start "$ctr2" >/dev/null
ip2=$(crictl inspectp -o go-template --template '{{.status.network.ip}}' "$pod2")
echo "node \$ busybox nc $ip2 8080"
for _ in $(seq 50); do answer=$(on_node busybox nc -w 2 "$ip2" 8080 2>/dev/null) && [ -n "$answer" ] && break; sleep 0.2; done
echo "guest: ${answer:-no answer}"
[ -n "${answer:-}" ]

if [ "${DEMO_KEEP:-}" = 1 ]; then
  step "Kept running (DEMO_KEEP=1)"
  cat <<TXT
crictl:   $bin/crictl --runtime-endpoint unix://$sock --image-endpoint unix://$sock ps
cocoon:   $bin/cocoon-sim --root-dir $cocoon_root --run-dir $cocoon_run --log-dir $cocoon_log vm list
log:      $work/cocoon-cri.log
node:     nsenter --net=$node_ns busybox nc $ip2 8080
To stop:  $bin/crictl --runtime-endpoint unix://$sock rmp --force $pod $pod2 $pod3; kill $daemon_pid;
          umount $node_ns; rm -rf $work
TXT
  exit 0
fi

step "Stopping and removing: StopContainer, RemoveContainer, StopPodSandbox, RemovePodSandbox"
crictl stop --timeout 10 "$ctr" >/dev/null
crictl inspect -o go-template --template 'state {{.status.state}}, exit code {{.status.exitCode}}, reason {{.status.reason}}{{"\n"}}' "$ctr"
crictl rm "$ctr" >/dev/null
crictl stopp "$pod" >/dev/null
crictl rmp "$pod" >/dev/null
crictl rmp --force "$pod2" "$pod3" >/dev/null
crictl pods
cocoon vm list
echo
echo "demo done: a VM pod ran on cocoon-cri and left nothing behind"
