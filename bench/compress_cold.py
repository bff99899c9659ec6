"""Cold compression on a node of two tiers (issue #36): what lz4 and zstd save on the data
engines store, and what reading a compressed block costs.

Data (bf16, as engines store it):
  - `kv-llama`: the KV cache of a seeded Llama-shaped model (transformers `LlamaForCausalLM`,
    hidden 1024, 4 layers, 8 KV heads of head_dim 128 as Llama-3-8B has; weights as
    transformers initializes them), prompts of 256 random tokens (LMCache's chunk), one
    block per layer and chunk: K and V, 1 MiB;
  - `experts`: MoE expert shards of Qwen1.5-MoE-A2.7B's shapes (gate_proj, up_proj,
    down_proj of 5.77 MB), values as transformers initializes them (normal, std 0.02);
  - `fused`: the same experts as checkpoints that fuse gate and up hold them (gate_up_proj
    of 11.5 MB, a large value written straight to dense and compressed as it is written;
    down_proj of 5.77 MB, a block);
  - `random`: random bytes (nothing to save), the control.
Neither model is trained: their bytes have the spread of initialized weights and of the
activations they give, which is what this machine can make without a download.

Per data set and codec (off, lz4, zstd) a fresh node on two file tiers (fast 64 MiB, dense
512 MiB; promotion hints off, DRAM 8 MiB, so reads come from flash) takes the blocks; fast's
reclaim demotes most of them into dense, compressed where it saves an eighth. Printed: the
share of bytes held compressed, the ratio achieved on them (the node's `compressed_bytes`
over `compressed_stored_bytes`), the put time, and the median time to read a block back
(every block read once, after the load: most from dense).

    ~/.cache/ctxpod-venv/bin/python bench/compress_cold.py --ctxpod-bin ~/.cache/ctxpod-target/debug/ctxpod
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import sys
import tempfile
import time

import numpy as np

sys.path.insert(0, os.path.dirname(__file__))
from benchnode import start_node, stop_node  # noqa: E402

import ctxpod  # noqa: E402

MIB = 1 << 20


def kv_llama(chunks: int) -> list[bytes]:
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(36)
    cfg = LlamaConfig(
        hidden_size=1024, intermediate_size=2816, num_hidden_layers=4, num_attention_heads=8,
        num_key_value_heads=8, head_dim=128, vocab_size=32000, max_position_embeddings=4096,
    )
    model = LlamaForCausalLM(cfg).to(torch.bfloat16).eval()
    out = []
    with torch.no_grad():
        for c in range(chunks):
            ids = torch.randint(0, cfg.vocab_size, (1, 256), generator=torch.Generator().manual_seed(c))
            cache = model(ids, use_cache=True).past_key_values
            for layer in range(cfg.num_hidden_layers):
                k, v = cache.layers[layer].keys, cache.layers[layer].values
                both = torch.stack([k, v]).contiguous()
                out.append(both.view(torch.uint8).numpy().tobytes())
    return out


def experts(n: int) -> list[bytes]:
    import torch

    g = torch.Generator().manual_seed(36)
    hidden, inter = 2048, 1408
    out = []
    for _ in range(n):
        for shape in [(inter, hidden), (inter, hidden), (hidden, inter)]:
            w = (torch.randn(shape, generator=g) * 0.02).to(torch.bfloat16)
            out.append(w.view(torch.uint8).numpy().tobytes())
    return out


def experts_fused(n: int) -> list[bytes]:
    """Experts as checkpoints that fuse gate and up store them (one gate_up_proj of
    2 x 1408 x 2048, 11.5 MB: a large value, written straight to dense) and a down_proj."""
    import torch

    g = torch.Generator().manual_seed(36)
    hidden, inter = 2048, 1408
    out = []
    for _ in range(n):
        for shape in [(2 * inter, hidden), (hidden, inter)]:
            w = (torch.randn(shape, generator=g) * 0.02).to(torch.bfloat16)
            out.append(w.view(torch.uint8).numpy().tobytes())
    return out


def random_blocks(n: int) -> list[bytes]:
    rng = np.random.default_rng(36)
    return [rng.integers(0, 256, MIB, dtype=np.uint8).tobytes() for _ in range(n)]


def tiers(work: str) -> str:
    return (
        'region_bytes = "16MiB"\ntier_promote_hints = false\n'
        f'[[tiers]]\nname = "fast"\ndevice = "{work}/fast.dev"\ncapacity = "65MiB"\n'
        f'[[tiers]]\nname = "dense"\ndevice = "{work}/dense.dev"\ncapacity = "513MiB"\n'
    )


def run(a, data: list[bytes], codec: str | None, work: str) -> dict[str, float]:
    os.makedirs(work, exist_ok=True)
    node, url = start_node(a.ctxpod_bin, os.path.join(work, "n"), capacity="578MiB",
                           dram="8MiB", config=tiers(work))
    try:
        s = ctxpod.Store.connect(url, namespace="cold")
        s.create_namespace(compression=codec)
        keys = [f"b{i}".encode() for i in range(len(data))]
        t = time.perf_counter()
        for k, d in zip(keys, data):
            s.put(k, d)
        put_s = time.perf_counter() - t
        info = s.namespace_info()
        reads = []
        for k, d in zip(keys, data):
            t = time.perf_counter()
            got = s.get(k)
            reads.append(time.perf_counter() - t)
            assert got == d, "read back byte for byte"
        s.close()
        used, comp, stored = info["used_bytes"], info["compressed_bytes"], info["compressed_stored_bytes"]
        return {
            "held_compressed": comp / used if used else 0.0,
            "ratio": comp / stored if stored else 1.0,
            "put_mb_s": used / put_s / 1e6,
            "read_ms": statistics.median(reads) * 1e3,
            "block_mb": used / len(data) / 1e6,
        }
    finally:
        stop_node(node)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--ctxpod-bin", required=True)
    ap.add_argument("--chunks", type=int, default=32, help="KV chunks of 256 tokens (4 blocks each)")
    ap.add_argument("--experts", type=int, default=8, help="experts of 3 shards")
    ap.add_argument("--only", nargs="*", help="data sets to run (all unless named)")
    a = ap.parse_args()
    sets = {
        "kv-llama": lambda: kv_llama(a.chunks),
        "experts": lambda: experts(a.experts),
        "fused": lambda: experts_fused(a.experts),
        "random": lambda: random_blocks(128),
    }
    sets = {k: make() for k, make in sets.items() if not a.only or k in a.only}
    work = tempfile.mkdtemp(prefix="ctxpod-compress-")
    try:
        print(f"{'data':10} {'codec':5} {'block MB':>8} {'held compressed':>15} {'ratio':>6} "
              f"{'put MB/s':>8} {'read ms (median)':>16}")
        for name, data in sets.items():
            for codec in (None, "lz4", "zstd"):
                r = run(a, data, codec, os.path.join(work, f"{name}-{codec}"))
                print(f"{name:10} {codec or 'off':5} {r['block_mb']:8.2f} {r['held_compressed']:15.0%} "
                      f"{r['ratio']:6.3f} {r['put_mb_s']:8.0f} {r['read_ms']:16.2f}", flush=True)
    finally:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
