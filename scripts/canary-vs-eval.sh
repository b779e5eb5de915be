#!/usr/bin/env bash
# The eviction canary against `kvp eval` (docs/evaluation.md "The live canary and learning
# from traffic"): for each policy and budget, kvpd on stories260K (f32 rows, canary_rate 1,
# greedy) answers the held-out part of the TinyStories dev text (the 20% after the split
# kvp eval and scripts/eval-stories260K.sh use), one line a one-turn conversation, waiting
# after every turn until the canary has checked it. Printed per policy and budget:
#   canary     the canary's mean KL over all checked turns (/metrics kvpd_eviction_kl_sum
#              / _count);
#   own, own16 canary-replay (tests/sessions/canary_replay.c) on the same lines: the
#              greedy replies under eviction, exact KL and the canary's top-16 estimate
#              at the reply positions;
#   text       the same positions with the held-out text in place of the reply, exact;
#   eval512    kvp eval's streaming KL with streams of one context (--stream-len 512), the
#              positions a one-turn conversation has;
#   eval       kvp eval's streaming KL with its default streams (4 contexts, context shift);
# and canary / eval512, canary / eval.
#   scripts/canary-vs-eval.sh [OUT]     (default /tmp/kvp-canary-vs-eval)
# A run whose files are in OUT already is not repeated (rerun with the same OUT to finish
# an interrupted one; remove OUT for a fresh one).
# Environment: BUILD (default build), POLICIES (default "kvp streaming"), BUDGETS
# (default "32 64"), TURNS (conversations per run, default 200), REPLAY_LINES (default
# 100), MAX_TOKENS (reply length, default 256), THREADS (2), POLICY_FILE (the kvp policy,
# default policy/weights/stories260K.kvp), EVAL_ARGS (more kvp eval options, default
# "--seqs 1": only the streaming figures are read, and the ranking and one-shot
# protocols' sequences do not change them).
set -euo pipefail
cd "$(dirname "$0")/.."
build=${BUILD:-build}
shared=${KVP_SHARED:-../shared}
out=${1:-/tmp/kvp-canary-vs-eval}
policies=${POLICIES:-kvp streaming}
budgets=${BUDGETS:-32 64}
turns=${TURNS:-200}
replay_lines=${REPLAY_LINES:-100}
max_tokens=${MAX_TOKENS:-256}
threads=${THREADS:-2}
policy_file=${POLICY_FILE:-policy/weights/stories260K.kvp}
eval_args=${EVAL_ARGS---seqs 1}
model=$shared/models/stories260K.bin
tok=$shared/models/tok512.bin
text=$shared/datasets/tinystories/tinystories-dev.txt
kvp=$build/tools/kvp
ninja -C "$build" daemon/kvpd tools/kvp tests/sessions/canary-replay >/dev/null

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
for p in $policies; do
    for b in $budgets; do
        run=$out/$p-$b
        mkdir -p "$run/state"
        pf=()
        [ "$p" = kvp ] && pf=(--policy-file "$policy_file")
        if [ ! -s "$run/metrics.txt" ]; then
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
                --wait-canary "$run/admin.token" --record "$run/replies.jsonl" \
                "$out/heldout.txt"
            tokn=$(cat "$run/admin.token")
            curl -s -H "Authorization: Bearer $tokn" "http://127.0.0.1:$port/admin/stats" \
                >"$run/stats.json"
            curl -s "http://127.0.0.1:$port/metrics" >"$run/metrics.tmp"
            mv "$run/metrics.tmp" "$run/metrics.txt"
            kill -TERM $kvpd; wait $kvpd || true
            kvpd=
        fi
        if [ ! -s "$run/replay.txt" ]; then
            "$build/tests/sessions/canary-replay" "$model" "$tok" "$p" "${pf[1]:--}" "$b" \
                "$out/heldout.txt" "$replay_lines" "$max_tokens" >"$run/replay.tmp"
            mv "$run/replay.tmp" "$run/replay.txt"
        fi
        if [ ! -s "$run/eval512/results.csv" ]; then
            "$kvp" eval --model "$model" --tokenizer "$tok" --text "$text" --split 0.8 \
                --policies "$p" "${pf[@]}" --budgets "$b" --kv-type f32 --threads "$threads" \
                --stream-len 512 --streams 32 --kl-every 8 $eval_args --out "$run/eval512" \
                2>"$run/eval512.log"
        fi
        if [ ! -s "$run/eval/results.csv" ]; then
            "$kvp" eval --model "$model" --tokenizer "$tok" --text "$text" --split 0.8 \
                --policies "$p" "${pf[@]}" --budgets "$b" --kv-type f32 --threads "$threads" \
                $eval_args --out "$run/eval" 2>"$run/eval.log"
        fi
    done
done
python3 - "$out" $policies -- $budgets <<'PY' | tee "$out/table.txt"
import csv, json, re, sys
out = sys.argv[1]
sep = sys.argv.index("--")
policies, budgets = sys.argv[2:sep], sys.argv[sep + 1:]
def stream_kl(path, p, b):
    return float(next(r["value"] for r in csv.DictReader(open(path))
                      if r["protocol"] == "streaming" and r["metric"] == "kl"
                      and r["policy"] == p and r["budget"] == b))
print(f"{'policy':10} {'budget':>6} {'turns':>5} {'canary':>8} {'own':>8} {'own16':>8} "
      f"{'text':>8} {'eval512':>8} {'eval':>8} {'c/e512':>7} {'c/eval':>7}")
for p in policies:
    for b in budgets:
        run = f"{out}/{p}-{b}"
        m = open(f"{run}/metrics.txt").read()
        lab = re.escape(f'{{policy="{p}",budget="{b}"}}')
        s = float(re.search(r"^kvpd_eviction_kl_sum" + lab + r" (\S+)", m, re.M).group(1))
        n = float(re.search(r"^kvpd_eviction_kl_count" + lab + r" (\S+)", m, re.M).group(1))
        rp = open(f"{run}/replay.txt").read().split()
        rp = dict(zip(rp[::2], rp[1::2]))
        e512 = stream_kl(f"{run}/eval512/results.csv", p, b)
        e = stream_kl(f"{run}/eval/results.csv", p, b)
        c = s / n
        print(f"{p:10} {b:>6} {int(n):5d} {c:8.4f} {float(rp['own_exact']):8.4f} "
              f"{float(rp['own_canary']):8.4f} {float(rp['text_exact']):8.4f} {e512:8.4f} "
              f"{e:8.4f} {c / e512:7.3f} {c / e:7.3f}")
PY
