"""Helpers shared by the Python benchmarks (vs_llamacpp.py, prefix_reuse.py,
multiturn.py): servers started on free loopback ports, a streamed OpenAI chat
completion read chunk by chunk, percentiles and the load average. Python 3 standard
library only.
"""
import http.client
import json
import socket
import subprocess
import threading
import time


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


def split_flags(flags):
    """["--budget=0", "-x"] -> ["--budget", "0", "-x"]: the extra flags given as
    --kvpd-arg=--name=value, split at their first '='."""
    out = []
    for x in flags:
        out += x.split("=", 1) if x.startswith("--") and "=" in x else [x]
    return out


def kvpd_argv(kvpd, model, port, sessions, extra=()):
    """kvpd on the loopback port without a state directory, room for `sessions` resident
    sessions (and as many started from one connection), then the extra flags."""
    return [kvpd, "--model", model, "--listen", f"127.0.0.1:{port}", "--state-dir", "",
            "--max-sessions", str(max(64, sessions)),
            "--max-sessions-per-connection", str(max(8, sessions))] + split_flags(extra)


def llama_argv(server, model, port, slots, ctx, threads, extra=()):
    """llama.cpp's server with `slots` parallel slots sharing a `ctx`-token context,
    continuous batching, then the extra flags."""
    return [server, "-m", model, "-np", str(slots), "-c", str(ctx), "-t", str(threads),
            "--port", str(port), "--host", "127.0.0.1", "-cb"] + split_flags(extra)


class Server:
    def __init__(self, name, argv, port, health, log):
        self.name, self.port, self.health, self.argv = name, port, health, argv
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


class Stream:
    """One streamed chat completion as the client saw it. Times are seconds since the
    request was sent.
      text           the content pieces joined
      content_times  when each chunk carrying content arrived
      usage          the last chunk's "usage" (None when no chunk had one)
      timings        the last "timings" object (llama.cpp's server), or None
      kvpd           the usage chunk's "kvpd" figures (kvpd), or None
      shape          the chunks in order, runs of a kind collapsed: e.g.
                     "role, content x64, finish, usage, [DONE]"
      end            when the stream ended
    """

    def __init__(self):
        self.text_parts, self.content_times = [], []
        self.usage = self.timings = self.kvpd = None
        self.kinds = []
        self.end = None

    @property
    def text(self):
        return "".join(self.text_parts)

    @property
    def ttft(self):
        return self.content_times[0] if self.content_times else self.end

    @property
    def chunks(self):
        return len(self.content_times)

    def gaps(self):
        """The inter-token latencies: the time between successive content chunks."""
        t = self.content_times
        return [b - a for a, b in zip(t, t[1:])]

    @property
    def completion_tokens(self):
        """usage.completion_tokens, or None when the server sent no usage."""
        if self.usage is None or "completion_tokens" not in self.usage:
            return None
        return self.usage["completion_tokens"]

    @property
    def shape(self):
        runs = []
        for k in self.kinds:
            if runs and runs[-1][0] == k:
                runs[-1][1] += 1
            else:
                runs.append([k, 1])
        return ", ".join(k if n == 1 else f"{k} x{n}" for k, n in runs)

    def feed(self, line, t):
        """One line of the SSE body that arrived at t; False after data: [DONE]."""
        line = line.strip()
        if not line.startswith(b"data:"):
            return True
        data = line[5:].strip()
        if data == b"[DONE]":
            self.kinds.append("[DONE]")
            return False
        try:
            ev = json.loads(data)
        except ValueError as e:
            raise RuntimeError(f"a stream chunk is not JSON ({e}): {data[:120]!r}")
        if not isinstance(ev, dict):
            raise RuntimeError(f"a stream chunk is not a JSON object: {data[:120]!r}")
        kind = []
        for ch in ev.get("choices") or []:
            delta = ch.get("delta") or {}
            piece = delta.get("content")
            if delta.get("role") and not piece:
                kind.append("role")
            if piece:
                self.text_parts.append(piece)
                self.content_times.append(t)
                kind.append("content")
            if ch.get("finish_reason"):
                kind.append("finish")
        if ev.get("usage"):
            self.usage = ev["usage"]
            self.kvpd = ev.get("kvpd")
            kind.append("usage")
        if ev.get("timings"):
            self.timings = ev["timings"]
            kind.append("timings")
        self.kinds.append("+".join(kind) or "empty")
        return True


def stream_chat(port, body, timeout=600):
    """POSTs one streamed chat completion to the loopback port: its Stream."""
    c = http.client.HTTPConnection("127.0.0.1", port, timeout=timeout)
    s = Stream()
    t0 = time.monotonic()
    try:
        c.request("POST", "/v1/chat/completions", body=json.dumps(body),
                  headers={"Content-Type": "application/json"})
        r = c.getresponse()
        if r.status != 200:
            raise RuntimeError(f"HTTP {r.status}: {r.read()[:300]!r}")
        while True:
            line = r.readline()
            if not line or not s.feed(line, time.monotonic() - t0):
                break
    finally:
        c.close()
    s.end = time.monotonic() - t0
    return s


def stream_turn(port, body, meta=None):
    """stream_chat reduced to (reply text, completion tokens, ttft s): the tokens are
    usage.completion_tokens, or the content chunks when the server sent no usage.
    meta (a dict): gets the usage chunk's "usage" and, from kvpd, its "kvpd" figures."""
    s = stream_chat(port, body)
    if meta is not None and s.usage is not None:
        meta["usage"], meta["kvpd"] = s.usage, s.kvpd
    n = s.completion_tokens
    return s.text, (s.chunks if n is None else n), s.ttft


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


def pct(v, p):
    """The p-th percentile of v, interpolated between the two nearest ranks (NaN when
    v is empty)."""
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
