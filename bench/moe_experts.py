"""Expert prefetch against the device read (issue #36): the experts of a model-shaped MoE
(Qwen1.5-MoE-A2.7B's expert shapes: hidden 2048, expert intermediate 1408, bf16; 17.3 MB
per expert in two shards) in a `weights` namespace of one node, read back the way a decode
step needs them: top-k experts per layer, through `Store.prefetch_experts` into registered
expert-major arrays.

Arms, each cold (a node restarted with a 64 MiB DRAM tier: every read from flash) and warm
(restarted with a DRAM tier that holds the step, after an untimed pass):
  - `layer by layer`: each layer's top-k asked and waited for before the next layer's is
    asked (a decode step that fetches on routing, nothing predicted);
  - `step ahead`: every layer's top-k in one prefetch (a step whose routing was predicted);
and fio's sequential O_DIRECT read of the same file system (1 MiB, QD 8) beside them.

    ~/.cache/ctxpod-venv/bin/python bench/moe_experts.py --ctxpod-bin ~/.cache/ctxpod-target/debug/ctxpod

Prints one line per arm and round: seconds per decode step, GB/s, % of the device read.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

import numpy as np

sys.path.insert(0, os.path.dirname(__file__))
from benchnode import start_node, stop_node  # noqa: E402

import ctxpod  # noqa: E402

HIDDEN, INTER = 2048, 1408
SHARDS = {"gate_up_proj": 2 * INTER * HIDDEN * 2, "down_proj": HIDDEN * INTER * 2}


def fio_read(directory: str, size: str = "1G") -> float:
    """fio's sequential O_DIRECT read, 1 MiB at QD 8, in GB/s."""
    path = os.path.join(directory, "fio-read.dat")
    out = subprocess.run(
        ["fio", "--name=r", f"--filename={path}", f"--size={size}", "--rw=read", "--bs=1M",
         "--iodepth=8", "--direct=1", "--ioengine=io_uring", "--output-format=json"],
        check=True, capture_output=True, text=True).stdout
    os.remove(path)
    return json.loads(out)["jobs"][0]["read"]["bw_bytes"] / 1e9


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--ctxpod-bin", required=True)
    ap.add_argument("--dir", default="/work/bench")
    ap.add_argument("--layers", type=int, default=4)
    ap.add_argument("--experts", type=int, default=16)
    ap.add_argument("--top-k", type=int, default=4)
    ap.add_argument("--rounds", type=int, default=3)
    a = ap.parse_args()
    os.makedirs(a.dir, exist_ok=True)
    work = tempfile.mkdtemp(dir=a.dir, prefix="moe-")
    data = os.path.join(work, "node")
    expert_bytes = sum(SHARDS.values())
    rng = np.random.default_rng(36)
    regions = {l: {s: np.zeros((a.experts, n), dtype=np.uint8) for s, n in SHARDS.items()} for l in range(a.layers)}
    try:
        node, url = start_node(a.ctxpod_bin, data, capacity="8GiB", dram="64MiB")
        s = ctxpod.Store.connect(url, namespace="moe-experts")
        s.create_namespace(namespace_class="weights")
        for l in range(a.layers):
            for e in range(a.experts):
                keys = [ctxpod.expert_key(l, e, sh) for sh in SHARDS]
                vals = [rng.integers(0, 256, n, dtype=np.uint8).tobytes() for n in SHARDS.values()]
                assert s.batch_put(keys, vals) == [201, 201]
        s.close()
        stop_node(node)
        print(f"stored {a.layers} layers x {a.experts} experts x {expert_bytes} B "
              f"({a.layers * a.experts * expert_bytes / 1e9:.2f} GB)", file=sys.stderr)
        rows: dict[str, list[float]] = {}
        for r in range(a.rounds):
            device = fio_read(a.dir)
            rows.setdefault("device read (fio, 1 MiB, QD8)", []).append(device)
            step = {l: sorted(rng.choice(a.experts, a.top_k, replace=False).tolist()) for l in range(a.layers)}
            step_bytes = a.layers * a.top_k * expert_bytes
            for arm in ("layer by layer", "step ahead"):
                for warm in (False, True):
                    # Cold: a 64 MiB DRAM tier, every read from flash. Warm: a DRAM tier
                    # that holds the step, after an untimed pass that fills it.
                    node, url = start_node(a.ctxpod_bin, data, capacity="8GiB", dram="2GiB" if warm else "64MiB")
                    s = ctxpod.Store.connect(url, namespace="moe-experts")
                    for l in range(a.layers):
                        for arr in regions[l].values():
                            s.register_buffer(arr)
                    for timed in ((False, True) if warm else (True,)):
                        t0 = time.perf_counter()
                        if arm == "layer by layer":
                            for l in range(a.layers):
                                got = s.prefetch_experts({l: step[l]}, {l: regions[l]}).wait()
                                assert all(g is not None and g > 0 for g in got), got
                        else:
                            got = s.prefetch_experts(step, regions).wait()
                            assert all(g is not None and g > 0 for g in got), got
                        dt = time.perf_counter() - t0
                    name = f"{arm}, {'warm (DRAM)' if warm else 'cold (flash)'}"
                    rows.setdefault(name, []).append(step_bytes / dt / 1e9)
                    print(f"round {r + 1}: {name}: {dt * 1e3:.1f} ms per step of {step_bytes / 1e6:.0f} MB, "
                          f"{step_bytes / dt / 1e9:.2f} GB/s = {step_bytes / dt / 1e9 / device * 100:.0f} % of the device read",
                          file=sys.stderr)
                    s.close()
                    stop_node(node)
        print("| what | GB/s, median of rounds | range |")
        print("|---|---|---|")
        for name, v in rows.items():
            print(f"| {name} | {statistics.median(v):.2f} | {min(v):.2f}–{max(v):.2f} |")
    finally:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
