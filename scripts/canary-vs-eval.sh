#!/usr/bin/env bash
# The eviction canary against `kvp eval` (docs/evaluation.md "The live canary and learning
# from traffic"): for each policy and budget, kvpd on stories260K (f32 rows, canary_rate 1,
# greedy) answers the held-out part of the TinyStories dev text (the 20% after the split
# kvp eval and scripts/eval-stories260K.sh use), one line a one-turn conversation, waiting
# after every turn until the canary has checked it; the canary's mean KL over all checked
# turns (/metrics kvpd_eviction_kl_sum / _count) is printed beside `kvp eval`'s streaming
# KL for the same policy and budget on the same text, and their ratio.
#   scripts/canary-vs-eval.sh [OUT]     (default /tmp/kvp-canary-vs-eval)
# Environment: BUILD (default build), POLICIES (default "kvp streaming"), BUDGETS
# (default "32 64"), TURNS (conversations per run, default 200; 0: every line),
# MAX_TOKENS (reply length, default 256), THREADS (2), POLICY_FILE (the kvp policy,
# default policy/weights/stories260K.kvp), EVAL_ARGS (more kvp eval options, default
# "--seqs 1": only the streaming figure is read, and the ranking and one-shot protocols'
# sequences do not change it).
set -euo pipefail
cd "$(dirname "$0")/.."
build=${BUILD:-build}
shared=${KVP_SHARED:-../shared}
out=${1:-/tmp/kvp-canary-vs-eval}
policies=${POLICIES:-kvp streaming}
budgets=${BUDGETS:-32 64}
turns=${TURNS:-200}
max_tokens=${MAX_TOKENS:-256}
threads=${THREADS:-2}
policy_file=${POLICY_FILE:-policy/weights/stories260K.kvp}
model=$shared/models/stories260K.bin
tok=$shared/models/tok512.bin
text=$shared/datasets/tinystories/tinystories-dev.txt
kvp=$build/tools/kvp
ninja -C "$build" daemon/kvpd tools/kvp >/dev/null

rm -rf "$out"
mkdir -p "$out"
# the held-out part: after the first 80% by bytes, moved to a line start (kvp eval --split)
python3 - "$text" "$out/heldout.txt" <<'PY'
import sys
t = open(sys.argv[1], "rb").read()
at = int(0.8 * len(t))
while 0 < at < len(t) and t[at - 1:at] != b"\n":
    at += 1
open(sys.argv[2], "wb").write(t[at:])
PY

kvpd=
trap '[ -n "$kvpd" ] && kill $kvpd 2>/dev/null || true' EXIT
printf '%-10s %6s %8s %12s %12s %8s\n' policy budget turns canary_kl eval_kl ratio \
    | tee "$out/table.txt"
for p in $policies; do
    for b in $budgets; do
        run=$out/$p-$b
        mkdir -p "$run/state"
        pf=()
        [ "$p" = kvp ] && pf=(--policy-file "$policy_file")
        "$build/daemon/kvpd" --listen 127.0.0.1:0 --model "$model" --tokenizer "$tok" \
            --kv-type f32 --policy "$p" "${pf[@]}" --budget "$b" --canary-rate 1 \
            --temperature 0 --max-tokens "$max_tokens" --state-dir "$run/state" \
            --admin-token-file "$run/admin.token" 2>"$run/kvpd.log" &
        kvpd=$!
        port=
        for _ in $(seq 100); do
            port=$(sed -n 's/.*listening on [0-9.]*:\([0-9]*\).*/\1/p' "$run/kvpd.log")
            [ -n "$port" ] && break
            sleep 0.1
        done
        [ -n "$port" ] || { cat "$run/kvpd.log" >&2; exit 1; }
        python3 scripts/chat-lines.py --port "$port" --turns 1 --min-words 20 \
            --max-chars 600 --max-tokens "$max_tokens" --limit "$turns" \
            --wait-canary "$run/admin.token" --record "$run/replies.jsonl" "$out/heldout.txt"
        tokn=$(cat "$run/admin.token")
        curl -s -H "Authorization: Bearer $tokn" "http://127.0.0.1:$port/admin/stats" \
            >"$run/stats.json"
        curl -s "http://127.0.0.1:$port/metrics" >"$run/metrics.txt"
        kill -TERM $kvpd; wait $kvpd || true
        kvpd=
        "$kvp" eval --model "$model" --tokenizer "$tok" --text "$text" --split 0.8 \
            --policies "$p" "${pf[@]}" --budgets "$b" --kv-type f32 --threads "$threads" \
            ${EVAL_ARGS---seqs 1} --out "$run/eval" 2>"$run/eval.log"
        python3 - "$run" "$p" "$b" <<'PY' | tee -a "$out/table.txt"
import csv, json, re, sys
run, p, b = sys.argv[1:]
m = open(f"{run}/metrics.txt").read()
lab = f'{{policy="{p}",budget="{b}"}}'
s = float(re.search(r"^kvpd_eviction_kl_sum" + re.escape(lab) + r" (\S+)", m, re.M).group(1))
n = float(re.search(r"^kvpd_eviction_kl_count" + re.escape(lab) + r" (\S+)", m, re.M).group(1))
c = json.load(open(f"{run}/stats.json"))["eviction"]["canary"]
ev = [r for r in csv.DictReader(open(f"{run}/eval/results.csv"))
      if r["protocol"] == "streaming" and r["metric"] == "kl" and r["policy"] == p
      and r["budget"] == b]
e = float(ev[0]["value"])
print(f"{p:10} {b:>6} {int(n):8d} {s / n:12.5f} {e:12.5f} {s / n / e:8.3f}"
      f"   (checked {c['checked']}, skipped {c['skipped_busy']}, failed {c['failed']})")
PY
    done
done
