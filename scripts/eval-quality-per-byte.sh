#!/usr/bin/env bash
# Quality per byte on stories260K: one-shot and streaming KL against the bytes
# a session's cache holds, for KVP with f32, f16 or q8_0 rows and per-head or global budgets,
# and for the best baselines (TOVA, SnapKV, StreamingLLM) with f32 rows, per head.
#   scripts/eval-quality-per-byte.sh [OUT]     (default docs/quality-per-byte)
# Runs `kvp eval` once per configuration into OUT/<kv_type>-<budget_mode>/ and writes
# OUT/table.md (every row with its bytes) and OUT/kl-per-byte.csv (series,bytes,kl), which
# `kvp plot` turns into OUT/oneshot-kl.svg and OUT/streaming-kl.svg.
# Environment: BUILD (default build), THREADS (default 2), POLICY (default
# policy/weights/stories260K.kvp; global budgets need its calibration: kvp calibrate),
# SEQS (default 32), STREAMS (default 4).
set -euo pipefail
cd "$(dirname "$0")/.."
build=${BUILD:-build}
shared=${KVP_SHARED:-../shared}
out=${1:-docs/quality-per-byte}
threads=${THREADS:-2}
policy=${POLICY:-policy/weights/stories260K.kvp}
seqs=${SEQS:-32}
streams=${STREAMS:-4}
budgets=16,32,64,128,256   # 256: kvpd's default budget

[ -f "$build/build.ninja" ] || meson setup "$build"
ninja -C "$build" tools/kvp
kvp=$build/tools/kvp
mkdir -p "$out"

run() {   # kv_type budget_mode policies
    "$kvp" eval --model "$shared/models/stories260K.bin" --tokenizer "$shared/models/tok512.bin" \
        --text "$shared/datasets/tinystories/tinystories-dev.txt" --split 0.8 \
        --policy-file "$policy" --budgets $budgets --seqs "$seqs" --streams "$streams" \
        --threads "$threads" --kv-type "$1" --budget-mode "$2" --policies "$3" --out "$out/$1-$2"
}
run f32 per_head kvp,tova,snapkv,streaming
run f16 per_head kvp
run q8_0 per_head kvp
run f32 global kvp
run f16 global kvp
run q8_0 global kvp

# bytes per session at budget B: B x (bytes per row and head x heads), as results.md says
csv=$out/kl-per-byte.csv
echo "protocol,series,budget,bytes,kl" > "$csv"
for dir in "$out"/*-*/; do
    config=$(basename "$dir")
    per=$(grep -o 'holds B x [0-9]* bytes per session' "$dir/results.md" | grep -o '[0-9]*')
    awk -F, -v per="$per" -v config="$config" '
        $4 == "kl" && ($1 == "oneshot" || $1 == "streaming") && $3 != "all" {
            printf "%s,%s %s,%d,%d,%s\n", $1, $2, config, $3, $3 * per, $5 }' \
        "$dir/results.csv" >> "$csv"
done
for protocol in oneshot streaming; do
    "$kvp" plot --csv "$csv" --protocol "$protocol" --out "$out/$protocol-kl.svg" \
        --title "stories260K: $protocol KL against cache bytes per session" \
        --xlabel "cache bytes per session (log2 scale)" --ylabel "KL(full || policy), nats"
done
{
    echo "| protocol | series | budget | bytes per session | KL (nats) |"
    echo "|---|---|---:|---:|---:|"
    tail -n +2 "$csv" | sort -t, -k1,1 -k4,4n | awk -F, '{ printf "| %s | %s | %s | %s | %.5f |\n", $1, $2, $3, $4, $5 }'
} > "$out/table.md"
echo "eval-quality-per-byte: $out/table.md, $out/*.svg" >&2
