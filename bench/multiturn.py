#!/usr/bin/env python3
"""Multi-turn replay: N simulated users chatting R rounds with kvpd and llama.cpp's server.

    bench/multiturn.py --model FILE.gguf [--kvpd build/daemon/kvpd] [--llama-server PATH]
                       [--users 32] [--rounds 6] [--reply 64] [--system-prompts 3]
                       [--system-tokens 500] [--shared-share 0.75] [--user-words 40]
                       [--think-time 1.0] [--think-dist exp|fixed] [--arrival-gap 0.25]
                       [--text FILE|generate] [--reps 3] [--seed 1] [--threads N]
                       [--slots N] [--ctx-per-slot 2048] [--kvpd-arg=--budget=0 ...]
                       [--llama-arg=... ...]
    bench/multiturn.py --self-test

Starts kvpd (and llama.cpp's server when --llama-server is given) on free loopback ports
on the same file, then runs the same replay on each, alternating which goes first from
one repetition to the next. A replay: user i starts i x --arrival-gap seconds after the
first; a --shared-share of the users begin with one of --system-prompts common system
prompts of about --system-tokens tokens (user i takes prompt i mod K), the others with
no system prompt. Each user then holds --rounds rounds: a user message of --user-words
words (passages of the TinyStories text, or of a word generator with --text generate),
a streamed reply of at most --reply tokens (max_tokens, greedy), then a think time
(--think-dist exp: exponential with mean --think-time seconds; fixed: exactly that)
before the next round. Every round resends the whole transcript, the replies included,
as an OpenAI client does. Each repetition's texts carry a fresh nonce at their start,
so no repetition reuses another's cache; both servers get the same texts otherwise.

Measured per replay, client side (wall time: first request sent to last reply ended,
think times included):
  requests/s            replies completed over the wall time
  output tok/s          usage.completion_tokens summed, over the wall time; and the same
                        counted as the streamed chunks carrying content
  TTFT p50 / p99        request sent to the first content chunk, over all requests
  inter-token p50 / p99 the gaps between successive content chunks of a reply, pooled
  prompt-cache hit      cached prompt tokens / prompt tokens, summed over the requests:
                        usage.prompt_tokens_details.cached_tokens / usage.prompt_tokens
                        where the server sends it (kvpd); else timings.cache_n /
                        (cache_n + prompt_n) (llama.cpp's server from the builds that
                        report cache_n); else usage.prompt_tokens - timings.prompt_n
                        (the prompt tokens it did not evaluate; older llama.cpp builds,
                        marked "derived"); else not reported.
The table gives each metric's median over the repetitions and the ratio kvpd /
llama.cpp; after it, how each server chunks its stream (the chunk sequence of a reply,
and completion tokens per content chunk). Python 3 standard library only.
"""
import argparse
import collections
import contextlib
import io
import json
import math
import os
import random
import statistics
import sys
import threading
import time
import unittest
import uuid

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from oai_bench import (Server, Stream, free_port, kvpd_argv, llama_argv,  # noqa: E402
                       load_avg, pct, stream_chat)

HERE = os.path.dirname(os.path.abspath(__file__))
DEFAULT_TEXT = os.path.normpath(os.path.join(
    os.environ.get("KVP_SHARED", os.path.join(HERE, "..", "..", "shared")),
    "datasets", "tinystories", "tinystories-dev.txt"))
# About 1.2 tokens a word of TinyStories on Qwen's tokenizer: words of a system prompt
# of --system-tokens tokens.
TOKENS_PER_WORD = 1.2
GENERATED = ("the a little big dog cat bird tree house sun rain happy sad ran jumped "
             "played saw found gave said friend mom ball park river boat day night "
             "and then but so because they she he it was were very").split()


# ---- the replay's texts ----

