#!/usr/bin/env python3
"""Medians and ratios of a bench/peers.sh session (OUT folder as the argument): hot and cold
GET of Mooncake Store, Redis and ctxpod (through the peers' Python harness, and through
ctxpod's Rust client), per block size, as markdown. Each figure is the median over the
rounds; "best batch" picks the batch whose median is highest."""
import collections
import glob
import json
import os
import re
import statistics
import sys

SIZES = [("64KiB", 64 << 10), ("1MiB", 1 << 20), ("4MiB", 4 << 20)]


def load(pattern):
    rows = []
    for path in sorted(glob.glob(pattern)):
        with open(path) as f:
            rows.extend(json.loads(line) for line in f if line.strip())
    return rows


def main():
    out = sys.argv[1]
    peers = collections.defaultdict(list)  # (system, variant, op, size, batch) -> [gbps]
    rounds = 0
    for path in sorted(glob.glob(os.path.join(out, "peers-*.jsonl"))):
        rounds += 1
        for r in load(path):
            # Configs a bench skipped (its deadline) have no figure.
            if r.get("errors") or r.get("mismatches") or "gbps" not in r:
                continue
            peers[(r["system"], r["variant"], r["op"], r["size"], r["batch"])].append(r["gbps"])
    ours = collections.defaultdict(list)  # (protocol, kind, size, batch) -> [gbps]
    limits = collections.defaultdict(list)
    for path in sorted(glob.glob(os.path.join(out, "ctxpod-*-*.jsonl"))):
        proto = "cxp1" if "-cxp1-" in os.path.basename(path) else "http"
        for r in load(path):
            what = r["what"]
            if r["run"] == 0:
                limits[(what, r["size"])].append(r["gb_per_s"])
                continue
            m = re.match(r"GET (hot|cold)[^,]*(?:, batch (\d+))?$", what)
            if m:
                ours[(proto, m.group(1), r["size"], int(m.group(2) or 1))].append(r["gb_per_s"])

    def med(v):
        return statistics.median(v) if v else None

    def best(system, variant, op, size):
        got = [(med(v), k[4]) for k, v in peers.items()
               if k[:4] == (system, variant, op, size) and v]
        return max(got) if got else (None, None)

    def ours_best(proto, kind, size, batched):
        got = [(med(v), k[3]) for k, v in ours.items()
               if k[:3] == (proto, kind, size) and (k[3] > 1) == batched and v]
        return max(got) if got else (None, None)

    def f(x, b=None):
        if x is None:
            return "—"
        return f"{x:.3f}" + (f" (b{b})" if b else "")

    def ratio(a, b):
        return f"{a / b:.2f}×" if a and b else "—"

    def table(kind, mooncake, redis):
        """One GET table: Mooncake's `mooncake` variant, Redis's `redis` (or none), and
        ctxpod through the harness and through its Rust client, with the ratios."""
        peers_cols = ["Mooncake mem zero-copy" if kind == "hot" else "Mooncake SSD tier"]
        if redis:
            peers_cols.append("Redis no-persist")
        cols = peers_cols + [
            "ctxpod HTTP, harness", "ctxpod CXP1, Rust, 1 per request",
            "ctxpod CXP1, Rust, batch", "ctxpod HTTP, Rust, batch", "best ctxpod ÷ Mooncake"]
        if redis:
            cols.append("best ctxpod ÷ Redis")
        cols.append("harness ctxpod ÷ Mooncake")
        print("| block | " + " | ".join(cols) + " |")
        print("|---" * (len(cols) + 1) + "|")
        for name, size in SIZES:
            mc = best("mooncake", mooncake, "get", size)
            rd = best("redis", redis, "get", size) if redis else None
            hh = best("ctxpod", f"{kind} http", "get", size)
            c1 = ours_best("cxp1", kind, size, False)
            cb = ours_best("cxp1", kind, size, True)
            hb = ours_best("http", kind, size, True)
            top = max((x for x in (hh[0], c1[0], cb[0], hb[0]) if x), default=None)
            cells = [f(*mc)] + ([f(*rd)] if rd else [])
            cells += [f(*hh), f(c1[0]), f(*cb), f(*hb), ratio(top, mc[0])]
            if rd:
                cells.append(ratio(top, rd[0]))
            cells.append(ratio(hh[0], mc[0]))
            print(f"| {name} | " + " | ".join(cells) + " |")

    print(f"Medians of {rounds} round(s) of bench/peers.sh, GB/s.\n")
    print("Hot GET (Mooncake and Redis at their best batch of 1/16/32):\n")
    table("hot", "mem zerocopy", "no-persist")
    print("\nCold GET, from flash (Mooncake: SSD tier, batch 32, page cache dropped before the "
          "gets):\n")
    table("cold", "ssd256M zerocopy", None)
    sdk_tables(out, peers, ours, med, f, ratio)
    if limits:
        print("\nThe machine's limits (first round):\n")
        print("| limit | GB/s |")
        print("|---|---|")
        for (what, _size), v in limits.items():
            print(f"| {what} | {v[0]:.3f} |")


