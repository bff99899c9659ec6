#!/usr/bin/env python3
"""The SGLang and vLLM connectors moving KV through a node, through the engines' own classes:

- sglang: `StorageBackendFactory.create_backend("dynamic")` (ctxpod.integrations.sglang) with
  an `MHATokenToKVPoolHost` on the CPU (bf16, 8 layers, 8 KV heads, head dim 128, pages of 64
  tokens: 1 MiB K + 1 MiB V a page): `batch_set_v1` of BATCH pages at a time, then
  `batch_get_v1` into other host slots, every byte compared;
- vllm: `TieringOffloadingSpec.get_manager()` with the ctxpod secondary tier
  (ctxpod.integrations.vllm), rows of 2 MiB: chunks cascaded from one engine's CPU tier until
  held, then promoted into another engine's, every byte compared.

    ~/.cache/ctxpod-venv/bin/python bench/connectors_bench.py --ctxpod-bin ~/.cache/ctxpod-target/debug/ctxpod
"""

from __future__ import annotations

import argparse
import hashlib
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from benchnode import start_node  # noqa: E402


def sglang(url: str, pages: int, batch: int) -> dict:
    from sglang.srt.mem_cache.device_pool_info import KVBufferLayout, KVBuffers, MHABufferInfo
    from sglang.srt.mem_cache.hicache_storage import HiCacheStorageConfig
    from sglang.srt.mem_cache.pool_host.base import host_memory_budget_scope
    from sglang.srt.mem_cache.pool_host.mha import MHATokenToKVPoolHost
    from sglang.srt.mem_cache.storage import StorageBackendFactory

    layers, heads, dim, page, dt = 8, 8, 128, 64, torch.bfloat16
    tokens = 2 * pages * page
    k = tuple(torch.zeros(tokens + page, heads, dim, dtype=dt) for _ in range(layers))
    v = tuple(torch.zeros(tokens + page, heads, dim, dtype=dt) for _ in range(layers))
    table = lambda ts: torch.tensor([t.data_ptr() for t in ts], dtype=torch.uint64)  # noqa: E731
    info = MHABufferInfo(buffers=KVBuffers(k=k, v=v, k_data_ptrs=table(k), v_data_ptrs=table(v),
                                           layout=KVBufferLayout.NHD),
                         page_size=page, head_num=heads, head_dim=dim, v_head_dim=dim, dtype=dt,
                         device=torch.device("cpu"))
    with host_memory_budget_scope(1 << 40):
        pool = MHATokenToKVPoolHost(info, 1.0, 0, page, "page_first", pin_memory=False, device="cpu",
                                    device_capacity_tokens=tokens, start_layer=0, end_layer=layers - 1)
    extra = {"backend_name": "ctxpod", "module_path": "ctxpod.integrations.sglang",
             "class_name": "CtxpodHiCacheStorage", "interface_v1": 1, "url": url}
    cfg = HiCacheStorageConfig(0, 1, 0, 1, 0, 1, False, False, True, "bench/model", extra_config=extra)
    b = StorageBackendFactory.create_backend("dynamic", cfg, pool)
    b.register_mem_pool_host(pool)
    src, dst = pool.alloc(pages * page), pool.alloc(pages * page)
    pool.kv_buffer.view(torch.uint8).copy_(torch.randint(0, 256, pool.kv_buffer.view(torch.uint8).shape,
                                                         dtype=torch.uint8))
    keys = [hashlib.sha256(f"bench/{i}".encode()).hexdigest() for i in range(pages)]
    page_bytes = 2 * layers * page * heads * dim * 2
    set_s = get_s = 0.0
    for at in range(0, pages, batch):
        ks, idx = keys[at:at + batch], src[at * page:(at + batch) * page]
        t0 = time.perf_counter()
        assert all(b.batch_set_v1(ks, idx))
        set_s += time.perf_counter() - t0
    for at in range(0, pages, batch):
        ks, idx = keys[at:at + batch], dst[at * page:(at + batch) * page]
        t0 = time.perf_counter()
        assert all(b.batch_get_v1(ks, idx))
        get_s += time.perf_counter() - t0
    # Bytes, not values: random bits make NaNs, which never compare equal.
    bad = sum(
        1 for p in range(pages)
        if not torch.equal(pool.get_data_page(int(src[p * page])).view(torch.uint8),
                           pool.get_data_page(int(dst[p * page])).view(torch.uint8))
    )
    b.close()
    n = pages * page_bytes
    return {"what": f"sglang pages of {page_bytes >> 20} MiB (K+V), batch {batch}", "n": pages,
            "put": n / set_s / 1e9, "get": n / get_s / 1e9, "bad": bad}


