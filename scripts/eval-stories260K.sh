#!/usr/bin/env bash
# Evaluates every eviction policy on stories260K over the held-out part of the TinyStories
# dev text (the 20% after the split scripts/train-stories260K.sh trains before), at budgets
# 16..256, with the three protocols of docs/evaluation.md; then zero-shot on text of another
# kind: the OpenAssistant conversations of ../shared/datasets/oasst/oasst_en100_longest_threads.jsonl
# rendered as plain text ("User: ..." / "Assistant: ..." lines, a blank line between
# conversations), all of it held out (the model and the agents never saw it).
#   scripts/eval-stories260K.sh [OUT]     (default docs/eval-stories260K)
# Writes OUT/results.csv, OUT/results.md and OUT/*.svg, and the same for the zero-shot text
# in OUT/oasst/; then the conversation protocol (kvp eval --dialogs, with and without
# per-turn protection) on both texts, in OUT/conversation/ and OUT/oasst/conversation/.
# ONLY=conversation runs the conversation protocol alone.
# Environment: BUILD (build dir, default build), THREADS (default 2), POLICY (KVP policy
# file, default policy/weights/stories260K.kvp; when it is missing a random policy from
# `kvp policy-init` stands in, which only checks the plumbing), KVZAP (the KVzap
# surrogate, default policy/weights/stories260K-kvzap.kvp from
# scripts/train-kvzap-stories260K.sh; kvzap is left out when it is missing), SEQS
# (default 64), STREAMS (default 8) and DIALOGS (conversations, default 32): about 10
# minutes on 2 quiet cores for the three protocols (kvzip's reconstruction passes are
# about half of it), and about as long again for the conversations.
set -euo pipefail
cd "$(dirname "$0")/.."
build=${BUILD:-build}
shared=${KVP_SHARED:-../shared}
out=${1:-docs/eval-stories260K}
threads=${THREADS:-2}
policy=${POLICY:-policy/weights/stories260K.kvp}
kvzap=${KVZAP:-policy/weights/stories260K-kvzap.kvp}
seqs=${SEQS:-64}
streams=${STREAMS:-8}
dialogs=${DIALOGS:-32}
only=${ONLY:-}
model=$shared/models/stories260K.bin
tok=$shared/models/tok512.bin

[ -f "$build/build.ninja" ] || meson setup "$build"
ninja -C "$build" tools/kvp
kvp=$build/tools/kvp

oasst=$(mktemp /tmp/kvp-oasst-XXXXXX.txt)
random_policy=
trap 'rm -f "$oasst" ${random_policy:+"$random_policy"}' EXIT
if [ ! -f "$policy" ]; then
    echo "eval-stories260K: $policy not found; evaluating a RANDOM kvp policy instead" >&2
    policy=$(mktemp /tmp/kvp-random-XXXXXX.kvp)
    random_policy=$policy
    "$kvp" policy-init --model "$model" --tokenizer "$tok" --out "$policy" --seed 1
fi
kvzap_file=()
if [ -f "$kvzap" ]; then
    kvzap_file=(--kvzap-file "$kvzap")
else
    echo "eval-stories260K: $kvzap not found; kvzap is left out" >&2
fi
conv() {   # the conversation protocol on text $1 (split $2) into $3
    local start=$(date +%s)
    mkdir -p "$3"
    "$kvp" eval --model "$model" --tokenizer "$tok" --text "$1" --split "$2" \
        --dialogs "$dialogs" --protect-turns --policy-file "$policy" "${kvzap_file[@]}" \
        --budgets 16,32,64,128,256 --threads "$threads" --out "$3"
    echo "eval-stories260K: $3/results.md in $(( $(date +%s) - start )) s" >&2
}
if [ "$only" != conversation ]; then
start=$(date +%s)
"$kvp" eval --model "$model" --tokenizer "$tok" \
    --text "$shared/datasets/tinystories/tinystories-dev.txt" --split 0.8 \
    --policy-file "$policy" "${kvzap_file[@]}" --budgets 16,32,64,128,256 \
    --seqs "$seqs" --streams "$streams" --threads "$threads" --out "$out"
echo "eval-stories260K: $out/results.md in $(( $(date +%s) - start )) s" >&2
fi
conv "$shared/datasets/tinystories/tinystories-dev.txt" 0.8 "$out/conversation"

# zero-shot: conversations as plain text (stories260K has no chat template)
python3 - "$shared/datasets/oasst/oasst_en100_longest_threads.jsonl" "$oasst" <<'PY'
import json, sys
with open(sys.argv[1], encoding="utf-8") as src, open(sys.argv[2], "w", encoding="utf-8") as dst:
    for line in src:
        for m in json.loads(line)["messages"]:
            who = "User" if m["role"] == "user" else "Assistant"
            dst.write(f"{who}: {m['content'].strip()}\n")
        dst.write("\n")
PY
if [ "$only" != conversation ]; then
start=$(date +%s)
"$kvp" eval --model "$model" --tokenizer "$tok" --text "$oasst" --split 0 \
    --policy-file "$policy" "${kvzap_file[@]}" --budgets 16,32,64,128,256 \
    --seqs "$seqs" --streams "$streams" --threads "$threads" --out "$out/oasst"
echo "eval-stories260K: $out/oasst/results.md in $(( $(date +%s) - start )) s" >&2
fi
conv "$oasst" 0 "$out/oasst/conversation"
