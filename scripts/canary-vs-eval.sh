#!/usr/bin/env bash
# The eviction canary against `kvp eval` (docs/evaluation.md "The live canary and learning
# from traffic"): for each policy and budget, kvpd on stories260K (f32 rows, canary_rate 1,
# greedy) answers lines of the held-out part of the TinyStories dev text (the 20% after
# the split kvp eval and scripts/eval-stories260K.sh use), one line a one-turn
# conversation, waiting after every turn until the canary has checked it. Then kvp eval
# runs on the same messages and on the same held-out text. Printed per policy and budget:
#   canary     the canary's mean KL over all checked turns (/metrics kvpd_eviction_kl_sum
#              / _count);
#   replies    kvp eval --prompts on the messages kvpd was sent: the replies protocol's
#              KL (the model's greedy replies under eviction against the full cache, the
#              canary's measurement made offline from scratch);
#   eval512    kvp eval's streaming KL on the held-out text with streams of one context
#              (--stream-len 512);
#   eval       kvp eval's streaming KL with its default streams (4 contexts, context shift);
# and canary / replies, canary / eval.
#   scripts/canary-vs-eval.sh [OUT]     (default /tmp/kvp-canary-vs-eval)
# A run whose files are in OUT already is not repeated (rerun with the same OUT to finish
# an interrupted one; remove OUT for a fresh one). OUT/stamp records the policy file's
# sha256 and the settings: when they differ, OUT's old results are removed first.
# Environment: BUILD (default build), POLICIES (default "kvp streaming"), BUDGETS
# (default "16 32 64 128 256", the budgets kvp eval tables), TURNS (conversations per
# run, default 200), MAX_TOKENS (reply length, default 256), THREADS (2), POLICY_FILE (the kvp policy, default
# policy/weights/stories260K.kvp), EVAL_ARGS (more options of the two text evals,
# default "--seqs 1": only their streaming figures are read).
set -euo pipefail
cd "$(dirname "$0")/.."
. scripts/kvpd-port.sh
build=${BUILD:-build}
shared=${KVP_SHARED:-../shared}
out=${1:-/tmp/kvp-canary-vs-eval}
policies=${POLICIES:-kvp streaming}
budgets=${BUDGETS:-16 32 64 128 256}
turns=${TURNS:-200}
max_tokens=${MAX_TOKENS:-256}
threads=${THREADS:-2}
policy_file=${POLICY_FILE:-policy/weights/stories260K.kvp}
eval_args=${EVAL_ARGS---seqs 1}
model=$shared/models/stories260K.bin
tok=$shared/models/tok512.bin
text=$shared/datasets/tinystories/tinystories-dev.txt
kvp=$build/tools/kvp
ninja -C "$build" daemon/kvpd tools/kvp >/dev/null
plist=$(echo $policies | tr ' ' ,)
blist=$(echo $budgets | tr ' ' ,)
pf=()
case " $policies " in *" kvp "*) pf=(--policy-file "$policy_file") ;; esac

stamp="$(sha256sum <"$policy_file" | cut -d' ' -f1) $policies / $budgets / $turns / $max_tokens / $eval_args"
if [ -d "$out" ] && [ "$(cat "$out/stamp" 2>/dev/null)" != "$stamp" ]; then
    echo "canary-vs-eval: $out holds results of another policy file or settings: starting afresh" >&2
    rm -rf "$out"
fi
mkdir -p "$out"
echo "$stamp" >"$out/stamp"
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
        ppf=()
        [ "$p" = kvp ] && ppf=(--policy-file "$policy_file")
        [ -s "$run/metrics.txt" ] && continue
        "$build/daemon/kvpd" --listen 127.0.0.1:0 --model "$model" --tokenizer "$tok" \
            --kv-type f32 --policy "$p" "${ppf[@]}" --budget "$b" --canary-rate 1 \
            --temperature 0 --max-tokens "$max_tokens" --state-dir "$run/state" \
            --admin-token-file "$run/admin.token" 2>"$run/kvpd.log" &
        kvpd=$!
        port=$(kvpd_port "$run/kvpd.log")
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
    done
done
# the messages every run was sent (the same lines in the same order)
first=$(echo $policies | cut -d' ' -f1)-$(echo $budgets | cut -d' ' -f1)
python3 -c 'import json, sys
for l in open(sys.argv[1], encoding="utf-8"):
    print(json.loads(l)["message"])' "$out/$first/replies.jsonl" >"$out/prompts.txt"
if [ ! -s "$out/replies/results.csv" ]; then
    "$kvp" eval --model "$model" --tokenizer "$tok" --prompts "$out/prompts.txt" \
        --policies "$plist" "${pf[@]}" --budgets "$blist" --kv-type f32 \
        --reply-len "$max_tokens" --threads "$threads" --out "$out/replies" \
        2>"$out/replies.log"
fi
if [ ! -s "$out/eval512/results.csv" ]; then
    "$kvp" eval --model "$model" --tokenizer "$tok" --text "$text" --split 0.8 \
        --policies "$plist" "${pf[@]}" --budgets "$blist" --kv-type f32 --threads "$threads" \
        --stream-len 512 --streams 32 --kl-every 8 $eval_args --out "$out/eval512" \
        2>"$out/eval512.log"
fi
if [ ! -s "$out/eval/results.csv" ]; then
    "$kvp" eval --model "$model" --tokenizer "$tok" --text "$text" --split 0.8 \
        --policies "$plist" "${pf[@]}" --budgets "$blist" --kv-type f32 --threads "$threads" \
        $eval_args --out "$out/eval" 2>"$out/eval.log"
fi
python3 - "$out" $policies -- $budgets <<'PY' | tee "$out/table.txt"
import csv, re, sys
out = sys.argv[1]
sep = sys.argv.index("--")
policies, budgets = sys.argv[2:sep], sys.argv[sep + 1:]
def kl(path, protocol, p, b):
    return float(next(r["value"] for r in csv.DictReader(open(path))
                      if r["protocol"] == protocol and r["metric"] == "kl"
                      and r["policy"] == p and r["budget"] == b))
print(f"{'policy':10} {'budget':>6} {'turns':>5} {'canary':>8} {'replies':>8} "
      f"{'eval512':>8} {'eval':>8} {'c/replies':>9} {'c/eval':>7}")
for p in policies:
    for b in budgets:
        m = open(f"{out}/{p}-{b}/metrics.txt").read()
        lab = re.escape(f'{{policy="{p}",budget="{b}"}}')
        s = float(re.search(r"^kvpd_eviction_kl_sum" + lab + r" (\S+)", m, re.M).group(1))
        n = float(re.search(r"^kvpd_eviction_kl_count" + lab + r" (\S+)", m, re.M).group(1))
        c = s / n
        r = kl(f"{out}/replies/results.csv", "replies", p, b)
        e512 = kl(f"{out}/eval512/results.csv", "streaming", p, b)
        e = kl(f"{out}/eval/results.csv", "streaming", p, b)
        print(f"{p:10} {b:>6} {int(n):5d} {c:8.4f} {r:8.4f} {e512:8.4f} {e:8.4f} "
              f"{c / r:9.3f} {c / e:7.3f}")
PY
