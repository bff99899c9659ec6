#!/usr/bin/env python3
"""Time to first token with a prompt's prefix fetched from ctxpod vs recomputed.

A small seeded random Llama (transformers, float32, CPU) serves request A, a prefix of
the longest size plus a tail of its own, and stores A's KV cache in ctxpod per (block,
layer, K|V) under the chained block hashes (api/python/tests/kvcache_util.py). Then for each
prefix size P, request B = A's first P tokens + a suffix of its own is answered two ways:

  recompute  prefill all of B on a fresh DynamicCache, argmax of the last logits;
  ctxpod     hash B's blocks, match_prefix, one prefetch of every (block, layer, K|V)
             straight into one registered tensor (a ticket per 4096 entries, all in
             flight at once), wait (the "fetch"); one permuting copy per layer into a
             DynamicCache ("build"); prefill only the suffix ("suffix").

Each is measured --repeats times (median); the first tokens must be equal. The fetch
bound is the bytes over CXP1's bandwidth measured in the same run: the same blocks
prefetched again into the same tensor, timed (prefetch + wait alone).

By default it starts its own node (CTXPOD_ZERO_FILL=false, loopback, a temporary data
directory) and stops it at the end; --url uses a running one instead.

    python bench/ttft.py                     # 1k, 4k, 16k-token prefixes, 64-token suffix
    python bench/ttft.py --json ttft.json --prefixes 1024,4096
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import sys
import tempfile
import time
import uuid
from pathlib import Path

import torch
import transformers

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent / "api" / "python" / "tests"))
import ctxpod  # noqa: E402
from benchnode import start_node, stop_node  # noqa: E402
from kvcache_util import (  # noqa: E402
    Layout, block_hashes, build_cache, entries, match, prefetch, prefill, store_kv, tiny_llama,
)


def default_bin() -> str:
    if os.environ.get("CTXPOD_BIN"):
        return os.environ["CTXPOD_BIN"]
    target = Path(os.environ.get("CARGO_TARGET_DIR", Path.home() / ".cache/ctxpod-target"))
    for profile in ("release", "debug"):
        if (target / profile / "ctxpod").exists():
            return str(target / profile / "ctxpod")
    return "ctxpod"


class OwnNode:
    """A `ctxpod serve` of this run's own, stopped by stop()."""

    def __init__(self, binary: str, capacity: str, dram: str) -> None:
        self.dir = tempfile.mkdtemp(prefix="ctxpod-ttft-")
        self.log = open(Path(self.dir) / "node.log", "w")
        try:
            self.proc, self.url = start_node(binary, f"{self.dir}/data", capacity, dram, log=self.log)
        except SystemExit:
            self.log.close()
            raise SystemExit(f"the node did not come up; its log: {self.dir}/node.log")

    def stop(self) -> None:
        stop_node(self.proc)
        self.log.close()
        shutil.rmtree(self.dir, ignore_errors=True)


def med(xs: list[float]) -> float:
    return statistics.median(xs)


