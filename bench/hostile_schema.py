#!/usr/bin/env python3
"""What constrained requests built for the most mask work cost another client's stream.

    bench/hostile_schema.py --kvpd build/daemon/kvpd --model FILE.gguf
                            [--attackers 4] [--victim-tokens 99] [--reps 5]
                            [--kvpd-arg=--threads=2 ...]

Starts one kvpd on the model and, per repetition, streams one plain reply of
--victim-tokens tokens (greedy, a fresh prompt) three times: alone; while --attackers
clients keep sending the same requests without a schema (busy: the cost of sharing the
steps at all); and while they keep sending `json_schema` requests whose schemas make
the grammar's closure and the mask's vocabulary walk do the most work the compiler's
limits allow (attacked: the shapes of tests/model/test_grammar.c's hostile schemas).
The order of the three rotates from one repetition to the next. Printed: the victim's
milliseconds per reply token (wall time of the request over its completion tokens,
TTFT included) in each, medians over the repetitions, the ratios attacked / busy (what
the schemas add) and attacked / alone, and the other clients' tokens/s. The load
average is printed before and after. Python 3 standard library only.
"""
import argparse
import json
import os
import statistics
import sys
import threading
import time
import uuid

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from oai_bench import Server, free_port, load_avg, stream_turn  # noqa: E402


def hostile_schemas():
    """Schemas of the shapes the mask budget is tested on (tests/model/test_grammar.c)."""
    out = []
    # many strings alive at once, each a distinct path of states
    out.append({"anyOf": [{"type": "string", "maxLength": 20 + i} for i in range(130)]})
    # many optional properties whose keys share a prefix
    out.append({"type": "object",
                "properties": {f"property_{i:03d}": {"type": "integer"} for i in range(600)}})
    # any value, many alternatives deep inside nested arrays
    out.append({"anyOf": [{"type": "array", "maxItems": 3 + i % 5} for i in range(256)]})
    # an ambiguous pattern, alternatives of it
    out.append({"anyOf": [{"type": "string",
                           "pattern": "^(a|ab|b|ba|[ab]{1,3})+" + chr(ord("c") + i % 20) + "?$"}
                          for i in range(100)]})
    # objects nested through anyOf, each level with optional properties
    alts = [{"type": "object", "properties": {f"k{i}": {"$ref": "#/$defs/o"},
                                              "k": {"$ref": "#/$defs/o"}}} for i in range(40)]
    out.append({"$defs": {"o": {"anyOf": alts}}, "$ref": "#/$defs/o"})
    return out


def victim(port, model, tokens):
    """One plain streamed reply: ms per completion token over the whole request."""
    body = {"model": model, "stream": True, "max_tokens": tokens, "temperature": 0.0,
            "stream_options": {"include_usage": True},
            "messages": [{"role": "user", "content":
                          f"[{uuid.uuid4().hex[:12]}] Tell me a long story about a river."}]}
    t0 = time.monotonic()
    _, n, _ = stream_turn(port, body)
    return (time.monotonic() - t0) * 1000.0 / max(1, n), n


def attack(port, model, schemas, stop, counts, errors, i):
    k = 0
    while not stop.is_set():
        schema = schemas[(i + k) % len(schemas)]
        k += 1
        body = {"model": model, "stream": True, "max_tokens": 400, "temperature": 1.0,
                "stream_options": {"include_usage": True},
                "messages": [{"role": "user", "content": f"[{uuid.uuid4().hex[:8]}] JSON."}]}
        if schema is not None:
            body["response_format"] = {"type": "json_schema",
                                       "json_schema": {"name": "h", "schema": schema}}
        try:
            _, n, _ = stream_turn(port, body)
            counts[i] += n
        except Exception as e:  # reported after the run
            errors.append(str(e))
            time.sleep(0.2)


def attacked(port, model, tokens, n_attackers, schemas):
    stop, errors = threading.Event(), []
    counts = [0] * n_attackers
    th = [threading.Thread(target=attack, args=(port, model, schemas, stop, counts, errors, i))
          for i in range(n_attackers)]
    t0 = time.monotonic()
    for t in th:
        t.start()
    time.sleep(0.5)   # the attackers' requests are in their constrained replies
    ms, n = victim(port, model, tokens)
    stop.set()
    for t in th:
        t.join()
    wall = time.monotonic() - t0
    if errors:
        raise RuntimeError("attacker: " + "; ".join(errors[:3]))
    return ms, n, sum(counts) / wall


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--kvpd", default="build/daemon/kvpd")
    ap.add_argument("--model", required=True)
    ap.add_argument("--attackers", type=int, default=4)
    ap.add_argument("--victim-tokens", type=int, default=99)
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--logdir", default="/tmp")
    ap.add_argument("--kvpd-arg", action="append", default=[])
    a = ap.parse_args()
    if a.attackers < 1 or a.victim_tokens < 1 or a.reps < 1:
        ap.error("--attackers, --victim-tokens and --reps must be at least 1")
    if not os.path.isfile(a.model):
        ap.error(f"--model: no such file {a.model}")
    port = free_port()
    argv = [a.kvpd, "--model", a.model, "--listen", f"127.0.0.1:{port}", "--state-dir", "",
            "--max-sessions-per-connection", str(a.attackers + 2)]
    for x in a.kvpd_arg:
        argv += x.split("=", 1) if x.startswith("--") and "=" in x else [x]
    schemas = hostile_schemas()
    srv = Server("kvpd", argv, port, "/healthz",
                 os.path.join(a.logdir, f"hostile-kvpd-{uuid.uuid4().hex[:6]}.log"))
    try:
        srv.wait_up()
        print(f"model: {a.model}")
        print(f"kvpd: {' '.join(argv)}")
        print(f"load before: {load_avg()}")
        victim(port, srv.model, 8)   # warm up
        kinds = ("alone", "busy", "attacked")
        ms_of = {k: [] for k in kinds}
        rate_of = {k: [] for k in kinds}
        for r in range(a.reps):
            for what in kinds[r % 3:] + kinds[:r % 3]:
                if what == "alone":
                    ms, n = victim(port, srv.model, a.victim_tokens)
                else:
                    ms, n, rate = attacked(port, srv.model, a.victim_tokens, a.attackers,
                                           schemas if what == "attacked" else [None])
                    rate_of[what].append(rate)
                ms_of[what].append(ms)
                print(f"  rep {r + 1} {what:8s}: {ms:7.2f} ms/token over {n} tokens",
                      flush=True)
        med = {k: statistics.median(v) for k, v in ms_of.items()}
        print(f"victim alone:    {med['alone']:.2f} ms/token (medians of {a.reps})")
        print(f"victim busy:     {med['busy']:.2f} ms/token beside {a.attackers} plain "
              f"clients ({statistics.median(rate_of['busy']):.1f} tok/s among them)")
        print(f"victim attacked: {med['attacked']:.2f} ms/token beside {a.attackers} hostile "
              f"json_schema clients ({statistics.median(rate_of['attacked']):.1f} tok/s "
              f"among them)")
        print(f"ratio attacked / busy: {med['attacked'] / med['busy']:.2f}")
        print(f"ratio attacked / alone: {med['attacked'] / med['alone']:.2f}")
        print(f"load after: {load_avg()}")
    finally:
        srv.stop()


if __name__ == "__main__":
    main()
