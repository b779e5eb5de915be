#!/usr/bin/env python3
"""kvpd at one conversation against `kvp generate` on the same file and settings.

    bench/gen_vs_daemon.py --model FILE.gguf [--kvp build/tools/kvp]
                           [--kvpd build/daemon/kvpd] [--replies 64,128] [--reps 5]
                           [--modes sampled,greedy] [--kvpd-arg=--budget=0 ...]

What each side measures:
- `kvp generate --prompt P --steps PROMPT+R --ignore-eos --kv-type q8_0`: its own
  decode tok/s (the reply's tokens over the decode loop's time, prefill excluded), the
  engine alone, no server.
- kvpd (started once, `--budget 0` as generate's unbounded cache, its default q8_0 rows):
  one streamed chat completion of at most R tokens, client side: the reply's tokens over
  the whole request, from sending it to the end of the stream, TTFT included. Reply
  tokens are counted twice: usage.completion_tokens and the streamed chunks carrying
  content; the ratio uses the usage count and the table shows both.

The two alternate (generate first in odd repetitions, kvpd first in even ones); every
request carries a fresh nonce so no repetition reuses a cache. Printed: each run, then
medians and kvpd / generate, with the load average around the run. Sampling modes:
`sampled` (temperature 0.8, top_p 0.9, seed per repetition) and `greedy`. Python 3
standard library only.
"""
import argparse
import os
import re
import statistics
import subprocess
import sys
import uuid

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from oai_bench import Server, free_port, kvpd_argv, load_avg, stream_chat  # noqa: E402

PROMPT = "Tell me a story about a lighthouse keeper and the ship that came at night."


def run_generate(kvp, model, reply, sampled, seed, threads):
    """`kvp generate` once: its decode tok/s and the reply tokens it counted."""
    prompt = f"[{uuid.uuid4().hex[:12]}] {PROMPT}"
    # --steps counts the prompt too: the prompt's tokens (as `kvp tokenize` encodes
    # them) plus the reply; the decode line says what it decoded.
    t = subprocess.run([kvp, "tokenize", "--model", model, "--text", prompt],
                       capture_output=True, timeout=120)
    if t.returncode != 0:
        raise RuntimeError(f"kvp tokenize failed: {t.stderr[-400:]!r}")
    n_prompt = len(t.stdout.split())
    argv = [kvp, "generate", "--model", model, "--prompt", prompt, "--steps",
            str(n_prompt + reply), "--ignore-eos", "--kv-type", "q8_0", "--seed", str(seed),
            "--temperature", "0.8" if sampled else "0", "--top-p", "0.9"]
    env = dict(os.environ)
    if threads:
        env["KVP_THREADS"] = str(threads)
    p = subprocess.run(argv, capture_output=True, timeout=600, env=env)
    err = p.stderr.decode("utf-8", "replace")
    if p.returncode != 0:
        raise RuntimeError(f"kvp generate failed: {err[-400:]}")
    m = re.search(r"prefill: (\d+) tokens, [0-9.]+ tok/s; decode: (\d+) tokens, ([0-9.]+) tok/s",
                  err)
    if not m:
        raise RuntimeError(f"kvp generate printed no decode line: {err[-400:]}")
    return float(m.group(3)), int(m.group(2)), int(m.group(1))