class Bench:
    def __init__(self, a, store: ctxpod.Store) -> None:
        self.a, self.store = a, store
        self.model = tiny_llama(a.hidden, a.layers, a.heads, a.kv_heads, a.intermediate, a.vocab)
        self.lay = Layout.of(self.model, a.block_size)
        self.capacity = max(a.prefixes) // a.block_size  # blocks the landing tensor holds
        self.landing = self.lay.landing(self.capacity)
        t = time.perf_counter()
        self.buf = store.register_buffer(self.landing)  # once, as an engine would at start
        self.register_s = time.perf_counter() - t

    def recompute(self, b: torch.Tensor) -> tuple[float, int, torch.Tensor]:
        t = time.perf_counter()
        logits, cache = prefill(self.model, b)
        tok = int(logits.argmax())
        dt = time.perf_counter() - t
        del cache
        return dt, tok, logits

    def cached(self, b: torch.Tensor) -> dict:
        bs, lay = self.a.block_size, self.lay
        t0 = time.perf_counter()
        hashes = block_hashes(b[0], bs, self.a.model_id)
        n = min(match(self.store, hashes), self.capacity)
        tm = time.perf_counter()
        keys, offsets = entries(hashes[:n], lay, self.capacity)
        codes = prefetch(self.store, self.buf, keys, offsets, lay.block_bytes)
        t1 = time.perf_counter()
        assert codes == [lay.block_bytes] * len(keys), f"entries not landed: {sorted(set(codes))}"
        cache = build_cache(self.landing, n, self.model.config)
        t2 = time.perf_counter()
        logits, cache = prefill(self.model, b[:, n * bs :], cache, n * bs)
        tok = int(logits.argmax())
        t3 = time.perf_counter()
        return dict(blocks=n, entries=len(keys), bytes=sum(codes), fetch=t1 - t0, match=tm - t0,
                    build=t2 - t1, suffix=t3 - t2, ttft=t3 - t0, tok=tok, logits=logits)

    def refetch(self, hashes: list[int]) -> float:
        """The same blocks prefetched again into the same tensor: prefetch + wait alone."""
        keys, offsets = entries(hashes, self.lay, self.capacity)
        t = time.perf_counter()
        codes = prefetch(self.store, self.buf, keys, offsets, self.lay.block_bytes)
        dt = time.perf_counter() - t
        assert codes == [self.lay.block_bytes] * len(keys)
        return dt


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--url", help="a running node (default: start one)")
    ap.add_argument("--ctxpod-bin", default=default_bin())
    ap.add_argument("--prefixes", default="1024,4096,16384", help="prefix sizes in tokens, multiples of the block size")
    ap.add_argument("--suffix", type=int, default=64, help="tokens of B after the prefix")
    ap.add_argument("--block-size", type=int, default=64)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--hidden", type=int, default=512)
    ap.add_argument("--layers", type=int, default=8)
    ap.add_argument("--heads", type=int, default=8)
    ap.add_argument("--kv-heads", type=int, default=2)
    ap.add_argument("--intermediate", type=int, default=1536)
    ap.add_argument("--vocab", type=int, default=1000)
    ap.add_argument("--threads", type=int, default=2, help="torch.set_num_threads")
    ap.add_argument("--model-id", default="ttft-bench-llama")
    ap.add_argument("--json", help="write the results to this file")
    a = ap.parse_args()
    a.prefixes = sorted(int(p) for p in a.prefixes.split(","))
    assert all(p % a.block_size == 0 and p > 0 for p in a.prefixes), "prefixes: multiples of --block-size"
    assert a.repeats >= 1
    torch.set_num_threads(a.threads)
    started = time.perf_counter()

    node = None if a.url else OwnNode(a.ctxpod_bin, "4GiB", "1GiB")
    url = a.url or node.url
    store = ctxpod.Store.connect(url, namespace=f"ttft-{uuid.uuid4().hex[:10]}")
    store.create_namespace()
    try:
        bench = Bench(a, store)
        rows = run(a, bench)
    finally:
        store.close()
        store.delete_namespace()
        if node:
            node.stop()
    total = time.perf_counter() - started
    report(a, bench, rows, url, node is not None, total)


def run(a, bench: Bench) -> list[dict]:
    g = torch.Generator().manual_seed(1)
    longest = max(a.prefixes)
    prefix = torch.randint(0, a.vocab, (1, longest), generator=g)
    req_a = torch.cat([prefix, torch.randint(0, a.vocab, (1, a.suffix), generator=g)], dim=1)

    # Request A: prefilled once, its complete blocks stored.
    t = time.perf_counter()
    _, cache_a = prefill(bench.model, req_a)
    bench.prefill_a_s = time.perf_counter() - t
    t = time.perf_counter()
    bench.stored = store_kv(bench.store, cache_a, block_hashes(req_a[0], a.block_size, a.model_id), bench.lay)
    bench.store_s = time.perf_counter() - t
    del cache_a

    rows = []
    for i, p in enumerate(a.prefixes):
        b = torch.cat([prefix[:, :p], torch.randint(0, a.vocab, (1, a.suffix), generator=g)], dim=1)
        assert not torch.equal(b[:, p : p + a.block_size], req_a[:, p : p + a.block_size])
        if i == 0:  # warm-up of both paths (first calls, shapes, connections), untimed
            bench.recompute(b)
            bench.cached(b)
        rec = [bench.recompute(b) for _ in range(a.repeats)]
        cac = [bench.cached(b) for _ in range(a.repeats)]
        tok = rec[0][1]
        assert all(r[1] == tok for r in rec) and all(c["tok"] == tok for c in cac), "first tokens differ"
        dlogit = max(float((c["logits"] - rec[0][2]).abs().max()) for c in cac)
        n = cac[0]["blocks"]
        assert n == p // a.block_size, f"matched {n} blocks of {p // a.block_size}"
        hashes = block_hashes(b[0], a.block_size, a.model_id)[:n]
        bound = med([bench.refetch(hashes) for _ in range(max(a.repeats, 3))])
        nbytes = cac[0]["bytes"]
        row = dict(
            prefix_tokens=p, suffix_tokens=a.suffix, blocks=n, entries=cac[0]["entries"], bytes=nbytes,
            ttft_recompute_s=med([r[0] for r in rec]), ttft_ctxpod_s=med([c["ttft"] for c in cac]),
            fetch_s=med([c["fetch"] for c in cac]), match_s=med([c["match"] for c in cac]),
            build_s=med([c["build"] for c in cac]), suffix_s=med([c["suffix"] for c in cac]),
            cxp1_bytes_per_s=nbytes / bound, fetch_bound_s=bound,
            first_token=tok, max_abs_logit_diff=dlogit,
            ttft_recompute_all_s=[r[0] for r in rec], ttft_ctxpod_all_s=[c["ttft"] for c in cac],
        )
        row["speedup"] = row["ttft_recompute_s"] / row["ttft_ctxpod_s"]
        row["fetch_share"] = row["fetch_s"] / row["ttft_ctxpod_s"]
        row["fetch_vs_bound"] = row["fetch_s"] / bound
        rows.append(row)
        print(f"prefix {p}: recompute {row['ttft_recompute_s']:.3f} s, ctxpod {row['ttft_ctxpod_s']:.3f} s",
              file=sys.stderr, flush=True)
    return rows


