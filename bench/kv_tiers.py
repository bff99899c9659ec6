"""KV blocks on a node of two tiers, promotion on vs off (issue #36): a simulated SLC + QLC
pair (firmware-sim `slc` and `qlc`, real time; fast 4 regions of 16 MiB, dense 1 GiB),
blocks of 64 KiB (an SGLang page of 64 tokens of a small model's layer K and V) written
until most sit on QLC, then read one at a time the way an engine's connector fetches a
prefix it found: a `prefetch` of the block into registered memory, waited for (queue depth
1, latency-bound), keys drawn from a Zipf (s = 1.1) popularity. The DRAM tier is 16 MiB,
so nearly every read is from flash. Arms:
  - `promotion off` (`tier_promote_hints = false`);
  - `promotion on`: each prefetch hints its block, which the node moves to SLC when idle.
Prints per arm the median and p99 wait per block over the last half of the reads, and
the bytes promoted.

    ~/.cache/ctxpod-venv/bin/python bench/kv_tiers.py --ctxpod-bin ~/.cache/ctxpod-target/debug/ctxpod
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import statistics
import sys
import tempfile
import time
import urllib.request

import numpy as np

sys.path.insert(0, os.path.dirname(__file__))
from benchnode import start_node, stop_node  # noqa: E402

import ctxpod  # noqa: E402

BLOCK = 64 << 10


def tiers(hints: bool) -> str:
    return (
        f'region_bytes = "16MiB"\ntier_promote_hints = {"true" if hints else "false"}\n'
        '[[tiers]]\nname = "fast"\ndevice = "sim:slc"\ncapacity = "65MiB"\n'
        '[[tiers]]\nname = "dense"\ndevice = "sim:qlc"\ncapacity = "1025MiB"\n'
    )


def metric(url: str, name: str) -> float:
    text = urllib.request.urlopen(url + "/metrics", timeout=5).read().decode()
    m = re.search(rf"^{re.escape(name)} (\S+)$", text, re.M)
    return float(m.group(1)) if m else 0.0


def run_arm(a, hints: bool, work: str) -> dict[str, float]:
    data = os.path.join(work, f"node-{'on' if hints else 'off'}")
    node, url = start_node(a.ctxpod_bin, data, dram="16MiB", config=tiers(hints))
    try:
        s = ctxpod.Store.connect(url, namespace="default")
        rng = np.random.default_rng(36)
        keys = [f"kv-{i}".encode() for i in range(a.blocks)]
        for i in range(0, a.blocks, 64):
            chunk = keys[i:i + 64]
            vals = [rng.integers(0, 256, BLOCK, dtype=np.uint8).tobytes() for _ in chunk]
            assert s.batch_put(chunk, vals) == [201] * len(chunk)
        buf = bytearray(BLOCK)
        s.register_buffer(buf)
        time.sleep(a.settle_s)
        p = 1.0 / np.arange(1, a.blocks + 1) ** 1.1
        # The popular keys are the oldest, the ones on QLC by now.
        order = np.random.default_rng(7).choice(a.blocks, a.reads, p=p / p.sum())
        waits = []
        for n, i in enumerate(order):
            t0 = time.perf_counter()
            got = s.prefetch([keys[i]], (buf, [0])).wait()
            waits.append(time.perf_counter() - t0)
            assert got == [BLOCK], got
            if n % 64 == 63:
                time.sleep(a.gap_ms / 1000)  # the engine's compute, in which the node promotes
        promoted = metric(url, "ctxpod_tier_promoted_bytes_total")
        s.close()
        late = sorted(waits[len(waits) // 2:])
        return {
            "median": statistics.median(late),
            "p99": late[int(len(late) * 0.99) - 1],
            "first_half": statistics.median(waits[: len(waits) // 2]),
            "promoted_mb": promoted / 1e6,
        }
    finally:
        stop_node(node)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--ctxpod-bin", required=True)
    ap.add_argument("--dir", default="/work/bench")
    ap.add_argument("--blocks", type=int, default=8192, help="64 KiB blocks (512 MiB)")
    ap.add_argument("--reads", type=int, default=4000)
    ap.add_argument("--gap-ms", type=int, default=20, help="idle time every 64 reads")
    ap.add_argument("--settle-s", type=float, default=10)
    a = ap.parse_args()
    os.makedirs(a.dir, exist_ok=True)
    work = tempfile.mkdtemp(dir=a.dir, prefix="kv-tiers-")
    try:
        rows = {hints: run_arm(a, hints, work) for hints in (False, True)}
        print("| promotion | first half, median µs | second half, median µs | p99 µs | promoted |")
        print("|---|---|---|---|---|")
        for hints, r in rows.items():
            print(f"| {'on' if hints else 'off'} | {r['first_half'] * 1e6:.0f} | {r['median'] * 1e6:.0f} | "
                  f"{r['p99'] * 1e6:.0f} | {r['promoted_mb']:.0f} MB |")
    finally:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