def run_kvpd(server, reply, sampled, seed):
    """One streamed request: (tok/s by usage, tok/s by chunks, ttft s, usage tokens)."""
    body = {"model": server.model, "stream": True, "max_tokens": reply,
            "stream_options": {"include_usage": True},
            "messages": [{"role": "user",
                          "content": f"[{uuid.uuid4().hex[:12]}] {PROMPT}"}]}
    if sampled:
        body.update(temperature=0.8, top_p=0.9, seed=seed)
    else:
        body.update(temperature=0.0)
    s = stream_chat(server.port, body)
    n = s.completion_tokens if s.completion_tokens is not None else s.chunks
    return n / s.end, s.chunks / s.end, s.ttft, n


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--model", required=True)
    ap.add_argument("--kvp", default="build/tools/kvp")
    ap.add_argument("--kvpd", default="build/daemon/kvpd")
    ap.add_argument("--replies", default="64,128")
    ap.add_argument("--modes", default="sampled,greedy")
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--threads", type=int, default=0,
                    help="KVP_THREADS for both (0: all CPUs, their default)")
    ap.add_argument("--kvpd-arg", action="append", default=["--budget=0"],
                    help="extra kvpd flag (repeatable); --budget=0 is always given")
    ap.add_argument("--logdir", default="/tmp")
    a = ap.parse_args()
    replies = [int(x) for x in a.replies.split(",")]
    modes = a.modes.split(",")
    for m in modes:
        if m not in ("greedy", "sampled"):
            ap.error(f"--modes: unknown mode {m!r} (greedy, sampled)")

    port = free_port()
    argv = kvpd_argv(a.kvpd, a.model, port, 1, a.kvpd_arg)
    env_threads = {"KVP_THREADS": str(a.threads)} if a.threads else {}
    os.environ.update(env_threads)
    server = Server("kvpd", argv, port, "/healthz",
                    os.path.join(a.logdir, f"gen-vs-kvpd-{uuid.uuid4().hex[:6]}.log"))
    try:
        server.wait_up()
        print(f"model: {a.model}\nkvpd: {' '.join(argv)}")
        print(f"{a.reps} repetitions alternating; load average before: {load_avg()}",
              flush=True)
        run_kvpd(server, 8, False, 1)  # page the weights in
        rows = []
        for mode in modes:
            for reply in replies:
                gen, dae, chunk, ttft = [], [], [], []
                for rep in range(a.reps):
                    order = ("gen", "kvpd") if rep % 2 == 0 else ("kvpd", "gen")
                    for side in order:
                        if side == "gen":
                            tps, n, npr = run_generate(a.kvp, a.model, reply,
                                                       mode == "sampled", rep + 1, a.threads)
                            gen.append(tps)
                            print(f"  {mode:7s} {reply:3d}  rep {rep + 1} generate: "
                                  f"{tps:6.1f} tok/s decode ({n} tokens after {npr})  "
                                  f"load {load_avg()}", flush=True)
                        else:
                            tps, tpc, tt, n = run_kvpd(server, reply, mode == "sampled",
                                                       rep + 1)
                            dae.append(tps)
                            chunk.append(tpc)
                            ttft.append(tt)
                            print(f"  {mode:7s} {reply:3d}  rep {rep + 1} kvpd:     "
                                  f"{tps:6.1f} tok/s whole request ({n} tokens, "
                                  f"{tpc:6.1f} by chunks, TTFT {tt * 1e3:5.0f} ms)  "
                                  f"load {load_avg()}", flush=True)
                pair = [d / g for d, g in zip(dae, gen)]
                rows.append((mode, reply, statistics.median(gen), statistics.median(dae),
                             statistics.median(chunk), statistics.median(ttft),
                             statistics.median(pair)))
        print(f"\nload average after: {load_avg()}\n")
        print("| sampling | reply tokens | generate decode tok/s | kvpd tok/s (usage) | "
              "kvpd tok/s (chunks) | kvpd TTFT ms | kvpd / generate | median of pairs |")
        print("|---|---:|---:|---:|---:|---:|---:|---:|")
        for mode, reply, g, d, c, t, p in rows:
            samp = "greedy" if mode == "greedy" else "T 0.8, top-p 0.9"
            print(f"| {samp} | {reply} | {g:.1f} | {d:.1f} | {c:.1f} | {t * 1e3:.0f} | "
                  f"**{d / g:.2f}x** | {p:.2f}x |")
    finally:
        server.stop()


if __name__ == "__main__":
    sys.exit(main())