class Texts:
    """The words the system prompts and user messages are cut from: the text file's, or
    (path "generate") a seeded sequence of common words."""

    def __init__(self, path, seed):
        if path == "generate":
            rng = random.Random(seed)
            self.words = [rng.choice(GENERATED) for _ in range(200000)]
        else:
            with open(path, encoding="utf-8") as f:
                self.words = f.read().split()
            if len(self.words) < 1000:
                raise ValueError(f"{path}: {len(self.words)} words, need at least 1000")

    def passage(self, start, n):
        w = self.words
        start %= len(w)
        out = w[start:start + n]
        while len(out) < n:
            out += w[:n - len(out)]
        return " ".join(out)


def system_prompts(texts, k, tokens, nonce):
    """K system prompts of about `tokens` tokens, each starting with the nonce."""
    words = max(1, round(tokens / TOKENS_PER_WORD))
    return [f"[{nonce}] You are storyteller {j + 1}. Answer in the manner of these "
            f"stories: {texts.passage(j * 7919 * words, words)}" for j in range(k)]


def user_plan(a, texts, nonce):
    """Per user: (system prompt or None, [user messages], think times, start offset s).
    The plan depends on the seed and the nonce only, so both servers replay the same."""
    rng = random.Random(a.seed)
    prompts = system_prompts(texts, a.system_prompts, a.system_tokens, nonce)
    shared = round(a.shared_share * a.users)
    plan = []
    for u in range(a.users):
        system = prompts[u % len(prompts)] if u < shared else None
        start = rng.randrange(len(texts.words))
        msgs = [f"[{nonce}-{u}] Round {r + 1}. Go on with this story: "
                f"{texts.passage(start + r * a.user_words, a.user_words)}"
                for r in range(a.rounds)]
        thinks = [think_time(rng, a.think_dist, a.think_time) for _ in range(a.rounds - 1)]
        plan.append((system, msgs, thinks, u * a.arrival_gap))
    return plan


def think_time(rng, dist, mean):
    if dist == "fixed" or mean == 0:
        return mean
    return rng.expovariate(1.0 / mean)


# ---- one replay and its figures ----

def cache_figures(s):
    """(cached prompt tokens, prompt tokens, source) of one reply, or None when the
    server reports neither (see the module's text for the sources)."""
    u, t = s.usage or {}, s.timings or {}
    det = u.get("prompt_tokens_details")
    if isinstance(det, dict) and "cached_tokens" in det and "prompt_tokens" in u:
        return det["cached_tokens"], u["prompt_tokens"], "usage.prompt_tokens_details"
    if "cache_n" in t and "prompt_n" in t:
        return t["cache_n"], t["cache_n"] + t["prompt_n"], "timings.cache_n"
    if "prompt_n" in t and "prompt_tokens" in u:
        return (u["prompt_tokens"] - t["prompt_n"], u["prompt_tokens"],
                "derived: usage.prompt_tokens - timings.prompt_n")
    return None


def summarise(streams, wall):
    """The replay's figures from its Streams and wall time (s): a dict of metrics."""
    n = len(streams)
    usage_tokens = [s.completion_tokens for s in streams]
    chunks = sum(s.chunks for s in streams)
    gaps = [g for s in streams for g in s.gaps()]
    cache = [c for c in (cache_figures(s) for s in streams) if c is not None]
    have_usage = all(x is not None for x in usage_tokens)
    out = {
        "requests": n,
        "requests/s": n / wall,
        "output tok/s (usage)": sum(usage_tokens) / wall if have_usage else None,
        "output tok/s (chunks)": chunks / wall,
        "TTFT p50 ms": pct([s.ttft for s in streams], 50) * 1e3,
        "TTFT p99 ms": pct([s.ttft for s in streams], 99) * 1e3,
        "inter-token p50 ms": pct(gaps, 50) * 1e3 if gaps else None,
        "inter-token p99 ms": pct(gaps, 99) * 1e3 if gaps else None,
        "prompt-cache hit": (sum(c[0] for c in cache) / sum(c[1] for c in cache)
                             if cache and sum(c[1] for c in cache) else None),
        "tokens / content chunk": (sum(usage_tokens) / chunks if have_usage and chunks
                                   else None),
        "reply tokens (mean)": (sum(usage_tokens) if have_usage else chunks) / max(1, n),
        "prompt tokens (mean)": (statistics.mean(p) if (p := [s.usage["prompt_tokens"]
                                 for s in streams if s.usage and "prompt_tokens" in s.usage])
                                 else None),
        "cache source": cache[0][2] if cache else "not reported",
        "cache reported": len(cache),
        "shapes": collections.Counter(s.shape for s in streams),
    }
    return out


