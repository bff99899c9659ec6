#!/usr/bin/env python3
"""Summarise a `ctxpod bench --perf` profile: CPU samples per process, and the top
symbols of each, as shares of all samples (both CPUs). Usage:

    python3 bench/perf-summary.py /tmp/perf/GET-hot--DRAM--1MiB.data [--top 15]

Processes are told apart by pid; the bench client is the `ctxpod` process whose child is
the node (`ctxpod serve`). Kernel symbols are kept (copies into and out of sockets show as
`copy_user_*`/`_copy_to_iter`), idle (pid 0) is reported as one line.
"""
import argparse
import collections
import subprocess
import sys


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("data")
    ap.add_argument("--top", type=int, default=12)
    a = ap.parse_args()
    out = subprocess.run(
        ["perf", "script", "-i", a.data, "-F", "pid,tid,comm,ip,sym"],
        capture_output=True, text=True, check=True).stdout
    per_pid = collections.Counter()
    per_sym = collections.defaultdict(collections.Counter)
    threads = collections.defaultdict(collections.Counter)
    total = 0
    for line in out.splitlines():
        parts = line.split(None, 2)
        if len(parts) < 2:
            continue
        comm, pidtid = parts[0], parts[1]
        if "/" not in pidtid:
            # comm may hold a space ("tokio-rt-worker" does not, but be safe)
            continue
        pid = int(pidtid.split("/")[0])
        # the rest is "<ip> <symbol>"
        rest = parts[2].split(None, 1) if len(parts) > 2 else []
        sym = rest[1].strip() if len(rest) > 1 else "[unknown]"
        total += 1
        per_pid[pid] += 1
        per_sym[pid][sym] += 1
        threads[pid][comm] += 1
    if not total:
        sys.exit("no samples")
    print(f"{total} samples")
    for pid, n in per_pid.most_common():
        if n * 100 / total < 1:
            continue
        names = ", ".join(f"{c} {k * 100 / n:.0f}%" for c, k in threads[pid].most_common(4))
        print(f"\npid {pid}: {n * 100 / total:.1f} % of samples ({names})")
        if pid == 0:
            continue
        for sym, k in per_sym[pid].most_common(a.top):
            print(f"  {k * 100 / total:5.1f} %  {sym[:110]}")


if __name__ == "__main__":
    main()
