#!/usr/bin/env bash
# Puts cocoon-cri where a node expects it (`make install`), or packs the same files into a release
# tarball (`make release`), so a node installed either way looks the same.
#
#   hack/install.sh install   # into $DESTDIR: $BINDIR, $SYSCONFDIR, $SYSTEMDUNITDIR, $DATADIR
#   hack/install.sh release   # $DIST/cocoon-cri-$VERSION-linux-$ARCH.tar.gz and its .sha256
#
# Both take the binary from $BIN/cocoon-cri, which `make build` writes.
set -euo pipefail
cd "$(dirname "$0")/.."

BIN=${BIN:-bin}

# install_files DESTDIR BINDIR SYSCONFDIR SYSTEMDUNITDIR DATADIR
install_files() {
	local destdir=$1 bindir=$2 sysconfdir=$3 unitdir=$4 datadir=$5
	local share=$datadir/cocoon-cri
	if [ ! -x "$BIN/cocoon-cri" ]; then
		echo "install: $BIN/cocoon-cri is missing: run make build" >&2
		return 1
	fi
	# Only the directories that are cocoon-cri's own get a mode, and only when they are made:
	# /etc or /usr/local/bin are the node's, and an operator may have narrowed /etc/cocoon-cri.
	mkdir -p "$destdir$bindir" "$destdir$unitdir"
	local d
	for d in "$destdir$sysconfdir/cocoon-cri" "$destdir$share"; do
		[ -d "$d" ] || install -d -m 0755 "$d"
	done

	# install(1) unlinks the old binary before writing, so a running cocoon-cri is not disturbed
	# (no "text file busy") and keeps running the old one until it is restarted.
	install -m 0755 "$BIN/cocoon-cri" "$destdir$bindir/cocoon-cri"

	# The unit names the binary and the configuration: keep it pointing where they went.
	local unit
	unit=$(mktemp)
	sed -e "s|/usr/local/bin/cocoon-cri|$bindir/cocoon-cri|g" \
		-e "s|/etc/cocoon-cri/|$sysconfdir/cocoon-cri/|g" deploy/cocoon-cri.service >"$unit"
	install -m 0644 "$unit" "$destdir$unitdir/cocoon-cri.service"
	rm -f "$unit"

	# The shipped defaults, replaced on every install: what to compare a kept configuration with
	# after an upgrade, and the manifests an operator applies from the node (there is no place
	# on a node where the kubelet reads a RuntimeClass or a kubelet configuration snippet).
	local f
	for f in config.yaml crictl.yaml kubelet-config.yaml runtimeclass.yaml; do
		install -m 0644 "deploy/$f" "$destdir$share/$f"
	done

	# The live configuration is the operator's once it exists: never overwritten, as packages
	# treat configuration files. A node that had its own /etc/crictl.yaml (pointing at
	# containerd) keeps it too.
	config_file deploy/config.yaml "$destdir" "$sysconfdir/cocoon-cri/config.yaml" "$share/config.yaml"
	config_file deploy/crictl.yaml "$destdir" "$sysconfdir/crictl.yaml" "$share/crictl.yaml"
}

# config_file SRC DESTDIR DEST DEFAULT: installs SRC as DEST unless DEST exists.
config_file() {
	local src=$1 destdir=$2 dest=$3 default=$4
	if [ -e "$destdir$dest" ] || [ -L "$destdir$dest" ]; then
		if ! cmp -s "$src" "$destdir$dest"; then
			echo "install: kept $dest; the new default is $default" >&2
		fi
		return 0
	fi
	install -m 0644 "$src" "$destdir$dest"
}

release() {
	: "${VERSION:?VERSION is unset (make release sets it from hack/version.sh)}"
	: "${ARCH:?ARCH is unset (make release sets it from go env GOARCH)}"
	local dist=${DIST:-$BIN/release}
	local name=cocoon-cri-$VERSION-linux-$ARCH.tar.gz
	# The commit's time rather than now, so the same commit packs to the same bytes
	# (SOURCE_DATE_EPOCH is the reproducible-builds convention for overriding it).
	local epoch=${SOURCE_DATE_EPOCH:-$(git log -1 --format=%ct 2>/dev/null || echo 0)}

	local stage
	stage=$(mktemp -d)
	# shellcheck disable=SC2064 # expand now: stage is local to this function
	trap "rm -rf '$stage'" EXIT
	# The fixed layout the unit file names, whatever PREFIX this make was given.
	install_files "$stage" /usr/local/bin /etc /etc/systemd/system /usr/local/share

	mkdir -p "$dist"
	# Regular files only, no directory entries: unpacking over / must not touch the mode, owner
	# or time of /etc or /usr/local. Sorted names, root ownership, a fixed time and the old GNU
	# format (no pax headers with access times) make the tar stream depend on the files alone;
	# gzip -n leaves out the name and time it would store.
	(cd "$stage" && find . -type f -printf '%P\n' | LC_ALL=C sort |
		tar --create --file=- --format=gnu --no-recursion --files-from=- \
			--owner=root:0 --group=root:0 --mtime="@$epoch") |
		gzip -n -9 >"$dist/$name.tmp"
	mv "$dist/$name.tmp" "$dist/$name"
	# The checksum names the file without a directory, as containerd's do: `sha256sum -c` it
	# beside the tarball.
	(cd "$dist" && sha256sum "$name" >"$name.sha256.tmp" && mv "$name.sha256.tmp" "$name.sha256")
	echo "$dist/$name"
}

case "${1:-}" in
install)
	PREFIX=${PREFIX:-/usr/local}
	install_files "${DESTDIR:-}" "${BINDIR:-$PREFIX/bin}" "${SYSCONFDIR:-/etc}" \
		"${SYSTEMDUNITDIR:-/etc/systemd/system}" "${DATADIR:-$PREFIX/share}"
	;;
release)
	release
	;;
*)
	echo "usage: $0 install|release" >&2
	exit 2
	;;
esac
