#!/bin/sh
# hack/version.sh prints the version cocoon-cri is built as: the tag git describe finds (v1.2.0,
# or v1.2.0-3-gabc1234 past it); on a commit no tag reaches, 0.1.0-dev+<commit>; -dirty with
# uncommitted changes; 0.1.0-dev outside a git checkout. Each is a semantic version: the kubelet
# shows the node's runtime as cocoon-cri://<version> only when it parses (Unknown otherwise).
cd "$(dirname "$0")/.." || exit 1
if v=$(git describe --tags --dirty 2>/dev/null); then
  echo "$v"
elif c=$(git describe --always --dirty 2>/dev/null); then
  echo "0.1.0-dev+$c"
else
  echo 0.1.0-dev
fi
