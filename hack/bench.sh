#!/usr/bin/env bash
# make bench: runs the Go benchmarks and the end-to-end benchmarks (real containerd, critest
# -benchmark) and writes their figures, with the machine, the versions and the date, to
# docs/performance.md. Benchmarks measure; they never fail on a figure. Run it on an idle machine:
# figures taken while something else loads the cores are not comparable.
set -euo pipefail
cd "$(dirname "$0")/.."
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT

echo "bench: Go benchmarks"
go test -run '^$' -bench . -benchmem ./... | tee "$out/go.txt"

echo "bench: end-to-end benchmarks"
COCOON_CRI_BIN="$PWD/bin" COCOON_CRI_BENCH_DIR="$out" go test -count=1 -timeout 60m -run '^TestBenchmark' -v ./test/e2e/ | tee "$out/e2e.txt"

doc=docs/performance.md
# Before the doc is opened for writing: its truncation would mark the tree dirty.
version=$(./hack/version.sh)
{
  echo "# Performance"
  echo
  echo "Written by \`make bench\` (hack/bench.sh) on $(date -u +%Y-%m-%d): do not edit by hand."
  echo
  echo "- Machine: $(nproc) cores ($(sed -n 's/^model name[[:space:]]*: //p' /proc/cpuinfo | head -1)), $(awk '/MemTotal/ {printf "%.0f GiB", $2/1048576}' /proc/meminfo), $(. /etc/os-release && echo "$PRETTY_NAME"), kernel $(uname -r)"
  echo "- $(go version | cut -d' ' -f3-), cocoon-cri $version, cocoon: the simulator ($(bin/cocoon-sim version 2>/dev/null | head -1 || echo unknown))"
  echo "- containerd $(bin/containerd --version 2>/dev/null | awk '{print $3}'), runc $(runc --version 2>/dev/null | awk 'NR==1 {print $3}'), critest $(cat bin/.critest.version 2>/dev/null)"
  echo
  echo "What profiles of these figures found, and what was changed for them: [profiles.md](profiles.md)."
  echo
  for f in "$out"/*.md; do
    [ -e "$f" ] || continue
    cat "$f"
    echo
  done
  echo "## Go benchmarks"
  echo
  echo '```'
  grep -E '^(Benchmark|goos|goarch|cpu|pkg)' "$out/go.txt" || true
  echo '```'
} > "$doc"
echo "bench: wrote $doc"
