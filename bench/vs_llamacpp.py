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
summed over all replies, over the wall time of the load) and the time to first token
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
import http.client
import json
import os
import socket
import statistics
import subprocess
import sys
import threading
import time
import uuid


def free_port():
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    return port


def get_json(port, path, timeout=5):
    c = http.client.HTTPConnection("127.0.0.1", port, timeout=timeout)
    try:
        c.request("GET", path)
        r = c.getresponse()
        body = r.read()
        return r.status, (json.loads(body) if body else None)
    finally:
        c.close()


class Server:
    def __init__(self, name, argv, port, health, log):
        self.name, self.port, self.health = name, port, health
        self.log = open(log, "wb")
        self.proc = subprocess.Popen(argv, stdout=self.log, stderr=subprocess.STDOUT)
        self.model = None

    def wait_up(self, timeout=300):
        end = time.time() + timeout
        while time.time() < end:
            if self.proc.poll() is not None:
                raise RuntimeError(f"{self.name} exited with {self.proc.returncode} "
                                   f"(log: {self.log.name})")
            try:
                st, _ = get_json(self.port, self.health)
                if st == 200:
                    st, models = get_json(self.port, "/v1/models")
                    if st == 200 and models and models.get("data"):
                        self.model = models["data"][0]["id"]
                        return
            except (OSError, http.client.HTTPException, ValueError):
                pass
            time.sleep(0.2)
        raise RuntimeError(f"{self.name} did not answer {self.health} in {timeout} s")

    def stop(self):
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(15)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self.log.close()


def stream_turn(port, body, meta=None):
    """POSTs one streamed chat completion: (reply text, completion tokens, ttft s).
    meta (a dict): gets the usage chunk's "usage" and, from kvpd, its "kvpd" figures."""
    c = http.client.HTTPConnection("127.0.0.1", port, timeout=600)
    t0 = time.monotonic()
    ttft, text, chunks, usage = None, [], 0, None
    try:
        c.request("POST", "/v1/chat/completions", body=json.dumps(body),
                  headers={"Content-Type": "application/json"})
        r = c.getresponse()
        if r.status != 200:
            raise RuntimeError(f"HTTP {r.status}: {r.read()[:300]!r}")
        while True:
            line = r.readline()
            if not line:
                break
            line = line.strip()
            if not line.startswith(b"data:"):
                continue
            data = line[5:].strip()
            if data == b"[DONE]":
                break
            ev = json.loads(data)
            if ev.get("usage"):
                usage = ev["usage"]
                if meta is not None:
                    meta["usage"], meta["kvpd"] = usage, ev.get("kvpd")
            for ch in ev.get("choices") or []:
                piece = (ch.get("delta") or {}).get("content")
                if piece:
                    if ttft is None:
                        ttft = time.monotonic() - t0
                    text.append(piece)
                    chunks += 1
    finally:
        c.close()
    n = usage.get("completion_tokens", chunks) if usage else chunks
    return "".join(text), n, (ttft if ttft is not None else time.monotonic() - t0)


def run_at_once(fn, n):
    """fn(0) .. fn(n - 1), each on its own thread, all started at once: the wall time (s)
    until the last returns."""
    th = [threading.Thread(target=fn, args=(i,)) for i in range(n)]
    t0 = time.monotonic()
    for t in th:
        t.start()
    for t in th:
        t.join()
    return time.monotonic() - t0


def run_load(server, conversations, reply, sampled, turns, sampled_extra=None):
    """One load on one server: (aggregate tok/s, [ttft s], mean tokens per reply)."""
    nonce = uuid.uuid4().hex[:12]
    sampled_extra = sampled_extra or {}
    ttfts, tokens, errors = [], [], []
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
                text, n, ttft = stream_turn(server.port, body)
                msgs.append({"role": "assistant", "content": text})
                with lock:
                    ttfts.append(ttft)
                    tokens.append(n)
        except Exception as e:  # reported after the load, which goes on
            with lock:
                errors.append(f"conversation {i}: {e}")

    wall = run_at_once(conversation, conversations)
    if errors:
        raise RuntimeError(f"{server.name}: " + "; ".join(errors[:3]))
    return sum(tokens) / wall, ttfts, sum(tokens) / max(1, len(tokens))


def pct(v, p):
    v = sorted(v)
    if not v:
        return float("nan")
    k = (len(v) - 1) * p / 100
    lo = int(k)
    hi = min(lo + 1, len(v) - 1)
    return v[lo] + (v[hi] - v[lo]) * (k - lo)


def load_avg():
    with open("/proc/loadavg") as f:
        return " ".join(f.read().split()[:3])


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
    largv = [a.llama_server, "-m", a.model, "-np", str(slots), "-c",
             str(slots * a.ctx_per_slot), "-t", str(a.threads), "--port", str(lport),
             "--host", "127.0.0.1", "-cb"]
    kargv = [a.kvpd, "--model", a.model, "--listen", f"127.0.0.1:{kport}",
             "--state-dir", "", "--max-sessions", str(max(64, slots)),
             "--max-sessions-per-connection", str(max(8, slots))]
    for x in a.kvpd_arg:
        kargv += x.split("=", 1) if x.startswith("--") and "=" in x else [x]
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
                            tok_s, tt, mean_n = run_load(servers[name], n, reply,
                                                         mode == "sampled", a.turns, extra)
                            res[name].append((tok_s, pct(tt, 50), pct(tt, 99), mean_n))
                            print(f"  {n:2d} conv {mode:7s} {reply:3d} tok  rep {rep + 1} "
                                  f"{name:5s}: {tok_s:7.1f} tok/s  TTFT p50 "
                                  f"{pct(tt, 50) * 1e3:7.0f} ms p99 {pct(tt, 99) * 1e3:7.0f} ms"
                                  f"  {mean_n:5.1f} tok/reply  load {load_avg()}", flush=True)
                    med = {k: [statistics.median(x[i] for x in v) for i in range(4)]
                           for k, v in res.items()}
                    rows.append((n, mode, reply, med))
        print(f"\nload average after: {load_avg()}\n")
        print("| conversations | sampling | reply tokens | llama tok/s | kvpd tok/s | "
              "kvpd / llama | llama TTFT p50 / p99 ms | kvpd TTFT p50 / p99 ms | "
              "TTFT p99 kvpd / llama |")
        print("|---:|---|---:|---:|---:|---:|---:|---:|---:|")
        for n, mode, reply, med in rows:
            l, k = med["llama"], med["kvpd"]
            samp = "greedy" if mode == "greedy" else "T 0.8, top-p 0.9"
            print(f"| {n} | {samp} | {reply} | {l[0]:.1f} | {k[0]:.1f} | "
                  f"**{k[0] / l[0]:.2f}x** | {l[1] * 1e3:.0f} / {l[2] * 1e3:.0f} | "
                  f"{k[1] * 1e3:.0f} / {k[2] * 1e3:.0f} | {k[2] / l[2]:.2f}x |")
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
