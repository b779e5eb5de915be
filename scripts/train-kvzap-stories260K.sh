#!/usr/bin/env bash
# Trains policy/weights/stories260K-kvzap.kvp, a KVzap surrogate for stories260K
# (docs/evaluation.md "KVzap"): traces the TinyStories dev text with KVzip's scores as the
# targets (kvp trace --targets kvzip: each cut's prefix scored by a context-reconstruction
# pass), then trains KVP agents of the shipped policy's shape on them (kvp train, the
# same losses: the ranking cost against the targets and the listwise term toward their
# shares), and fits their score calibration. The agents then predict KVzip's scores from
# each row's key, value and position, live, as the kvp policy with this file. Same seed,
# same file.
#   scripts/train-kvzap-stories260K.sh [OUT]   (default policy/weights/stories260K-kvzap.kvp)
# Environment: BUILD (build dir, default build), THREADS (default 2), TRACES (trace dir,
# default /tmp/kvp-traces-stories260K-kvzip; kept between runs, rebuilt when missing),
# SEQS (sequences traced, default 100: 80 training + 20 validation), STEPS (default 400),
# CURVE (training-curve CSV, default /tmp/stories260K-kvzap-curve.csv).
set -euo pipefail
cd "$(dirname "$0")/.."
build=${BUILD:-build}
shared=${KVP_SHARED:-../shared}
traces=${TRACES:-/tmp/kvp-traces-stories260K-kvzip}
out=${1:-policy/weights/stories260K-kvzap.kvp}
threads=${THREADS:-2}
seqs=${SEQS:-100}
steps=${STEPS:-400}
model=$shared/models/stories260K.bin
tok=$shared/models/tok512.bin

[ -f "$build/build.ninja" ] || meson setup "$build"
ninja -C "$build" tools/kvp
kvp=$build/tools/kvp

start=$(date +%s)
# KVzip's pass reruns each cut's prefix, so the grid is coarser than the default one:
# cuts 64, 128, ..., 448 (384, the validation cut, among them)
if [ ! -f "$traces/trace.kvpt" ]; then
    OPENBLAS_NUM_THREADS=1 "$kvp" trace --model "$model" --tokenizer "$tok" \
        --text "$shared/datasets/tinystories/tinystories-dev.txt" --out "$traces" \
        --seq-len 512 --max-seqs "$seqs" --split 0.8 --cut-min 64 --cut-stride 64 \
        --cut-tail 32 --targets kvzip
fi
init=$(mktemp /tmp/kvp-kvzap-init-XXXXXX.kvp)
trap 'rm -f "$init"' EXIT
"$kvp" policy-init --model "$model" --tokenizer "$tok" --out "$init" --seed 1 \
    --width 32 --hidden 32 --pos-dim 4 --pos-max 512
"$kvp" train --traces "$traces" --init "$init" --out "$out" --curve "${CURVE:-/tmp/stories260K-kvzap-curve.csv}" \
    --seed 1 --threads "$threads" --steps "$steps" --lr 3e-3 --episodes 16 --samples 8 \
    --eval-every 50
# the per-head calibration global budgets rank by, fitted to the KVzip targets
"$kvp" calibrate --traces "$traces" --policy-file "$out" --out "$out" --threads "$threads"
echo "train-kvzap-stories260K: $out ($(stat -c %s "$out") bytes) in $(( $(date +%s) - start )) s" >&2
