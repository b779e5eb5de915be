#!/usr/bin/env bash
# Builds and runs the engine benchmark (decode/prefill throughput vs. memory bandwidth).
# Writes the 110M synthetic model to /tmp on first use (~540 MB).
# Usage: scripts/bench.sh [bench_engine options, e.g. --no-synth --reps 5]
#        scripts/bench.sh --quant [bench_engine options]
#   --quant: first the per-type matrix-vector benchmark against ggml's kernels
#   (bench_matmul, one thread), then the engine benchmark with the Qwen2.5-0.5B-shaped
#   synthetics in f32, f16, q8_0 and q4_K_M (bench_engine --qwen; ~3.9 GB in /tmp).
#        scripts/bench.sh --batching [LEVELS]
#   --batching: the daemon's step loop under 1,4,8,16,32 concurrent sessions (LEVELS
#   overrides) with loadgen, on the 134M f32 synthetic (`kvp synth --ctx 1024`, written
#   to /tmp/kvp-synth-134M.gguf on first use, ~540 MB) and on stories260K: aggregate
#   tokens/s and TTFT p50/p99 with their ratios to one session; plots in
#   docs/batching-134M.svg and docs/batching-stories260K.svg.
# KVP_BUILD_DIR selects the build directory (default build).
set -euo pipefail
cd "$(dirname "$0")/.."
dir=${KVP_BUILD_DIR:-build}
[ -f $dir/build.ninja ] || meson setup $dir
ninja -C $dir bench/bench_engine bench/bench_matmul bench/loadgen tools/kvp daemon/kvpd
if [ "${1:-}" = --batching ]; then
    levels=${2:-1,4,8,16,32}
    synth=/tmp/kvp-synth-134M.gguf
    [ -f $synth ] || $dir/tools/kvp synth --out $synth --ctx 1024
    echo "load: $(uptime)"
    for model in 134M stories260K; do
        if [ $model = 134M ]; then args=(--model $synth); else
            args=(--model models/stories260K.bin --tokenizer models/tok512.bin); fi
        echo "### $model"
        $dir/bench/loadgen --kvpd $dir/daemon/kvpd "${args[@]}" --concurrency "$levels" \
            --turns 2 --max-tokens 32 --label "$model" --svg docs/batching-$model.svg
    done
    echo "load: $(uptime)"
    exit 0
fi
if [ "${1:-}" = --quant ]; then
    shift
    $dir/bench/bench_matmul --anchor ../shared/anchors/ggml-quantize-perf \
        --types q8_0,q4_0,q4_1,q5_0,q5_1,q4_K,q5_K,q6_K,f16,bf16
    exec $dir/bench/bench_engine --kvp $dir/tools/kvp --qwen "$@"
fi
exec $dir/bench/bench_engine --kvp $dir/tools/kvp "$@"
