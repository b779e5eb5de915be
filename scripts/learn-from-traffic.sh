#!/usr/bin/env bash
# Learning from traffic, full size (docs/evaluation.md "The live canary and learning from
# traffic"): kvpd on stories260K with no learned policy (the streaming fallback),
# learn_dir and learn_rate 1 serves CONVS conversations (default 200) of two messages
# each from the training part of the TinyStories dev text (the first 80%, the part
# scripts/train-stories260K.sh trains the shipped policy on) through the /chat websocket;
# then `kvp learn --transcripts` trains a policy from the kept transcripts and
# `kvp eval` compares it with the shipped policy (policy/weights/stories260K.kvp) on the
# held-out 20% of the text: ranking C/C* and streaming KL of both.
#   scripts/learn-from-traffic.sh [OUT]     (default /tmp/kvp-learn-from-traffic)
# Environment: BUILD (default build), CONVS (200), MAX_SECONDS (training's wall-time
# limit, default kvp learn's 3600), STEPS (default kvp learn's 3000), THREADS (2),
# SHIPPED (the policy compared with, default policy/weights/stories260K.kvp).
set -euo pipefail
cd "$(dirname "$0")/.."
. scripts/kvpd-port.sh
build=${BUILD:-build}
shared=${KVP_SHARED:-../shared}
out=${1:-/tmp/kvp-learn-from-traffic}
convs=${CONVS:-200}
threads=${THREADS:-2}
shipped=${SHIPPED:-policy/weights/stories260K.kvp}
model=$shared/models/stories260K.bin
tok=$shared/models/tok512.bin
text=$shared/datasets/tinystories/tinystories-dev.txt
kvp=$build/tools/kvp
ninja -C "$build" daemon/kvpd tools/kvp >/dev/null

rm -rf "$out"
mkdir -p "$out/learn" "$out/nopolicy" "$out/work"
# the training part: the first 80% by bytes, moved to a line start (kvp eval's --split)
python3 - "$text" "$out/train.txt" <<'PY'
import sys
t = open(sys.argv[1], "rb").read()
at = int(0.8 * len(t))
while 0 < at < len(t) and t[at - 1:at] != b"\n":
    at += 1
open(sys.argv[2], "wb").write(t[:at])
PY

"$build/daemon/kvpd" --listen 127.0.0.1:0 --model "$model" --tokenizer "$tok" \
    --policy-dir "$out/nopolicy" --learn-dir "$out/learn" --learn-rate 1 --max-tokens 128 \
    --canary-rate 0 --state-dir "" --admin-token-file "$out/admin.token" \
    2>"$out/kvpd.log" &
kvpd=$!
trap 'kill $kvpd 2>/dev/null || true' EXIT
port=$(kvpd_port "$out/kvpd.log")
grep -q "runs without a learned eviction policy" "$out/kvpd.log"
start=$(date +%s)
python3 scripts/chat-lines.py --port "$port" --turns 2 --min-words 40 --max-chars 600 \
    --max-tokens 96 --limit "$convs" "$out/train.txt"
for _ in $(seq 600); do
    [ "$(find "$out/learn" -name '*.kvtx' | wc -l)" -ge "$convs" ] && break
    sleep 0.1
done
kill -TERM $kvpd; wait $kvpd || true
trap - EXIT
echo "learn-from-traffic: $(find "$out/learn" -name '*.kvtx' | wc -l) transcripts in $(( $(date +%s) - start )) s" >&2

learn_opts=(--threads "$threads")
[ -n "${MAX_SECONDS:-}" ] && learn_opts+=(--max-seconds "$MAX_SECONDS")
[ -n "${STEPS:-}" ] && learn_opts+=(--steps "$STEPS")
start=$(date +%s)
status=0
"$kvp" learn --model "$model" --tokenizer "$tok" --transcripts "$out/learn" \
    --work "$out/work" --out "$out/learned.kvp" "${learn_opts[@]}" 2>&1 | tee "$out/learn.log" \
    || status=$?
echo "learn-from-traffic: kvp learn in $(( $(date +%s) - start )) s (exit $status)" >&2
# 0: installed at --out; 3: kept the installed one (the candidate is still evaluated)
[ $status = 0 ] || [ $status = 3 ] || exit 1
learned=$out/learned.kvp
if [ ! -f "$learned" ]; then
    # kept (exit 3): evaluate the candidate anyway
    learned=$(sed -n 's/.*the new one is \([^ ]*\).*/\1/p' "$out/learn.log" | head -1)
fi
[ -f "$learned" ] || { echo "learn-from-traffic: no learned policy" >&2; exit 1; }

for which in learned shipped; do
    pf=$learned
    [ $which = shipped ] && pf=$shipped
    "$kvp" eval --model "$model" --tokenizer "$tok" --text "$text" --split 0.8 \
        --policies kvp --policy-file "$pf" --threads "$threads" --out "$out/eval-$which" \
        2>"$out/eval-$which.log"
done
python3 - "$out" <<'PY'
import csv, sys
out = sys.argv[1]
res = {}
for which in ("learned", "shipped"):
    for r in csv.DictReader(open(f"{out}/eval-{which}/results.csv")):
        res.setdefault(which, []).append(r)
def pick(rows, proto, metric):
    return [r for r in rows if r["protocol"] == proto and r["metric"] == metric]
print("policy   ranking C/C*   streaming KL by budget")
for which in ("learned", "shipped"):
    cc = pick(res[which], "ranking", "cc_ratio")
    kl = pick(res[which], "streaming", "kl")
    print(f"{which:8} {float(cc[0]['value']):.3f}          " +
          "  ".join(f"{r['budget']}:{float(r['value']):.4f}" for r in kl))
a = float(pick(res["learned"], "ranking", "cc_ratio")[0]["value"])
b = float(pick(res["shipped"], "ranking", "cc_ratio")[0]["value"])
print(f"learned / shipped C/C*: {a / b:.3f} (goal <= 1.10)")
PY
exit 0
