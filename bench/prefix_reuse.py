#!/usr/bin/env python3
"""Prefix reuse: kvpd with its cache reuse against the same kvpd re-prefilling.

    bench/prefix_reuse.py --model FILE.gguf [--kvpd build/daemon/kvpd]
                          [--conversations 16] [--system-words 540] [--reply 16]
                          [--reps 3] [--kvpd-arg=--budget=0 ...]

Starts two kvpd on free loopback ports with the same flags, one of them with
--no-reuse-cache (the reference: every request prefills its whole prompt), and runs the
same loads on each, alternating which goes first from one repetition to the next. Every
load's texts carry a fresh nonce at their start, so no load reuses another's cache.

Loads (one streaming OpenAI client each, Python's standard library only):
  shared-system  N new conversations sent at once, each with the same long system
                 prompt (--system-words words, about 1.1 tokens a word on Qwen's
                 tokenizer) and a short message of its own: the reusing kvpd prefills
                 the system prompt once (the later ones wait for the first's turn and
                 fork it).
  regenerate     one conversation with that system prompt, then the same request
                 again (a client's "regenerate"): the reusing kvpd cuts the session back
                 to the prompt and prefills its last token.
  edit-last      then the same history with another last message.
Measured per load, client side: the wall time to the last reply, the time to first
token (request sent to the first content chunk) p50 and p99, and the prompt tokens the
daemon prefilled (the usage chunk's kvpd.prefilled_tokens, summed). The table gives the
medians over the repetitions and reuse / re-prefill ratios.
"""
import argparse
import os
import statistics
import sys
import threading
import time
import uuid

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from oai_bench import (Server, free_port, kvpd_argv, load_avg, pct,  # noqa: E402
                       run_at_once, stream_turn)

WORDS = ("the old lighthouse keeper kept a careful log of every ship that passed the "
         "rocky point at night and wrote down the weather the sea and the names of the "
         "sailors who waved from the deck").split()


def system_text(nonce, words):
    body = " ".join(WORDS[i % len(WORDS)] for i in range(words))
    return f"[{nonce}] You are a patient assistant. Background notes: {body}."


def turn(server, messages, reply):
    meta = {}
    body = {"model": server.model, "messages": messages, "stream": True,
            "max_tokens": reply, "temperature": 0.0,
            "stream_options": {"include_usage": True}}
    text, _, ttft = stream_turn(server.port, body, meta)
    k = meta.get("kvpd") or {}
    if "prefilled_tokens" not in k:
        raise RuntimeError(f"{server.name}: no kvpd.prefilled_tokens in the usage chunk")
    return text, ttft, k["prefilled_tokens"]


def shared_system(server, n, words, reply):
    """n conversations at once: (wall s, [ttft s], prefilled tokens in all)."""
    system = system_text(uuid.uuid4().hex[:12], words)
    out, errors, lock = [], [], threading.Lock()

    def one(i):
        try:
            r = turn(server, [{"role": "system", "content": system},
                              {"role": "user", "content": f"Question {i}: what did ship {i} carry?"}],
                     reply)
            with lock:
                out.append(r)
        except Exception as e:  # reported after the load
            with lock:
                errors.append(f"conversation {i}: {e}")

    wall = run_at_once(one, n)
    if errors:
        raise RuntimeError(f"{server.name}: " + "; ".join(errors[:3]))
    return wall, [r[1] for r in out], sum(r[2] for r in out)


def follow_ups(server, words, reply):
    """One conversation, then its regenerate and an edit of its last message:
    {load: (wall s, [ttft s], prefilled)} for the two follow-ups."""
    system = system_text(uuid.uuid4().hex[:12], words)
    msgs = [{"role": "system", "content": system},
            {"role": "user", "content": "Which ship came first?"}]
    turn(server, msgs, reply)
    res = {}
    for name, m in (("regenerate", msgs),
                    ("edit-last", msgs[:1] + [{"role": "user", "content": "Which ship came last?"}])):
        t0 = time.monotonic()
        _, ttft, pre = turn(server, m, reply)
        res[name] = (time.monotonic() - t0, [ttft], pre)
    return res


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--kvpd", default="build/daemon/kvpd")
    ap.add_argument("--model", required=True)
    ap.add_argument("--conversations", type=int, default=16)
    ap.add_argument("--system-words", type=int, default=540)
    ap.add_argument("--reply", type=int, default=16)
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--kvpd-arg", action="append", default=[],
                    help="extra kvpd flag for both (repeatable), e.g. --kvpd-arg=--budget=0")
    ap.add_argument("--logdir", default="/tmp")
    a = ap.parse_args()
    if a.conversations < 1 or a.reps < 1 or a.reply < 1 or a.system_words < 1:
        ap.error("--conversations, --reps, --reply and --system-words must be at least 1")

    servers = {}
    try:
        for name, extra in (("reuse", []), ("re-prefill", ["--no-reuse-cache"])):
            port = free_port()
            argv = kvpd_argv(a.kvpd, a.model, port, 2 * a.conversations,
                             a.kvpd_arg + extra)
            servers[name] = Server(f"kvpd ({name})", argv, port, "/healthz",
                                   os.path.join(a.logdir, f"prefix-reuse-{name}.log"))
            print(f"{name}: {' '.join(argv)}")
        for s in servers.values():
            s.wait_up()
        print(f"load before: {load_avg()}")
        res = {n: {} for n in servers}   # server -> load -> [(wall, ttfts, prefilled)]
        for rep in range(a.reps):
            order = ["reuse", "re-prefill"] if rep % 2 == 0 else ["re-prefill", "reuse"]
            for name in order:
                s = servers[name]
                res[name].setdefault("shared-system", []).append(
                    shared_system(s, a.conversations, a.system_words, a.reply))
                for load, r in follow_ups(s, a.system_words, a.reply).items():
                    res[name].setdefault(load, []).append(r)
            print(f"repetition {rep + 1} of {a.reps} done (load {load_avg()})", flush=True)
        print(f"load after: {load_avg()}")
        print(f"\n{a.conversations} conversations at once for shared-system; replies of "
              f"{a.reply} tokens, greedy; medians of {a.reps} alternating repetitions\n")
        print("| load | server | prefilled tokens | wall s | TTFT p50 ms | TTFT p99 ms |")
        print("|---|---|---:|---:|---:|---:|")
        med = {}
        for load in ("shared-system", "regenerate", "edit-last"):
            for name in ("re-prefill", "reuse"):
                runs = res[name][load]
                m = (statistics.median(r[2] for r in runs),
                     statistics.median(r[0] for r in runs),
                     statistics.median(pct(r[1], 50) for r in runs) * 1e3,
                     statistics.median(pct(r[1], 99) for r in runs) * 1e3)
                med[(load, name)] = m
                print(f"| {load} | {name} | {m[0]:.0f} | {m[1]:.2f} | {m[2]:.0f} | {m[3]:.0f} |")
        print("\n| load | prefilled: reuse / re-prefill | wall | TTFT p50 | TTFT p99 |")
        print("|---|---:|---:|---:|---:|")
        for load in ("shared-system", "regenerate", "edit-last"):
            r, b = med[(load, "reuse")], med[(load, "re-prefill")]
            print(f"| {load} | " + " | ".join(f"{x / y:.3f}x" if y else "-"
                                              for x, y in zip(r, b)) + " |")
    finally:
        for s in servers.values():
            s.stop()


if __name__ == "__main__":
    main()