def replay(server, a, plan, extra_body):
    """Runs the plan against the server: (summary dict, [Stream])."""
    streams, errors, lock = [], [], threading.Lock()
    t0 = time.monotonic()
    ends = []

    def user(u):
        system, msgs, thinks, start = plan[u]
        try:
            delay = t0 + start - time.monotonic()
            if delay > 0:
                time.sleep(delay)
            transcript = [{"role": "system", "content": system}] if system else []
            for r, m in enumerate(msgs):
                transcript.append({"role": "user", "content": m})
                body = {"model": server.model, "messages": transcript, "stream": True,
                        "max_tokens": a.reply, "temperature": 0.0,
                        "stream_options": {"include_usage": True}, **extra_body}
                s = stream_chat(server.port, body)
                transcript.append({"role": "assistant", "content": s.text})
                with lock:
                    streams.append(s)
                    ends.append(time.monotonic())
                if r < len(thinks):
                    time.sleep(thinks[r])
        except Exception as e:  # reported after the replay, which goes on
            with lock:
                errors.append(f"user {u}: {e}")

    th = [threading.Thread(target=user, args=(u,)) for u in range(len(plan))]
    for t in th:
        t.start()
    for t in th:
        t.join()
    if errors:
        raise RuntimeError(f"{server.name}: {len(errors)} users failed: " + "; ".join(errors[:3]))
    return summarise(streams, max(ends) - t0), streams


# ---- arguments ----

def parser():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--kvpd", default="build/daemon/kvpd")
    ap.add_argument("--llama-server", help="llama.cpp's server (without it: kvpd alone)")
    ap.add_argument("--model", help="the GGUF file both servers load")
    ap.add_argument("--users", type=int, default=32)
    ap.add_argument("--rounds", type=int, default=6)
    ap.add_argument("--reply", type=int, default=64, help="max_tokens of every reply")
    ap.add_argument("--system-prompts", type=int, default=3,
                    help="common system prompts the sharing users start from")
    ap.add_argument("--system-tokens", type=int, default=500,
                    help="about this many tokens per system prompt")
    ap.add_argument("--shared-share", type=float, default=0.75,
                    help="share of the users starting from a common system prompt (0-1)")
    ap.add_argument("--user-words", type=int, default=40, help="words per user message")
    ap.add_argument("--think-time", type=float, default=1.0,
                    help="seconds between a reply and the user's next message (mean)")
    ap.add_argument("--think-dist", default="exp", help="exp or fixed")
    ap.add_argument("--arrival-gap", type=float, default=0.25,
                    help="seconds between one user's first message and the next user's")
    ap.add_argument("--text", default=DEFAULT_TEXT,
                    help="text file the messages are cut from, or 'generate'")
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--threads", type=int, default=os.cpu_count() or 2,
                    help="llama-server threads")
    ap.add_argument("--slots", type=int, default=0,
                    help="llama-server parallel slots (-np; 0: one per user)")
    ap.add_argument("--ctx-per-slot", type=int, default=2048,
                    help="llama-server context per slot (-c is slots x this)")
    ap.add_argument("--kvpd-arg", action="append", default=[],
                    help="extra kvpd flag (repeatable), e.g. --kvpd-arg=--budget=0")
    ap.add_argument("--llama-arg", action="append", default=[],
                    help="extra llama-server flag (repeatable)")
    ap.add_argument("--logdir", default="/tmp")
    ap.add_argument("--self-test", action="store_true",
                    help="check the statistics and the argument checks, then exit")
    return ap


