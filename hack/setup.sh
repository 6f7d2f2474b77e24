#!/usr/bin/env bash
# Installs the host packages the tests and the demo use, only when something is missing, so a
# repeat run costs a few milliseconds. Needs root (the tests create network namespaces anyway).
set -euo pipefail

# command -> Debian package that provides it
declare -A needs=(
  [qemu-img]=qemu-utils      # the simulator creates cloud-image overlays with it, as cocoon does
  [mkfs.ext4]=e2fsprogs      # the simulator formats OCI COW disks with it, as cocoon does
  [ip]=iproute2              # network namespaces in tests
  [nsenter]=util-linux       # runs the test node (cocoon-cri) inside its private network namespace
  [iptables]=iptables        # the portmap CNI plugin programs host ports with it
  [/usr/lib/cni/bridge]=containernetworking-plugins   # the reference CNI plugins: bridge, host-local, portmap, loopback
)

missing=()
for cmd in "${!needs[@]}"; do
  if [[ $cmd == /* ]]; then [ -x "$cmd" ] && continue; else command -v "$cmd" >/dev/null 2>&1 && continue; fi
  missing+=("${needs[$cmd]}")
done
[ ${#missing[@]} -eq 0 ] && exit 0

if [ "$(id -u)" -ne 0 ]; then
  echo "setup: missing packages ${missing[*]}; run as root (or install them) and retry" >&2
  exit 1
fi
echo "setup: installing ${missing[*]}"
export DEBIAN_FRONTEND=noninteractive
apt-get update -qq
apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