def sdk_tables(out, peers, ours, med, f, ratio):
    """The Python SDK beside Mooncake Store's Python client and Redis at each batch, and
    its prefetch into registered memory against the Rust client's CXP1 batch GET."""
    sdk = collections.defaultdict(list)  # (variant, op, size, batch) -> [gbps]
    for path in sorted(glob.glob(os.path.join(out, "sdk-*.jsonl"))):
        for r in load(path):
            if r.get("errors") or r.get("mismatches") or "gbps" not in r:
                continue
            sdk[(r["variant"], r["op"], r["size"], r["batch"])].append(r["gbps"])
    if not sdk:
        return

    def at(table, key):
        return med(table.get(key, []))

    print("\nThe Python SDK, hot GET, at each batch (GB/s; same harness, every byte checked):\n")
    cols = ["Mooncake zero-copy", "Redis no-persist", "SDK zero-copy (prefetch into a registered buffer)",
            "SDK bytes", "SDK zero-copy ÷ Mooncake", "SDK zero-copy ÷ Redis"]
    print("| block | batch | " + " | ".join(cols) + " |")
    print("|---" * (len(cols) + 2) + "|")
    for name, size in SIZES:
        for b in (1, 16, 32):
            mc = at(peers, ("mooncake", "mem zerocopy", "get", size, b))
            rd = at(peers, ("redis", "no-persist", "get", size, b))
            zc = at(sdk, ("sdk zerocopy", "get", size, b))
            by = at(sdk, ("sdk bytes", "get", size, b))
            print(f"| {name} | {b} | {f(mc)} | {f(rd)} | {f(zc)} | {f(by)} | {ratio(zc, mc)} | {ratio(zc, rd)} |")
    print("\nSDK prefetch into a registered buffer against the Rust client's CXP1 batch GET "
          "(batch 32; 8 for 4 MiB in the Rust client):\n")
    print("| block | SDK zero-copy, batch 32 | Rust CXP1 batch GET | SDK ÷ Rust |")
    print("|---|---|---|---|")
    for name, size in SIZES:
        zc = at(sdk, ("sdk zerocopy", "get", size, 32))
        got = [med(v) for k, v in ours.items() if k[:3] == ("cxp1", "hot", size) and k[3] > 1 and v]
        rust = max(got) if got else None
        print(f"| {name} | {f(zc)} | {f(rust)} | {ratio(zc, rust)} |")
    print("\nSDK puts (GB/s):\n")
    print("| block | batch | Mooncake zero-copy put | SDK zero-copy put | SDK bytes put |")
    print("|---|---|---|---|---|")
    for name, size in SIZES:
        for b in (1, 16, 32):
            mc = at(peers, ("mooncake", "mem zerocopy", "put", size, b))
            zc = at(sdk, ("sdk zerocopy", "put", size, b))
            by = at(sdk, ("sdk bytes", "put", size, b))
            print(f"| {name} | {b} | {f(mc)} | {f(zc)} | {f(by)} |")


if __name__ == "__main__":
    main()