def parse_args(argv):
    """The checked arguments: a bad value exits with argparse's usage and an error
    naming the option."""
    ap = parser()
    a = ap.parse_args(argv)
    if a.self_test:
        return a
    for name in ("users", "rounds", "reply", "reps", "user_words"):
        if getattr(a, name) < 1:
            ap.error(f"--{name.replace('_', '-')} must be at least 1, not {getattr(a, name)}")
    for name in ("system_tokens", "slots", "system_prompts"):
        if getattr(a, name) < 0:
            ap.error(f"--{name.replace('_', '-')} must not be negative, not {getattr(a, name)}")
    for name in ("think_time", "arrival_gap"):
        v = getattr(a, name)
        if not math.isfinite(v) or v < 0:
            ap.error(f"--{name.replace('_', '-')} must be a finite number of seconds >= 0, not {v}")
    if a.think_dist not in ("exp", "fixed"):
        ap.error(f"--think-dist: unknown distribution {a.think_dist!r} (exp, fixed)")
    if not 0 <= a.shared_share <= 1:
        ap.error(f"--shared-share must be between 0 and 1, not {a.shared_share}")
    if a.shared_share > 0 and a.system_prompts < 1:
        ap.error("--system-prompts must be at least 1 when --shared-share is above 0")
    if a.shared_share > 0 and a.system_tokens < 1:
        ap.error("--system-tokens must be at least 1 when --shared-share is above 0")
    if a.system_prompts == 0:
        a.shared_share = 0.0
    if a.text != "generate" and not os.path.isfile(a.text):
        ap.error(f"--text: no file {a.text} (set KVP_SHARED, or --text generate)")
    if not a.model:
        ap.error("--model is required")
    if not os.path.isfile(a.model):
        ap.error(f"--model: no file {a.model}")
    for name, path in (("--kvpd", a.kvpd), ("--llama-server", a.llama_server)):
        if path is not None and not os.access(path, os.X_OK):
            ap.error(f"{name}: {path} is not an executable file")
    # The longest transcript: the system prompt, every round's message and reply, and a
    # dozen template tokens a message.
    need = (a.system_tokens if a.shared_share > 0 else 0) + a.rounds * (
        round(a.user_words * TOKENS_PER_WORD) + a.reply + 24)
    if a.llama_server and need > a.ctx_per_slot:
        ap.error(f"--ctx-per-slot {a.ctx_per_slot} is below the longest transcript "
                 f"(about {need} tokens)")
    return a


# ---- the report ----

# (metric, format, better): "higher" or "lower" is better for kvpd.
METRICS = [("requests/s", "{:.3f}", "higher"),
           ("output tok/s (usage)", "{:.1f}", "higher"),
           ("output tok/s (chunks)", "{:.1f}", "higher"),
           ("TTFT p50 ms", "{:.0f}", "lower"),
           ("TTFT p99 ms", "{:.0f}", "lower"),
           ("inter-token p50 ms", "{:.1f}", "lower"),
           ("inter-token p99 ms", "{:.1f}", "lower"),
           ("prompt-cache hit", "{:.3f}", "higher"),
           ("tokens / content chunk", "{:.2f}", "-"),
           ("reply tokens (mean)", "{:.1f}", "-"),
           ("prompt tokens (mean)", "{:.0f}", "-")]


def median_of(runs, key):
    v = [r[key] for r in runs if r[key] is not None]
    return statistics.median(v) if v else None


def fmt(f, v):
    return "not reported" if v is None else f.format(v)


def report(res, names):
    print(f"\n| metric (median of {len(res[names[0]])}) | " + " | ".join(names) +
          (" | kvpd / llama.cpp | better |" if len(names) == 2 else " |"))
    print("|---|" + "---:|" * len(names) + ("---:|---|" if len(names) == 2 else ""))
    for key, f, better in METRICS:
        meds = [median_of(res[n], key) for n in names]
        row = f"| {key} | " + " | ".join(fmt(f, m) for m in meds) + " |"
        if len(names) == 2:
            k, ll = meds
            ratio = f"**{k / ll:.2f}x**" if k is not None and ll else "-"
            row += f" {ratio} | {better} |"
        print(row)
    print()
    for n in names:
        last = res[n][-1]
        shape, count = last["shapes"].most_common(1)[0]
        print(f"{n} stream: {shape} ({count} of {last['requests']} replies in the last "
              f"repetition; {len(last['shapes'])} distinct sequences)")
        print(f"{n} prompt-cache figures: {last['cache source']} "
              f"({last['cache reported']} of {last['requests']} replies)")