def report(a, bench: Bench, rows: list[dict], url: str, own: bool, total: float) -> None:
    lay = bench.lay
    print("# TTFT: prefix from ctxpod vs recompute\n")
    print(f"- model: random Llama, hidden {a.hidden}, {a.layers} layers, {a.heads} heads, {a.kv_heads} KV heads "
          f"(head_dim {lay.head_dim}), FFN {a.intermediate}, vocab {a.vocab}, float32, sdpa; "
          f"torch {torch.__version__}, transformers {transformers.__version__}, {a.threads} threads")
    print(f"- blocks of {a.block_size} tokens; one entry per (block, layer, K|V) = {lay.block_bytes} bytes; "
          f"KV {lay.block_bytes * 2 * a.layers // a.block_size} bytes/token")
    print(f"- node: {'own, ' + a.ctxpod_bin if own else url}; suffix {a.suffix} tokens; median of {a.repeats}")
    print(f"- request A ({max(a.prefixes) + a.suffix} tokens): prefill {bench.prefill_a_s:.2f} s, "
          f"stored {bench.stored} bytes in {bench.store_s:.2f} s; landing tensor "
          f"{bench.landing.numel() * 4} bytes registered in {bench.register_s * 1e3:.2f} ms")
    print("- fetch = hash + match_prefix + prefetch + wait; build = the one copy per layer into the cache; "
          "bound = bytes / CXP1 bandwidth, measured by prefetching the same blocks again\n")
    print("| prefix | blocks | entries | bytes fetched | TTFT recompute (s) | TTFT ctxpod (s) | speedup "
          "| fetch (s) | of which hash+match (s) | build (s) | suffix prefill (s) | fetch share | CXP1 GB/s "
          "| fetch bound (s) | fetch vs bound | max abs Δlogit |")
    print("|" + "---:|" * 16)
    for r in rows:
        print(f"| {r['prefix_tokens']} | {r['blocks']} | {r['entries']} | {r['bytes']} "
              f"| {r['ttft_recompute_s']:.3f} | {r['ttft_ctxpod_s']:.3f} | {r['speedup']:.1f}x "
              f"| {r['fetch_s']:.4f} | {r['match_s']:.4f} | {r['build_s']:.4f} | {r['suffix_s']:.4f} "
              f"| {r['fetch_share']:.0%} "
              f"| {r['cxp1_bytes_per_s'] / 1e9:.2f} | {r['fetch_bound_s']:.4f} | {r['fetch_vs_bound']:.2f}x "
              f"| {r['max_abs_logit_diff']:.1e} |")
    print(f"\nfirst tokens equal in every run; total {total:.0f} s")
    if a.json:
        out = dict(config={k: v for k, v in vars(a).items() if k != "json"}, torch=torch.__version__,
                   transformers=transformers.__version__, node=a.ctxpod_bin if own else url,
                   prefill_a_s=bench.prefill_a_s, stored_bytes=bench.stored, store_s=bench.store_s, rows=rows,
                   total_s=total)
        Path(a.json).write_text(json.dumps(out, indent=2) + "\n")


if __name__ == "__main__":
    main()
