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
  [/usr/sbin/sshd]=openssh-server   # the simulated guest runs it for ssh_authorized_key; never the host's own
  [docker-registry]=docker-registry  # the OCI registry (distribution v2) image pulls are tested against
  [/usr/sbin/runc]=runc             # the OCI runtime of the containerd the passthrough tests run beside cocoon-cri
  [/bin/busybox]=busybox-static     # the one binary of those tests' container image
  [criu]=criu                       # make bench's checkpoint benchmark asks it whether CRIU checkpoints work here
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

# Installing a package must not start (or later boot) a daemon on this host. policy-rc.d exiting
# 101 forbids every service start while apt runs; one already in place is put back afterwards.
policy=/usr/sbin/policy-rc.d
saved_policy=""
if [ -e "$policy" ]; then
  saved_policy=$(mktemp)
  cp -p "$policy" "$saved_policy"
fi
restore_policy() {
  if [ -n "$saved_policy" ]; then mv -f "$saved_policy" "$policy"; else rm -f "$policy"; fi
}
trap restore_policy EXIT
printf '#!/bin/sh\n# hack/setup.sh: no service starts while packages are installed\nexit 101\n' >"$policy"
chmod 755 "$policy"

# A listener on port 22 (TCP, IPv4 or IPv6), read from /proc so no tool is needed.
listens_on_ssh_port() { grep -qE '^ *[0-9]+: [0-9A-F]+:0016 [0-9A-F]+:0000 0A' /proc/net/tcp /proc/net/tcp6 2>/dev/null; }
ssh_port_was_busy=false
listens_on_ssh_port && ssh_port_was_busy=true

export DEBIAN_FRONTEND=noninteractive
apt-get update -qq
apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null

if [[ " ${missing[*]} " == *" openssh-server "* ]]; then
  # Only the guests run sshd. Debian's init script and ssh.service both refuse to start it while
  # this file exists; what the package's postinst enabled is disabled again.
  touch /etc/ssh/sshd_not_to_be_run
  if command -v deb-systemd-helper >/dev/null 2>&1; then
    deb-systemd-helper disable ssh.service ssh.socket >/dev/null 2>&1 || true
  fi
  if [ -x /etc/init.d/ssh ]; then
    update-rc.d ssh disable >/dev/null 2>&1 || true
  fi
  if ! $ssh_port_was_busy && listens_on_ssh_port; then
    echo "setup: something now listens on this host's port 22; installing openssh-server must not start sshd" >&2
    exit 1
  fi
fi
