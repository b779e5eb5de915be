#!/usr/bin/env bash
# Reproduces policy/weights/stories260K.kvp (docs/training.md): traces stories260K over the
# TinyStories dev text, trains its 20 KVP agents (half the episodes shaped as streaming
# decisions, docs/training.md "Streaming decisions"), then fits their score calibration
# (kvp calibrate); then fine-tunes them for 400 steps with half the streaming decisions at
# budget 256 (docs/evaluation.md "Fine-tuning aimed at budget 256") and calibrates again.
# Same seed, same file.
#   scripts/train-stories260K.sh [OUT]      (default policy/weights/stories260K.kvp)
# Environment: BUILD (build dir, default build), THREADS (default 2), TRACES (trace dir,
# default /tmp/kvp-traces-stories260K-all: every 512-token sequence of the text, trace
# format version 2; kept between runs, rebuilt when missing), CURVE (training-curve CSV,
# default /tmp/stories260K-curve.csv).
set -euo pipefail
cd "$(dirname "$0")/.."
build=${BUILD:-build}
shared=${KVP_SHARED:-../shared}
traces=${TRACES:-/tmp/kvp-traces-stories260K-all}
out=${1:-policy/weights/stories260K.kvp}
threads=${THREADS:-2}
curve=${CURVE:-/tmp/stories260K-curve.csv}
model=$shared/models/stories260K.bin
tok=$shared/models/tok512.bin

[ -f "$build/build.ninja" ] || meson setup "$build"
ninja -C "$build" tools/kvp
kvp=$build/tools/kvp

start=$(date +%s)
# --max-seqs 600 is more than the text holds, so every whole sequence is traced: 415
# training sequences from the first 80% and 107 validation ones from the rest (with 300,
# 240 + 60, streaming KL was 1.4-3.7x higher at budgets 32-128; docs/evaluation.md)
if [ ! -f "$traces/trace.kvpt" ]; then
    "$kvp" trace --model "$model" --tokenizer "$tok" \
        --text "$shared/datasets/tinystories/tinystories-dev.txt" --out "$traces" \
        --seq-len 512 --max-seqs 600 --split 0.8
fi
init=$(mktemp /tmp/kvp-init-XXXXXX.kvp)
base=$(mktemp /tmp/kvp-base-XXXXXX.kvp)
trap 'rm -f "$init" "$base"' EXIT
"$kvp" policy-init --model "$model" --tokenizer "$tok" --out "$init" --seed 1 \
    --width 32 --hidden 32 --pos-dim 4 --pos-max 512
"$kvp" train --traces "$traces" --init "$init" --out "$out" --curve "$curve" \
    --seed 1 --threads "$threads" --steps 3000 --lr 3e-3 --episodes 16 --samples 8 \
    --stream-share 0.5
# the per-head calibration global budgets rank by (docs/policy-format.md, version 3)
"$kvp" calibrate --traces "$traces" --policy-file "$out" --out "$base" --threads "$threads"
# fine-tuning from the calibrated agents: a lower learning rate, a new seed, and the
# streaming decisions drawn at budget 256 half the time (the budget whose one-shot choice of
# older rows the agents made worst)
"$kvp" train --traces "$traces" --init "$base" --out "$out" --curve "$curve.finetune" \
    --seed 2 --threads "$threads" --steps 400 --lr 1e-3 --warmup 20 --episodes 16 --samples 8 \
    --stream-share 0.5 --stream-budgets 32,64,128,256,256,256
"$kvp" calibrate --traces "$traces" --policy-file "$out" --out "$out" --threads "$threads"
# per-layer caps by one-shot KL (docs/training.md "Per-layer caps"): 128 of the 415
# training sequences, spread over the whole training text (with 64, layer 0 takes the same
# cap of 12 and at budget 64 as well, for a 1.6% gain there that 128 sequences do not show)
"$kvp" fit-window --model "$model" --tokenizer "$tok" --traces "$traces" --policy-file "$out" \
    --out "$out" --seqs 128 --threads "$threads"
echo "train-stories260K: $out ($(stat -c %s "$out") bytes) in $(( $(date +%s) - start )) s" >&2
