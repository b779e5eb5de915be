#!/usr/bin/env python3
"""kvpd against llama.cpp's server on the same GGUF, with one streaming OpenAI client.

    bench/vs_llamacpp.py --kvpd build/daemon/kvpd --llama-server PATH --model FILE.gguf
                         [--conversations 1,16] [--replies 32,128] [--reps 3]
                         [--turns 2] [--threads 2] [--kvpd-arg=--budget=0 ...]
                         [--quick]

Starts both servers on free loopback ports (both stay up; an idle server uses no CPU),
then for every case (conversations x greedy / temperature 0.8 top-p 0.9 x reply length)
runs the same load on each server, alternating which goes first from one repetition to
the next. A load is N conversations at once, each `--turns` turns of one user message
and a streamed reply of at most R tokens (`max_tokens`); later turns send the whole
transcript, as an OpenAI client does. Every prompt carries a fresh nonce so no
repetition reuses another's cache.

Measured per load, client side: aggregate reply tokens/s (the usage's completion_tokens
summed over all replies, over the wall time of the load; again with the streamed chunks
carrying content counted instead, the last column's ratio) and the time to first token
(request sent to the first chunk carrying content) of every turn, p50 and p99. The
table gives the medians over the repetitions and the kvpd / llama ratios (tok/s: higher
is better for kvpd; TTFT: lower is). Sampling sends temperature 0.8 and top_p 0.9 and
leaves the rest to each server's defaults: llama.cpp's add top_k 40 and min_p 0.05
(its sampler then sorts at most 40 candidates), kvpd's none (top-p over the whole
vocabulary). `--sampled-extra '{"top_k": 40, "min_p": 0.05}'` sends the same filters
to both. After the table, each server's aggregate at the most conversations over its
aggregate at the fewest (16 / 1 by default), per sampling mode and reply length.
`--quick` (one repetition, one turn per conversation, 32-token replies) checks the whole
run works in a few minutes; its figures are not the benchmark. Python 3 standard
library only.
"""
import argparse
import json
import os
import statistics
import sys
import threading
import uuid

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from oai_bench import (Server, free_port, kvpd_argv, llama_argv, load_avg,  # noqa: E402
                       pct, run_at_once, stream_chat)


