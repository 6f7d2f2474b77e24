#!/usr/bin/env bash
# cocoon converts OCI VM image layers with `mkfs.erofs --tar`, and cocoon v0.5 needs erofs-utils
# 1.8 or newer; Debian 12's is 1.5. This builds mkfs.erofs from Debian's own erofs-utils 1.8.6
# source (checked by SHA-256) into /usr/local/sbin, which comes before /usr/bin on PATH. It does
# nothing when the mkfs.erofs on PATH is 1.8 or newer, so a repeat run costs a few milliseconds.
# Needs root.
set -euo pipefail

minimum=1.8
found=$(mkfs.erofs -V 2>/dev/null | sed -n '1s/.*(erofs-utils) *//p' || true)
if [ -n "$found" ] && dpkg --compare-versions "$found" ge "$minimum"; then
  exit 0
fi
if [ "$(id -u)" -ne 0 ]; then
  echo "setup-erofs: mkfs.erofs ${found:-missing} is older than $minimum; run as root to build erofs-utils 1.8.6" >&2
  exit 1
fi

version=1.8.6
sha256=5b221dc3fd6d151425b30534ede46fb7a90dc233a8659cba0372796b0a066547
url="http://deb.debian.org/debian/pool/main/e/erofs-utils/erofs-utils_${version}.orig.tar.gz"

build_deps=(autoconf automake libtool pkg-config make gcc liblz4-dev uuid-dev curl ca-certificates)
missing=()
for pkg in "${build_deps[@]}"; do
  [ "$(dpkg-query -W -f='${Status}' "$pkg" 2>/dev/null)" = "install ok installed" ] || missing+=("$pkg")
done
if [ ${#missing[@]} -gt 0 ]; then
  echo "setup-erofs: installing ${missing[*]}"
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq
  apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
fi

work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
echo "setup-erofs: building mkfs.erofs ${version}"
curl -fsSL --retry 3 -o "$work/src.tar.gz" "$url"
echo "${sha256}  $work/src.tar.gz" | sha256sum -c --quiet -
tar -xzf "$work/src.tar.gz" -C "$work"
cd "$work/erofs-utils-${version}"
{
  ./autogen.sh
  ./configure --disable-fuse --without-selinux --with-lz4 --without-libdeflate --without-libzstd \
    --without-xxhash --disable-multithreading
  make -j"$(nproc)" -C lib
  make -j"$(nproc)" -C mkfs
} >"$work/build.log" 2>&1 || { tail -30 "$work/build.log" >&2; exit 1; }
install -m 0755 mkfs/mkfs.erofs /usr/local/sbin/mkfs.erofs
mkfs.erofs --help 2>&1 | grep -q -- '--tar' || { echo "setup-erofs: the new mkfs.erofs has no --tar" >&2; exit 1; }
echo "setup-erofs: installed /usr/local/sbin/mkfs.erofs ${version}"
