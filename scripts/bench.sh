#!/usr/bin/env bash
# Builds and runs the engine benchmark (decode/prefill throughput vs. memory bandwidth).
# Writes the 110M synthetic model to /tmp on first use (~540 MB).
# Usage: scripts/bench.sh [bench_engine options, e.g. --no-synth --reps 5]
#        scripts/bench.sh --quant [bench_engine options]
#   --quant: first the per-type matrix-vector benchmark against ggml's kernels
#   (bench_matmul, one thread), then the engine benchmark with the Qwen2.5-0.5B-shaped
#   synthetics in f32, f16, q8_0 and q4_K_M (bench_engine --qwen; ~3.9 GB in /tmp).
# KVP_BUILD_DIR selects the build directory (default build).
set -euo pipefail
cd "$(dirname "$0")/.."
dir=${KVP_BUILD_DIR:-build}
[ -f $dir/build.ninja ] || meson setup $dir
ninja -C $dir bench/bench_engine bench/bench_matmul tools/kvp
if [ "${1:-}" = --quant ]; then
    shift
    $dir/bench/bench_matmul --anchor ../shared/anchors/ggml-quantize-perf \
        --types q8_0,q4_0,q4_1,q5_0,q5_1,q4_K,q5_K,q6_K,f16,bf16
    exec $dir/bench/bench_engine --kvp $dir/tools/kvp --qwen "$@"
fi
exec $dir/bench/bench_engine --kvp $dir/tools/kvp "$@"
