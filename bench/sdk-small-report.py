#!/usr/bin/env python3
"""The report of bench/sdk-small.sh: per batch, hot GET GB/s of the SDK (zero-copy), Redis
(no persistence) and the Rust client (CXP1, one request in flight), each round's figures and
the medians, and SDK / Redis and SDK / Rust as the median of the per-round ratios with their
range. Usage: python3 bench/sdk-small-report.py OUT
"""
import glob
import json
import os
import re
import statistics
import sys


def sdk(out, suffix=""):
    """{(round, batch): GB/s} of the SDK's gets (labelled ``round<N><suffix>``)."""
    got = {}
    for line in open(os.path.join(out, "sdk.jsonl")):
        r = json.loads(line)
        m = re.match(rf"round(\d+){re.escape(suffix)}$", r.get("label", ""))
        if m and r["op"] == "get":
            got[(int(m.group(1)), r["batch"])] = r["gbps"]
    return got


def redis(out):
    got = {}
    for path in glob.glob(os.path.join(out, "redis-*.jsonl")):
        rnd = int(re.search(r"redis-(\d+)\.jsonl$", path).group(1))
        for line in open(path):
            r = json.loads(line)
            if r["op"] == "get" and r.get("variant") == "no-persist":
                got[(rnd, r["batch"])] = r["gbps"]
    return got


def rust(out):
    got = {}
    for path in glob.glob(os.path.join(out, "rust-*-b*.jsonl")):
        m = re.search(r"rust-(\d+)-b(\d+)\.jsonl$", path)
        for line in open(path):
            r = json.loads(line)
            if r["what"].startswith("GET hot"):
                got[(int(m.group(1)), int(m.group(2)))] = r["gb_per_s"]
    return got


def ratio(a, b, rounds, batch):
    rs = [a[(r, batch)] / b[(r, batch)] for r in rounds if (r, batch) in a and (r, batch) in b]
    if not rs:
        return "-"
    return f"{statistics.median(rs):.2f} [{min(rs):.2f}–{max(rs):.2f}]"


def main():
    out = sys.argv[1]
    s, d, c, sh = sdk(out), redis(out), rust(out), sdk(out, "-shared")
    rounds = sorted({r for r, _ in s})
    head = ["batch", "SDK zero-copy", "Redis no-persist", "Rust client, one in flight"]
    head += ["SDK, shared connection only"] if sh else []
    head += ["SDK ÷ Redis", "SDK ÷ Rust"] + (["SDK ÷ shared only"] if sh else [])
    print("| " + " | ".join(head) + " |")
    print("|" + "---|" * len(head))
    for b in sorted({b for _, b in s}):
        cells = []
        for src in (s, d, c) + ((sh,) if sh else ()):
            v = [src[(r, b)] for r in rounds if (r, b) in src]
            cells.append(" / ".join(f"{x:.3f}" for x in v) + (f" (median {statistics.median(v):.3f})" if v else ""))
        ratios = [ratio(s, d, rounds, b), ratio(s, c, rounds, b)] + ([ratio(s, sh, rounds, b)] if sh else [])
        print(f"| {b} | {' | '.join(cells)} | {' | '.join(ratios)} |")


if __name__ == "__main__":
    main()
