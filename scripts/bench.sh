#!/usr/bin/env bash
# Builds and runs the engine benchmark (decode/prefill throughput vs. memory bandwidth).
# Writes the 110M synthetic model to /tmp on first use (~540 MB).
# Usage: scripts/bench.sh [bench_engine options, e.g. --no-synth --reps 5]
# KVP_BUILD_DIR selects the build directory (default build).
set -euo pipefail
cd "$(dirname "$0")/.."
dir=${KVP_BUILD_DIR:-build}
[ -f $dir/build.ninja ] || meson setup $dir
ninja -C $dir bench/bench_engine tools/kvp
exec $dir/bench/bench_engine --kvp $dir/tools/kvp "$@"
