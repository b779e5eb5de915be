#!/usr/bin/env python3
"""The decode roofline: bytes a decode step reads per second over the machine's
measured streaming read bandwidth, at 1 and N sequences, for each model given.

    bench/roofline.py --model A.gguf [--model B.gguf ...] [--sequences 1,16]
                      [--steps 128] [--reps 3] [--kvp build/tools/kvp]
                      [--bandwidth build/bench/bench_bandwidth]

Each repetition runs, in turn, bench_bandwidth (read and triad, 1 thread and all CPUs,
256 MiB, best of 3) and then `kvp generate --parallel N --ignore-eos --kv-type q8_0`
(greedy, a short prompt, --steps tokens) for every model and N, so the bandwidth and
the decode rates of a repetition come from the same few seconds of a shared machine.
A step of N sequences reads the weights once (bench_bandwidth's weight_bytes: every
matrix in its file type, the output matrix, the norms) and each sequence's K and V rows
(q8_0) over its mean context during the decode (prompt + steps / 2); so

    GB/s = (weight_bytes + N x kv_bytes_per_token x mean context) x (tok/s / N)
    fraction = GB/s / read bandwidth on all CPUs (the decode runs on all of them)

Printed: each repetition, then the medians of the per-repetition fractions. Python 3
standard library only.
"""
import argparse
import os
import re
import statistics
import subprocess
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from oai_bench import load_avg  # noqa: E402

PROMPT = "Once upon a time there was a lighthouse"


def bandwidth(tool, model=None):
    argv = [tool, "--mib", "256", "--reps", "3"] + (["--model", model] if model else [])
    p = subprocess.run(argv, capture_output=True, text=True, timeout=600)
    if p.returncode != 0:
        raise RuntimeError(f"bench_bandwidth failed: {p.stderr[-300:]}")
    return {k: float(v) for k, v in (ln.split() for ln in p.stdout.splitlines())}


def generate(kvp, model, n, steps):
    argv = [kvp, "generate", "--model", model, "--prompt", PROMPT, "--steps", str(steps),
            "--ignore-eos", "--kv-type", "q8_0", "--temperature", "0", "--seed", "1",
            "--parallel", str(n)]
    p = subprocess.run(argv, capture_output=True, timeout=900)
    err = p.stderr.decode("utf-8", "replace")
    if p.returncode != 0:
        raise RuntimeError(f"kvp generate failed: {err[-300:]}")
    m = re.search(r"prefill: (\d+) tokens, [0-9.]+ tok/s; decode: (\d+) tokens, ([0-9.]+) tok/s",
                  err)
    if not m:
        raise RuntimeError(f"kvp generate printed no decode line: {err[-300:]}")
    return float(m.group(3)), int(m.group(1)) // n, int(m.group(2)) // n


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--model", action="append", required=True)
    ap.add_argument("--sequences", default="1,16")
    ap.add_argument("--steps", type=int, default=128)
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--kvp", default="build/tools/kvp")
    ap.add_argument("--bandwidth", default="build/bench/bench_bandwidth")
    a = ap.parse_args()
    seqs = [int(x) for x in a.sequences.split(",")]
    shape = {m: bandwidth(a.bandwidth, m) for m in a.model}
    print(f"load average before: {load_avg()}")
    for m in a.model:
        print(f"{os.path.basename(m)}: weight_bytes {shape[m]['weight_bytes']:.0f}, "
              f"kv_bytes_per_token {shape[m]['kv_bytes_per_token']:.0f}")
    runs = {}
    bws = []
    for rep in range(a.reps):
        bw = bandwidth(a.bandwidth)
        bws.append(bw)
        cpus = max(int(k.rsplit("_", 1)[1]) for k in bw if k.startswith("read_gbs_"))
        read = bw[f"read_gbs_{cpus}"] * 1e9
        print(f"rep {rep + 1}: read {bw['read_gbs_1']:.2f} / {read / 1e9:.2f} GB/s (1 / "
              f"{cpus} threads), triad {bw['triad_gbs_1']:.2f} / {bw[f'triad_gbs_{cpus}']:.2f}"
              f"  load {load_avg()}", flush=True)
        order = a.model if rep % 2 == 0 else a.model[::-1]
        for m in order:
            for n in seqs:
                tps, n_prompt, n_dec = generate(a.kvp, m, n, a.steps)
                ctx = n_prompt + n_dec / 2
                wb, kvb = shape[m]["weight_bytes"], shape[m]["kv_bytes_per_token"]
                gbs = (wb + n * kvb * ctx) * tps / n
                runs.setdefault((m, n), []).append((tps, gbs, gbs / read))
                print(f"  {os.path.basename(m)} x{n}: {tps:7.1f} tok/s, {gbs / 1e9:6.2f} GB/s, "
                      f"{gbs / read:.2f} of read  load {load_avg()}", flush=True)
    print(f"\nload average after: {load_avg()}\n")
    med = {k: statistics.median(b[k] for b in bws) for k in bws[0]}
    print("bandwidth medians: " + ", ".join(f"{k} {v:.2f}" for k, v in sorted(med.items())))
    print("\n| model | sequences | weight MB | KV bytes / token of context | decode tok/s "
          "| GB/s read | fraction of read bandwidth |")
    print("|---|---:|---:|---:|---:|---:|---:|")
    for m in a.model:
        for n in seqs:
            r = runs[(m, n)]
            print(f"| {os.path.basename(m)} | {n} | {shape[m]['weight_bytes'] / 1e6:.0f} | "
                  f"{shape[m]['kv_bytes_per_token']:.0f} | "
                  f"{statistics.median(x[0] for x in r):.1f} | "
                  f"{statistics.median(x[1] for x in r) / 1e9:.2f} | "
                  f"**{statistics.median(x[2] for x in r):.2f}** |")


if __name__ == "__main__":
    sys.exit(main())
