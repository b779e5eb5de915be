#!/usr/bin/env python3
"""Counts the cells where kvp is the lowest non-oracle policy in kvp eval's results.csv files.

  scripts/eval-cells.py LABEL=DIR/results.csv [LABEL=...]

A cell is (protocol, metric, budget) for ranking cost, one-shot KL, streaming KL and
replies KL at budgets 32..256; oracle and none are left out. Prints one line per cell,
kvp's value, the best other policy's, WON or LOST, then the totals.
"""
import csv
import sys

CELLS = [("ranking", "cost"), ("oneshot", "kl"), ("streaming", "kl"), ("replies", "kl")]
BUDGETS = ("32", "64", "128", "256")
LEFT_OUT = {"oracle", "none"}


def main(args):
    if not args or any("=" not in a for a in args):
        print(__doc__.strip(), file=sys.stderr)
        return 2
    won = lost = 0
    for arg in args:
        label, path = arg.split("=", 1)
        vals = {}
        with open(path, encoding="utf-8") as f:
            for r in csv.DictReader(f):
                vals[(r["protocol"], r["metric"], r["budget"], r["policy"])] = float(r["value"])
        for (p, m, b, pol), v in sorted(vals.items()):
            if m == "cc_ratio" and pol != "oracle":
                print(f"{label} C/C* {pol} {v:.3f}")
        for p, m in CELLS:
            for b in BUDGETS:
                cell = {pol: v for (pp, mm, bb, pol), v in vals.items()
                        if (pp, mm, bb) == (p, m, b) and pol not in LEFT_OUT}
                if "kvp" not in cell or len(cell) < 2:
                    continue
                best = min((k for k in cell if k != "kvp"), key=cell.get)
                ok = cell["kvp"] <= cell[best]
                won += ok
                lost += not ok
                print(f"{label} {p} {m} b={b} kvp={cell['kvp']:.5f} "
                      f"{best}={cell[best]:.5f} {'WON' if ok else 'LOST'}")
    print(f"won {won} lost {lost}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