def main(argv):
    a = parse_args(argv)
    if a.self_test:
        return self_test()
    texts = Texts(a.text, a.seed)
    slots = a.slots or a.users
    tag = uuid.uuid4().hex[:6]
    servers, extra_body = {}, {"kvpd": {}, "llama.cpp": {"cache_prompt": True}}
    try:
        kport = free_port()
        servers["kvpd"] = Server("kvpd", kvpd_argv(a.kvpd, a.model, kport, a.users, a.kvpd_arg),
                                 kport, "/healthz", os.path.join(a.logdir, f"multiturn-kvpd-{tag}.log"))
        if a.llama_server:
            lport = free_port()
            largv = llama_argv(a.llama_server, a.model, lport, slots, slots * a.ctx_per_slot,
                               a.threads, ["--cache-reuse", "256"] + a.llama_arg)
            servers["llama.cpp"] = Server("llama.cpp", largv, lport, "/health",
                                          os.path.join(a.logdir, f"multiturn-llama-{tag}.log"))
        for s in servers.values():
            s.wait_up()
            print(f"{s.name}: {' '.join(s.argv)}")
        names = list(servers)
        print(f"model: {a.model}\ntext: {a.text}")
        print(f"{a.users} users x {a.rounds} rounds, replies of at most {a.reply} tokens "
              f"(greedy), {round(a.shared_share * a.users)} users on {a.system_prompts} "
              f"shared system prompts of about {a.system_tokens} tokens, user messages of "
              f"{a.user_words} words, think time {a.think_dist} {a.think_time} s, arrivals "
              f"{a.arrival_gap} s apart; {a.reps} repetitions, servers alternating")
        print(f"load before: {load_avg()}", flush=True)
        for s in servers.values():   # page the weights in
            stream_chat(s.port, {"model": s.model, "max_tokens": 4, "temperature": 0.0,
                                 "stream": True, **extra_body[s.name],
                                 "messages": [{"role": "user", "content": "Hello"}]})
        res = {n: [] for n in names}
        for rep in range(a.reps):
            plan = user_plan(a, texts, uuid.uuid4().hex[:12])
            for n in (names if rep % 2 == 0 else names[::-1]):
                m, _ = replay(servers[n], a, plan, extra_body[n])
                res[n].append(m)
                print(f"  rep {rep + 1} {n:9s}: " + ", ".join(
                    f"{k} {fmt(f, m[k])}" for k, f, _ in METRICS[:8]) +
                    f"  load {load_avg()}", flush=True)
        print(f"load after: {load_avg()}")
        report(res, names)
        for n in names:
            short = median_of(res[n], "reply tokens (mean)")
            if short is not None and short < 0.9 * a.reply:
                print(f"note: {n}'s replies averaged {short:.1f} tokens, below max_tokens {a.reply}")
    finally:
        for s in servers.values():
            s.stop()
    return 0


# ---- self-test ----

def canned(lines, times):
    """A Stream fed the SSE lines (str) arriving at the given times."""
    s = Stream()
    for line, t in zip(lines, times):
        if not s.feed(line.encode() + b"\n", t):
            break
    s.end = times[-1]
    return s


def kvpd_like(cached=10, prompt=40):
    chunk = lambda d: "data: " + json.dumps({"choices": [d]})  # noqa: E731
    usage = {"prompt_tokens": prompt, "completion_tokens": 3, "total_tokens": prompt + 3,
             "prompt_tokens_details": {"cached_tokens": cached}}
    lines = [chunk({"index": 0, "delta": {"role": "assistant"}}), "",
             chunk({"index": 0, "delta": {"content": "Once"}}), "",
             chunk({"index": 0, "delta": {"content": " upon"}}), "",
             chunk({"index": 0, "delta": {"content": " a"}}), "",
             chunk({"index": 0, "delta": {}, "finish_reason": "length"}), "",
             "data: " + json.dumps({"choices": [], "usage": usage, "kvpd": {"prefilled_tokens": 30}}),
             "", "data: [DONE]"]
    times = [0.10, 0.10, 0.20, 0.20, 0.25, 0.25, 0.45, 0.45, 0.46, 0.46, 0.47, 0.47, 0.48]
    return canned(lines, times)