def vllm(url: str, chunks: int) -> dict:
    import json  # noqa: F401
    import uuid

    from vllm.v1.kv_offload.base import LookupResult, ReqContext, ScheduleEndContext, make_offload_key
    from vllm.v1.kv_offload.config import (OffloadingCacheConfig, OffloadingConfig, OffloadingGroupConfig,
                                           OffloadingModelConfig, OffloadingParallelConfig)
    from vllm.v1.kv_offload.tiering.spec import TieringOffloadingSpec

    row = 2 << 20
    step = ScheduleEndContext(new_req_ids=[], preempted_req_ids=())

    def manager():
        extra = {"spec_name": "TieringOffloadingSpec", "cpu_bytes_to_use": (chunks + 1) * row,
                 "secondary_tiers": [{"type": "CtxpodSecondaryTier", "module_path": "ctxpod.integrations.vllm",
                                      "url": url}]}
        cfg = OffloadingConfig(
            groups=(OffloadingGroupConfig(tokens_per_block=16, layer_names=("l0",), group_id=0),),
            worker_kv_bytes_per_block=row, enable_kv_cache_events=False, extra_config=extra,
            engine_id=f"bench-{uuid.uuid4().hex[:8]}", model=OffloadingModelConfig(name="bench/model", dtype="bfloat16"),
            cache=OffloadingCacheConfig(tokens_per_hash=16, blocks_per_chunk=1),
            parallel=OffloadingParallelConfig(rank=0, world_size=1, tp_size=1, pp_size=1, pcp_size=1, dcp_size=1,
                                              data_parallel_index=0, data_parallel_size=1,
                                              data_parallel_rank_local=None, is_parallelism_agnostic=True))
        m = TieringOffloadingSpec(cfg).get_manager()
        return m, m.secondary_tiers[0]

    def drive(m, done):
        deadline = time.monotonic() + 120
        while not done():
            assert time.monotonic() < deadline
            m.on_schedule_end(step)
            time.sleep(0.0005)

    keys = [make_offload_key(os.urandom(32), 0) for _ in range(chunks)]
    a, ta = manager()
    ctx = ReqContext(req_id="store")
    a.on_new_request(ctx)
    out = a.prepare_store(keys, ctx)
    rows = np.asarray(a.primary_tier.get_kv_memoryview())
    want = {}
    for k, c in zip(keys, out.store_spec.chunk_ids):
        rows[int(c)] = np.frombuffer(os.urandom(row), dtype=np.int8)
        want[k] = rows[int(c)].tobytes()
    t0 = time.perf_counter()
    a.complete_store(keys, ctx, success=True)
    drive(a, lambda: ta.stats["stored_chunks"] == chunks and not a.has_pending_work())
    put_s = time.perf_counter() - t0
    b, tb = manager()
    ctx2 = ReqContext(req_id="load")
    b.on_new_request(ctx2)
    t0 = time.perf_counter()
    drive(b, lambda: all(b.lookup(k, ctx2) is LookupResult.HIT for k in keys))
    get_s = time.perf_counter() - t0
    spec = b.prepare_load(keys, ctx2)
    rows2 = np.asarray(b.primary_tier.get_kv_memoryview())
    bad = sum(1 for k, c in zip(keys, spec.chunk_ids) if rows2[int(c)].tobytes() != want[k])
    b.complete_load(keys, ctx2)
    del rows, rows2  # the views into the CPU tiers' mmaps, before vLLM frees them
    a.shutdown()
    b.shutdown()
    n = chunks * row
    return {"what": "vllm chunks of 2 MiB (one request: cascade, then promotion with its lookups)", "n": chunks,
            "put": n / put_s / 1e9, "get": n / get_s / 1e9, "bad": bad}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--ctxpod-bin", required=True)
    p.add_argument("--pages", type=int, default=128)
    p.add_argument("--batch", type=int, default=16)
    p.add_argument("--chunks", type=int, default=128)
    a = p.parse_args()
    root = tempfile.mkdtemp(prefix="ctxpod-connectors-bench-")
    node, url = start_node(a.ctxpod_bin, f"{root}/node")
    try:
        rows = [sglang(url, a.pages, a.batch), vllm(url, a.chunks)]
    finally:
        node.terminate()
        node.wait(timeout=20)
        shutil.rmtree(root, ignore_errors=True)
    print("| connector | units | store GB/s | load GB/s | mismatches |")
    print("|---|---:|---:|---:|---:|")
    for r in rows:
        print(f"| {r['what']} | {r['n']} | {r['put']:.3f} | {r['get']:.3f} | {r['bad']} |")


if __name__ == "__main__":
    main()
