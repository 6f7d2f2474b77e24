#!/usr/bin/env bash
# Builds the pinned test clients (crictl, critest) from test/tools into bin/.
# A stamp per binary records the version it was built from, so a repeat run is a no-op.
set -euo pipefail
cd "$(dirname "$0")/.."
bin="$PWD/bin"
mkdir -p "$bin"

version=$(cd test/tools && go list -m -f '{{.Version}}' sigs.k8s.io/cri-tools)
version=${version#v}
[ -n "$version" ] || { echo "build-tools: cri-tools is not pinned in test/tools/go.mod" >&2; exit 1; }
ldflags="-X sigs.k8s.io/cri-tools/pkg/version.Version=$version"

current() { [ -x "$bin/$1" ] && [ "$(cat "$bin/.$1.version" 2>/dev/null)" = "$version" ]; }

cd test/tools
if ! current crictl; then
  echo "build-tools: building crictl $version (a few minutes on a cold module cache)"
  go build -trimpath -ldflags "$ldflags" -o "$bin/crictl" sigs.k8s.io/cri-tools/cmd/crictl
  echo "$version" > "$bin/.crictl.version"
fi
if ! current critest; then
  echo "build-tools: building critest $version"
  go test -c -trimpath -ldflags "$ldflags" -o "$bin/critest" sigs.k8s.io/cri-tools/cmd/critest
  echo "$version" > "$bin/.critest.version"
fi
