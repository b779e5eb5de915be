#!/usr/bin/env bash
# Measures forked caches on stories260K (docs/evaluation.md "Forked caches"): for held-out
# sequences P | A | B of the TinyStories dev text (after the 80% split), the one-shot
# KL(full || fork) of a fork (the source P + A cut at |P|, then B) against KL(full ||
# scratch) of P + B prefilled from an empty cache, per policy and budget.
#   scripts/eval-fork.sh [kvp forkeval options...]
# Environment: BUILD (build dir, default build), POLICY (KVP policy file, default
# policy/weights/stories260K.kvp), SEQS (default 16): about 15 s on one core at 16.
set -euo pipefail
cd "$(dirname "$0")/.."
build=${BUILD:-build}
shared=${KVP_SHARED:-../shared}
policy=${POLICY:-policy/weights/stories260K.kvp}
seqs=${SEQS:-16}

[ -f "$build/build.ninja" ] || meson setup "$build"
ninja -C "$build" tools/kvp >&2
"$build/tools/kvp" forkeval --model "$shared/models/stories260K.bin" \
    --tokenizer "$shared/models/tok512.bin" \
    --text "$shared/datasets/tinystories/tinystories-dev.txt" --split 0.8 \
    --policy-file "$policy" --policies streaming,tova,h2o,snapkv,kvp --budgets 64,128 \
    --seqs "$seqs" "$@"
