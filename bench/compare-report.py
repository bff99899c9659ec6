#!/usr/bin/env python3
"""The report of bench/compare.sh: per (device, phase, block size), build A's and build B's
medians over the rounds, and B over A as the median of the per-round ratios (each round ran
both builds back to back) with their range. Usage: python3 bench/compare-report.py OUT

Rows are `ctxpod bench --json` lines of OUT/round<r>-<A|B>.jsonl; run 0 (the machine's
limits, measured by each build before its node runs) is reported too, as a check that the
two builds saw the same machine.
"""
import glob
import json
import os
import re
import statistics
import sys


def load(out):
    """{(device, what, size): {arm: {round: [row, ...]}}} and the rounds seen."""
    rows, rounds = {}, set()
    for path in sorted(glob.glob(os.path.join(out, "round*-*.jsonl"))):
        m = re.match(r"round(\d+)-([AB])\.jsonl$", os.path.basename(path))
        if not m:
            continue
        rnd, arm = int(m.group(1)), m.group(2)
        rounds.add(rnd)
        for line in open(path):
            r = json.loads(line)
            ident = (r["device"], r["what"], r["size"])
            rows.setdefault(ident, {}).setdefault(arm, {}).setdefault(rnd, []).append(r)
    return rows, sorted(rounds)


def per_round(by_round, key):
    """{round: median of `key` over that round's runs} (rounds where it is known)."""
    got = {}
    for rnd, rs in by_round.items():
        vals = [r[key] for r in rs if r.get(key) is not None]
        if vals:
            got[rnd] = statistics.median(vals)
    return got


def cell(a, b, key, digits):
    """A's median, B's median, and B/A: median of the paired per-round ratios [min–max]."""
    pa, pb = per_round(a, key), per_round(b, key)
    if not pa or not pb:
        return ["", "", ""]
    ma, mb = statistics.median(pa.values()), statistics.median(pb.values())
    ratios = [pb[r] / pa[r] for r in pa if r in pb and pa[r] > 0]
    if not ratios:
        return [f"{ma:.{digits}f}", f"{mb:.{digits}f}", ""]
    ratio = f"{statistics.median(ratios):.3f}"
    if len(ratios) > 1:
        ratio += f" [{min(ratios):.2f}–{max(ratios):.2f}]"
    return [f"{ma:.{digits}f}", f"{mb:.{digits}f}", ratio]


def size(n):
    for unit, b in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if n >= b and n % b == 0:
            return f"{n // b}{unit}"
    return f"{n}B"


def main():
    out = sys.argv[1] if len(sys.argv) > 1 else "/tmp/ctxpod-compare"
    rows, rounds = load(out)
    if not rows:
        sys.exit(f"compare-report: no round*-A.jsonl / round*-B.jsonl in {out}")
    print(f"{len(rounds)} rounds; B/A is the median of the per-round ratios [their range].")
    print()
    print("| device | what | block | A GB/s | B GB/s | B/A GB/s | A node CPU s/GiB | B node CPU s/GiB | "
          "B/A node CPU | A, B node CPU / floor | B/A client CPU | A p99 ms | B p99 ms | B/A p99 |")
    print("|---" * 14 + "|")
    for (device, what, sz), arms in rows.items():
        a, b = arms.get("A", {}), arms.get("B", {})
        floor = cell(a, b, "node_cpu_of_floor", 1)
        floor = [f"{floor[0] or '–'}×, {floor[1] or '–'}×" if floor[0] or floor[1] else ""]
        client = cell(a, b, "client_cpu_s_per_gib", 2)[2:]
        cells = (cell(a, b, "gb_per_s", 3) + cell(a, b, "node_cpu_s_per_gib", 2) + floor + client
                 + cell(a, b, "p99_ms", 2))
        print(f"| {device} | {what} | {size(sz)} | " + " | ".join(cells) + " |")


if __name__ == "__main__":
    main()
