#!/usr/bin/env bash
# Installs what the real-guest tests (test/realguest, test/cocoonsim/qemu) boot with, only when
# something is missing, so a repeat run costs a few milliseconds:
#   - qemu-system-x86_64 (TCG: this host cannot run nested KVM guests), and with it
#     /usr/lib/qemu/virtiofsd, which serves the virtio-fs shares of the simulator's and the
#     end-to-end tests (cocoon-cri's --virtiofsd default),
#   - a static busybox for the guest's initramfs,
#   - a Debian cloud kernel and its modules, unpacked under $REALGUEST_ROOT.
#
# The kernel is unpacked with dpkg-deb rather than installed: installing linux-image-* pulls in
# initramfs-tools (and with it udev and a systemd upgrade) and runs its boot hooks, none of which
# the guest needs. Unpacking touches nothing but $REALGUEST_ROOT; depmod then writes the
# modules.dep that test/realguest resolves module dependencies from. Keep the path in sync with
# realguest.KernelRoot.
set -euo pipefail

REALGUEST_ROOT=/var/cache/cocoon-cri/realguest
KERNEL_META=linux-image-cloud-amd64 # 27 MB to fetch, against 71 MB for linux-image-amd64

# command -> Debian package that provides it
declare -A needs=(
  [qemu-system-x86_64]=qemu-system-x86
  [depmod]=kmod # modules.dep for the unpacked kernel
)

missing=()
for cmd in "${!needs[@]}"; do
  command -v "$cmd" >/dev/null 2>&1 || missing+=("${needs[$cmd]}")
done
# Not on PATH: qemu-system-common's, a dependency of qemu-system-x86.
[ -x /usr/lib/qemu/virtiofsd ] || missing+=(qemu-system-common)
# busybox must be the static build: the initramfs has no libc. The dynamic "busybox" package
# also provides /bin/busybox, so ask dpkg rather than look for the file.
if [ "$(dpkg-query -W -f='${Status}' busybox-static 2>/dev/null)" != "install ok installed" ]; then
  missing+=(busybox-static)
fi
have_kernel() {
  local k
  for k in "$REALGUEST_ROOT"/boot/vmlinuz-*; do
    [ -f "$k" ] && [ -f "$REALGUEST_ROOT/lib/modules/${k##*/vmlinuz-}/modules.dep" ] && return 0
  done
  return 1
}
kernel_missing=0
have_kernel || kernel_missing=1

[ ${#missing[@]} -eq 0 ] && [ $kernel_missing -eq 0 ] && exit 0

if [ "$(id -u)" -ne 0 ]; then
  what=("${missing[@]}")
  [ $kernel_missing -eq 1 ] && what+=("$KERNEL_META (unpacked into $REALGUEST_ROOT)")
  echo "setup-realguest: missing ${what[*]}; run as root and retry" >&2
  exit 1
fi
export DEBIAN_FRONTEND=noninteractive
apt-get update -qq

if [ ${#missing[@]} -gt 0 ]; then
  echo "setup-realguest: installing ${missing[*]}"
  apt-get install -y -qq --no-install-recommends "${missing[@]}" </dev/null >/dev/null
fi

if [ $kernel_missing -eq 1 ]; then
  # The metapackage only depends on the versioned package that carries the files.
  pkg=$(apt-cache depends "$KERNEL_META" | awk '$1 == "Depends:" && $2 ~ /^linux-image-/ { print $2; exit }')
  if [ -z "$pkg" ]; then
    echo "setup-realguest: cannot resolve $KERNEL_META to a kernel package" >&2
    exit 1
  fi
  echo "setup-realguest: unpacking $pkg into $REALGUEST_ROOT"
  # Unpack next to the destination so the final mv is a rename on the same filesystem.
  mkdir -p "$(dirname "$REALGUEST_ROOT")"
  work=$(mktemp -d "$REALGUEST_ROOT.XXXXXX")
  trap 'rm -rf "$work"' EXIT
  # As root, apt cannot hand the download to its sandbox user in a private temp dir.
  (cd "$work" && apt-get download -qq -o APT::Sandbox::User=root "$pkg" </dev/null)
  dpkg-deb -x "$work"/"$pkg"_*.deb "$work/root"
  for k in "$work"/root/boot/vmlinuz-*; do
    depmod -b "$work/root" "${k##*/vmlinuz-}"
  done
  # Move the finished tree into place, so an interrupted run never leaves a half-unpacked one.
  rm -rf "$REALGUEST_ROOT"
  mv "$work/root" "$REALGUEST_ROOT"
fi
