"""Expert prefetch on a node of two tiers, promotion on vs off (issue #36): a simulated
SLC + QLC pair (firmware-sim `slc` and `qlc` profiles, real-time), the experts of a
model-shaped MoE (Qwen1.5-MoE-A2.7B's expert shapes as its checkpoint stores them:
gate_proj, up_proj, down_proj of 5.77 MB each, bf16; 17.3 MB per expert; with `--fused`,
gate_up_proj of 11.5 MB, a large value, and down_proj) in a `weights`
namespace, more than the fast tier holds, so most of them sit on QLC after loading.

Decode steps route each layer's top-k from a skewed (Zipf, s = 1.2) popularity, as MoE
routers are (a few experts take most tokens), and fetch the whole step in one
`prefetch_experts` into registered expert-major arrays. The DRAM tier is small (64 MiB),
so every read is from flash. Arms:
  - `promotion off` (`tier_promote_hints = false`): every expert read where it lies;
  - `promotion on` (the default): a prefetch hints its experts for promotion, and the idle
    node moves them to SLC within its move budget, so later steps read the hot ones there.
The node settles (20 s idle) after the load. Prints per arm the first step's wait (every
expert where the load left it), the median wait of the later steps, GB/s, and the bytes
promoted.

    ~/.cache/ctxpod-venv/bin/python bench/moe_tiers.py --ctxpod-bin ~/.cache/ctxpod-target/debug/ctxpod
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

HIDDEN, INTER = 2048, 1408
SHARDS = {"gate_proj": INTER * HIDDEN * 2, "up_proj": INTER * HIDDEN * 2, "down_proj": HIDDEN * INTER * 2}
# `--fused`: gate and up fused as transformers' and vLLM's MoE layers hold them (11.5 MB, a
# large value of three extents, over the 8 MiB a block may be) and down_proj.
FUSED = {"gate_up_proj": 2 * INTER * HIDDEN * 2, "down_proj": HIDDEN * INTER * 2}


def tiers(fast: str, dense: str, hints: bool) -> str:
    return (
        f'region_bytes = "64MiB"\ntier_promote_hints = {"true" if hints else "false"}\n'
        f'[[tiers]]\nname = "fast"\ndevice = "sim:slc"\ncapacity = "{fast}"\n'
        f'[[tiers]]\nname = "dense"\ndevice = "sim:qlc"\ncapacity = "{dense}"\n'
    )


def metric(url: str, name: str) -> float:
    text = urllib.request.urlopen(url + "/metrics", timeout=5).read().decode()
    m = re.search(rf"^{re.escape(name)} (\S+)$", text, re.M)
    return float(m.group(1)) if m else 0.0


def zipf_topk(rng: np.random.Generator, experts: int, k: int, s: float = 1.2) -> list[int]:
    """k distinct experts drawn by a Zipf popularity over a per-layer random ranking."""
    p = 1.0 / np.arange(1, experts + 1) ** s
    return sorted(rng.choice(experts, k, replace=False, p=p / p.sum()).tolist())


def run_arm(a, hints: bool, work: str) -> dict[str, float]:
    data = os.path.join(work, f"node-{'on' if hints else 'off'}")
    cfg = tiers(a.fast, a.dense, hints)
    node, url = start_node(a.ctxpod_bin, data, dram="64MiB", config=cfg)
    rng = np.random.default_rng(36)
    shards = FUSED if a.fused else SHARDS
    regions = {l: {s: np.zeros((a.experts, n), dtype=np.uint8) for s, n in shards.items()}
               for l in range(a.layers)}
    try:
        s = ctxpod.Store.connect(url, namespace="moe-experts")
        s.create_namespace(namespace_class="weights")
        for l in range(a.layers):
            for e in range(a.experts):
                keys = [ctxpod.expert_key(l, e, sh) for sh in shards]
                vals = [rng.integers(0, 256, n, dtype=np.uint8).tobytes() for n in shards.values()]
                assert s.batch_put(keys, vals) == [201] * len(shards)
        for l in range(a.layers):
            for arr in regions[l].values():
                s.register_buffer(arr)
        # The simulated drives' background work after the load (write caches draining,
        # QLC's SLC cache folding) would otherwise slow the first steps of both arms.
        time.sleep(a.settle_s)
        expert_bytes = sum(shards.values())
        step_bytes = a.layers * a.top_k * expert_bytes
        route = np.random.default_rng(7)
        waits = []
        for step in range(a.steps):
            chosen = {l: zipf_topk(route, a.experts, a.top_k) for l in range(a.layers)}
            t0 = time.perf_counter()
            got = s.prefetch_experts(chosen, regions).wait()
            dt = time.perf_counter() - t0
            assert all(g is not None and g > 0 for g in got), got
            waits.append(dt)
            print(f"promotion {'on' if hints else 'off'}, step {step + 1}: {dt * 1e3:.0f} ms, "
                  f"{step_bytes / dt / 1e9:.2f} GB/s", file=sys.stderr)
            # Idle time between steps (the step's compute), in which the node promotes.
            time.sleep(a.gap_ms / 1000)
        promoted = metric(url, "ctxpod_tier_promoted_bytes_total")
        s.close()
        rest = waits[1:]
        return {
            "first": waits[0],
            "median": statistics.median(rest),
            "min": min(rest),
            "max": max(rest),
            "gbps": step_bytes / statistics.median(rest) / 1e9,
            "promoted_gb": promoted / 1e9,
            "step_mb": step_bytes / 1e6,
        }
    finally:
        stop_node(node)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--ctxpod-bin", required=True)
    ap.add_argument("--dir", default="/work/bench")
    ap.add_argument("--layers", type=int, default=4)
    ap.add_argument("--experts", type=int, default=16)
    ap.add_argument("--top-k", type=int, default=4)
    ap.add_argument("--steps", type=int, default=24)
    ap.add_argument("--settle-s", type=float, default=20, help="idle time after the load")
    ap.add_argument("--gap-ms", type=int, default=200, help="idle time between steps")
    ap.add_argument("--fast", default="769MiB",
                    help="fast (SLC) tier: 12 regions of 64 MiB, about half the experts")
    ap.add_argument("--dense", default="2049MiB")
    ap.add_argument("--fused", action="store_true",
                    help="gate_up_proj fused (11.5 MB: large values, moved extent by extent)")
    a = ap.parse_args()
    os.makedirs(a.dir, exist_ok=True)
    work = tempfile.mkdtemp(dir=a.dir, prefix="moe-tiers-")
    try:
        rows = {hints: run_arm(a, hints, work) for hints in (False, True)}
        print(f"| promotion | first step (cold), ms | later steps, median ms [range] | GB/s (median) | promoted |")
        print("|---|---|---|---|---|")
        for hints, r in rows.items():
            print(f"| {'on' if hints else 'off'} | {r['first'] * 1e3:.0f} | {r['median'] * 1e3:.0f} "
                  f"[{r['min'] * 1e3:.0f}–{r['max'] * 1e3:.0f}] | {r['gbps']:.2f} | {r['promoted_gb']:.2f} GB |")
        print(f"(a step: {a.layers} layers x top-{a.top_k} of {a.experts} experts, {rows[True]['step_mb']:.0f} MB)")
    finally:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