def llama_like(timings):
    chunk = lambda d, **k: "data: " + json.dumps({"choices": [d], **k})  # noqa: E731
    lines = [chunk({"index": 0, "delta": {"content": "ab"}}),
             chunk({"index": 0, "delta": {"content": "c"}}),
             chunk({"index": 0, "delta": {}, "finish_reason": "length"},
                   usage={"prompt_tokens": 34, "completion_tokens": 3, "total_tokens": 37},
                   timings=timings),
             "data: [DONE]"]
    return canned(lines, [1.0, 1.5, 1.6, 1.7])


class SelfTest(unittest.TestCase):
    def test_percentiles(self):
        v = list(range(1, 101))
        self.assertAlmostEqual(pct(v, 50), 50.5)
        self.assertAlmostEqual(pct(v, 99), 99.01)
        self.assertEqual(pct([7], 99), 7)
        self.assertEqual(pct([3, 1, 2], 0), 1)
        self.assertTrue(math.isnan(pct([], 50)))

    def test_kvpd_stream(self):
        s = kvpd_like()
        self.assertEqual(s.text, "Once upon a")
        self.assertEqual(s.chunks, 3)
        self.assertEqual(s.completion_tokens, 3)
        self.assertAlmostEqual(s.ttft, 0.20)
        for g, want in zip(s.gaps(), [0.05, 0.20]):
            self.assertAlmostEqual(g, want)
        self.assertEqual(s.shape, "role, content x3, finish, usage, [DONE]")
        self.assertEqual(s.kvpd, {"prefilled_tokens": 30})
        self.assertEqual(cache_figures(s), (10, 40, "usage.prompt_tokens_details"))

    def test_llama_stream_and_cache_sources(self):
        s = llama_like({"prompt_n": 4, "predicted_n": 3})
        self.assertEqual(s.chunks, 2)          # one chunk carried two tokens
        self.assertEqual(s.completion_tokens, 3)
        self.assertEqual(s.shape, "content x2, finish+usage+timings, [DONE]")
        self.assertEqual(cache_figures(s)[:2], (30, 34))
        self.assertTrue(cache_figures(s)[2].startswith("derived"))
        s = llama_like({"prompt_n": 4, "cache_n": 20})
        self.assertEqual(cache_figures(s), (20, 24, "timings.cache_n"))
        self.assertIsNone(cache_figures(llama_like(None)))

    def test_summary(self):
        streams = [kvpd_like(10, 40), kvpd_like(30, 60), llama_like(None)]
        m = summarise(streams, 2.0)
        self.assertAlmostEqual(m["requests/s"], 1.5)
        self.assertAlmostEqual(m["output tok/s (usage)"], 9 / 2.0)
        self.assertAlmostEqual(m["output tok/s (chunks)"], 8 / 2.0)
        self.assertAlmostEqual(m["tokens / content chunk"], 9 / 8)
        # the reply without cache figures counts in neither sum
        self.assertAlmostEqual(m["prompt-cache hit"], 40 / 100)
        self.assertEqual(m["cache reported"], 2)
        self.assertAlmostEqual(m["TTFT p50 ms"], 200)
        self.assertAlmostEqual(m["prompt tokens (mean)"], (40 + 60 + 34) / 3)
        self.assertAlmostEqual(m["inter-token p99 ms"], pct([0.05, 0.2] * 2 + [0.5], 99) * 1e3)
        none = summarise([llama_like(None)], 1.0)
        self.assertIsNone(none["prompt-cache hit"])
        self.assertEqual(none["cache source"], "not reported")

    def test_bad_chunk_is_named(self):
        with self.assertRaisesRegex(RuntimeError, "not JSON"):
            canned(["data: {\"choices\": [", "data: [DONE]"], [0.1, 0.2])
        with self.assertRaisesRegex(RuntimeError, "not a JSON object"):
            canned(["data: [1, 2]"], [0.1])

    def test_think_times(self):
        rng = random.Random(5)
        self.assertEqual(think_time(rng, "fixed", 2.5), 2.5)
        self.assertEqual(think_time(rng, "exp", 0), 0)
        v = [think_time(rng, "exp", 2.0) for _ in range(4000)]
        self.assertTrue(all(x >= 0 for x in v))
        self.assertLess(abs(statistics.mean(v) - 2.0), 0.2)
        self.assertGreater(statistics.pstdev(v), 1.5)    # exponential: sd = mean

    def test_plan(self):
        a = parse_args(["--model", __file__, "--kvpd", sys.executable, "--text", "generate", "--users", "8",
                        "--rounds", "3", "--shared-share", "0.5", "--system-prompts", "2",
                        "--system-tokens", "120", "--user-words", "10"])
        texts = Texts("generate", 1)
        p1, p2 = user_plan(a, texts, "n1"), user_plan(a, texts, "n1")
        self.assertEqual(p1, p2)
        self.assertEqual(p1[0][0], p1[2][0])                 # users 0 and 2 share prompt 1
        self.assertNotEqual(p1[0][0], p1[1][0])
        self.assertIsNone(p1[4][0])                          # past the share: none
        self.assertEqual(len(p1[3][1]), 3)
        self.assertEqual(len(p1[3][2]), 2)
        self.assertEqual(len(p1[0][0].split()), 12 + 100)   # preamble + 120 / 1.2 words
        self.assertNotEqual(user_plan(a, texts, "n2")[0][0], p1[0][0])

    def test_bad_arguments(self):
        base = ["--model", __file__, "--kvpd", sys.executable, "--text", "generate"]
        cases = [(["--users", "0"], "--users must be at least 1"),
                 (["--rounds", "x"], "--rounds: invalid int value"),
                 (["--reply", "-3"], "--reply must be at least 1"),
                 (["--think-dist", "gauss"], "--think-dist: unknown distribution 'gauss'"),
                 (["--think-time", "nan"], "--think-time must be a finite"),
                 (["--arrival-gap", "-1"], "--arrival-gap must be a finite"),
                 (["--shared-share", "1.5"], "--shared-share must be between 0 and 1"),
                 (["--system-prompts", "-1"], "--system-prompts must not be negative"),
                 (["--system-tokens", "0"], "--system-tokens must be at least 1 when"),
                 (["--text", "/nonexistent/x.txt"], "--text: no file /nonexistent/x.txt"),
                 (["--model", "/nonexistent/m.gguf"], "--model: no file"),
                 (["--kvpd", __file__ + ".missing"], "--kvpd: "),
                 (["--llama-server", os.devnull], "--llama-server: /dev/null is not an executable"),
                 ]
        for extra, msg in cases:
            err = io.StringIO()
            with self.subTest(extra=extra), contextlib.redirect_stderr(err):
                with self.assertRaises(SystemExit) as cm:
                    parse_args(base + extra)
                self.assertEqual(cm.exception.code, 2)
                self.assertIn(msg, err.getvalue())
        err = io.StringIO()
        with contextlib.redirect_stderr(err), self.assertRaises(SystemExit):
            parse_args(["--text", "generate"])
        self.assertIn("--model is required", err.getvalue())
        err = io.StringIO()
        with contextlib.redirect_stderr(err), self.assertRaises(SystemExit):
            parse_args(base + ["--llama-server", sys.executable, "--ctx-per-slot", "100"])
        self.assertIn("--ctx-per-slot 100 is below the longest transcript", err.getvalue())


def self_test():
    suite = unittest.defaultTestLoader.loadTestsFromTestCase(SelfTest)
    ok = unittest.TextTestRunner(verbosity=2).run(suite).wasSuccessful()
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