def run_load(server, conversations, reply, sampled, turns, sampled_extra=None):
    """One load on one server: (aggregate tok/s by usage.completion_tokens, [ttft s],
    mean tokens per reply, aggregate tok/s by the streamed chunks carrying content)."""
    nonce = uuid.uuid4().hex[:12]
    sampled_extra = sampled_extra or {}
    ttfts, tokens, chunks, errors = [], [], [], []
    lock = threading.Lock()

    def conversation(i):
        msgs = []
        try:
            for t in range(turns):
                msgs.append({"role": "user", "content":
                             f"[{nonce}-{i}-{t}] Tell me a story about a lighthouse "
                             f"keeper number {i} and the ship that came at turn {t}."})
                body = {"model": server.model, "messages": msgs, "stream": True,
                        "max_tokens": reply, "stream_options": {"include_usage": True}}
                if sampled:
                    body.update(temperature=0.8, top_p=0.9, **sampled_extra)
                else:
                    body.update(temperature=0.0)
                st = stream_chat(server.port, body)
                n = st.completion_tokens
                msgs.append({"role": "assistant", "content": st.text})
                with lock:
                    ttfts.append(st.ttft)
                    tokens.append(st.chunks if n is None else n)
                    chunks.append(st.chunks)
        except Exception as e:  # reported after the load, which goes on
            with lock:
                errors.append(f"conversation {i}: {e}")

    wall = run_at_once(conversation, conversations)
    if errors:
        raise RuntimeError(f"{server.name}: " + "; ".join(errors[:3]))
    return (sum(tokens) / wall, ttfts, sum(tokens) / max(1, len(tokens)),
            sum(chunks) / wall)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--kvpd", default="build/daemon/kvpd")
    ap.add_argument("--llama-server", required=True)
    ap.add_argument("--model", required=True)
    ap.add_argument("--conversations", default="1,16")
    ap.add_argument("--replies", default="32,128")
    ap.add_argument("--modes", default="greedy,sampled")
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--turns", type=int, default=2)
    ap.add_argument("--threads", type=int, default=os.cpu_count() or 2)
    ap.add_argument("--ctx-per-slot", type=int, default=1024,
                    help="llama-server context per parallel slot")
    ap.add_argument("--kvpd-arg", action="append", default=[],
                    help="extra kvpd flag (repeatable), e.g. --kvpd-arg=--budget=0")
    ap.add_argument("--sampled-extra", default="{}",
                    help="JSON object of more request fields for the sampled loads")
    ap.add_argument("--logdir", default="/tmp")
    ap.add_argument("--quick", action="store_true",
                    help="validation run: --reps 1 --turns 1 --replies 32")
    a = ap.parse_args()
    if a.quick:
        a.reps, a.turns, a.replies = 1, 1, "32"
    convs = [int(x) for x in a.conversations.split(",")]
    replies = [int(x) for x in a.replies.split(",")]
    modes = a.modes.split(",")
    for m in modes:
        if m not in ("greedy", "sampled"):
            ap.error(f"--modes: unknown mode {m!r} (greedy, sampled)")
    slots = max(convs)
    try:
        extra = json.loads(a.sampled_extra)
        if not isinstance(extra, dict):
            raise ValueError("not an object")
    except ValueError as e:
        ap.error(f"--sampled-extra: {e}")

    lport, kport = free_port(), free_port()
    largv = llama_argv(a.llama_server, a.model, lport, slots, slots * a.ctx_per_slot,
                       a.threads)
    kargv = kvpd_argv(a.kvpd, a.model, kport, slots, a.kvpd_arg)
    tag = uuid.uuid4().hex[:6]
    servers = {}
    try:
        servers["llama"] = Server("llama-server", largv, lport, "/health",
                                  os.path.join(a.logdir, f"vs-llama-{tag}.log"))
        servers["kvpd"] = Server("kvpd", kargv, kport, "/healthz",
                                 os.path.join(a.logdir, f"vs-kvpd-{tag}.log"))
        for s in servers.values():
            s.wait_up()
        print(f"model: {a.model}")
        print(f"llama-server: {' '.join(largv)}")
        print(f"kvpd: {' '.join(kargv)}")
        print(f"sampled loads: temperature 0.8, top_p 0.9, plus {json.dumps(extra)}")
        print(f"{a.reps} repetitions, servers alternating, {a.turns} turns per "
              f"conversation; load average before: {load_avg()}", flush=True)
        # warm both (page in the weights)
        for s in servers.values():
            run_load(s, 1, 8, False, 1)
        rows = []
        for n in convs:
            for mode in modes:
                for reply in replies:
                    res = {"llama": [], "kvpd": []}
                    for rep in range(a.reps):
                        order = ["llama", "kvpd"] if rep % 2 == 0 else ["kvpd", "llama"]
                        for name in order:
                            tok_s, tt, mean_n, chunk_s = run_load(
                                servers[name], n, reply, mode == "sampled", a.turns, extra)
                            res[name].append((tok_s, pct(tt, 50), pct(tt, 99), mean_n,
                                              chunk_s))
                            print(f"  {n:2d} conv {mode:7s} {reply:3d} tok  rep {rep + 1} "
                                  f"{name:5s}: {tok_s:7.1f} tok/s ({chunk_s:7.1f} by chunks)  TTFT p50 "
                                  f"{pct(tt, 50) * 1e3:7.0f} ms p99 {pct(tt, 99) * 1e3:7.0f} ms"
                                  f"  {mean_n:5.1f} tok/reply  load {load_avg()}", flush=True)
                    med = {k: [statistics.median(x[i] for x in v) for i in range(5)]
                           for k, v in res.items()}
                    rows.append((n, mode, reply, med))
        print(f"\nload average after: {load_avg()}\n")
        print("| conversations | sampling | reply tokens | llama tok/s | kvpd tok/s | "
              "kvpd / llama | llama TTFT p50 / p99 ms | kvpd TTFT p50 / p99 ms | "
              "TTFT p99 kvpd / llama | kvpd / llama by chunks |")
        print("|---:|---|---:|---:|---:|---:|---:|---:|---:|---:|")
        for n, mode, reply, med in rows:
            l, k = med["llama"], med["kvpd"]
            samp = "greedy" if mode == "greedy" else "T 0.8, top-p 0.9"
            print(f"| {n} | {samp} | {reply} | {l[0]:.1f} | {k[0]:.1f} | "
                  f"**{k[0] / l[0]:.2f}x** | {l[1] * 1e3:.0f} / {l[2] * 1e3:.0f} | "
                  f"{k[1] * 1e3:.0f} / {k[2] * 1e3:.0f} | {k[2] / l[2]:.2f}x | "
                  f"{k[4] / l[4]:.2f}x |")
        by = {(n, mode, reply): med for n, mode, reply, med in rows}
        if len(convs) > 1:
            lo, hi = min(convs), max(convs)
            print(f"\n| aggregate tok/s, {hi} conversations / {lo} | sampling | reply tokens "
                  f"| llama | kvpd |")
            print("|---|---|---:|---:|---:|")
            for mode in modes:
                for reply in replies:
                    a_lo, a_hi = by[(lo, mode, reply)], by[(hi, mode, reply)]
                    samp = "greedy" if mode == "greedy" else "T 0.8, top-p 0.9"
                    print(f"| {hi} / {lo} | {samp} | {reply} | "
                          f"{a_hi['llama'][0] / a_lo['llama'][0]:.2f}x | "
                          f"{a_hi['kvpd'][0] / a_lo['kvpd'][0]:.2f}x |")
        if "greedy" in modes and "sampled" in modes:
            print("\n| kvpd aggregate tok/s, sampled / greedy | conversations | reply tokens "
                  "| ratio |")
            print("|---|---:|---:|---:|")
            for n in convs:
                for reply in replies:
                    g, t = by[(n, "greedy", reply)], by[(n, "sampled", reply)]
                    print(f"| T 0.8 top-p 0.9 / greedy | {n} | {reply} | "
                          f"{t['kvpd'][0] / g['kvpd'][0]:.2f}x |")
        short = [(n, mode, reply, med) for n, mode, reply, med in rows
                 if min(med["llama"][3], med["kvpd"][3]) < 0.9 * reply]
        for n, mode, reply, med in short:
            print(f"note: {n} conv {mode} {reply}: mean reply {med['llama'][3]:.1f} tokens "
                  f"(llama) / {med['kvpd'][3]:.1f} (kvpd), below max_tokens")
    finally:
        for s in servers.values():
            s.stop()


if __name__ == "__main__":
    sys.exit(main())
