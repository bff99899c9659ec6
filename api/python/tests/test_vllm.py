"""vLLM (the official wheel from PyPI, on the CPU) building its tiering offloading manager from
configuration (``TieringOffloadingSpec`` with the ``secondary_tiers`` entry in
docs/INTEGRATIONS.md), its CPU tier over a real shared-memory region, and ctxpod as the
secondary tier loaded from ``module_path``: chunks cascade from the CPU tier to a real node
and are promoted back into another engine's CPU tier byte for byte."""

from __future__ import annotations

import json
import os
import time
import uuid

import numpy as np
import pytest
from conftest import doc_snippet, engine

vllm = engine("vllm")

from vllm.v1.kv_offload.base import LookupResult, ReqContext, ScheduleEndContext, make_offload_key  # noqa: E402
from vllm.v1.kv_offload.config import (  # noqa: E402
    OffloadingCacheConfig,
    OffloadingConfig,
    OffloadingGroupConfig,
    OffloadingModelConfig,
    OffloadingParallelConfig,
)
from vllm.v1.kv_offload.tiering.spec import TieringOffloadingSpec  # noqa: E402

from ctxpod.integrations.vllm import CtxpodSecondaryTier  # noqa: E402


ROW = 16 << 10  # bytes of one chunk in the CPU tier (one worker, one block per chunk)
CHUNKS = 8
STEP = ScheduleEndContext(new_req_ids=[], preempted_req_ids=())


def manager(url: str, model: str = "acme/llama-tiny", extra: dict | None = None, *,
            block_bytes: int = ROW, blocks_per_chunk: int = 1, chunks: int = CHUNKS):
    """vLLM's tiering manager, built from the docs' kv_connector_extra_config (``extra``:
    more settings of the ctxpod tier's entry); a chunk is ``blocks_per_chunk`` GPU blocks of
    16 tokens, ``block_bytes`` each."""
    kv = json.loads(doc_snippet("vllm-kv-transfer-config").replace("http://10.0.0.5:7400", url))
    kv["kv_connector_extra_config"]["secondary_tiers"][0].update(extra or {})
    extra = dict(kv["kv_connector_extra_config"], cpu_bytes_to_use=chunks * block_bytes * blocks_per_chunk)
    cfg = OffloadingConfig(
        groups=(OffloadingGroupConfig(tokens_per_block=16, layer_names=("layers.0", "layers.1"), group_id=0),),
        worker_kv_bytes_per_block=block_bytes,
        enable_kv_cache_events=False,
        extra_config=extra,
        engine_id=f"ctxpod-test-{uuid.uuid4().hex[:8]}",
        model=OffloadingModelConfig(name=model, dtype="bfloat16"),
        cache=OffloadingCacheConfig(tokens_per_hash=16 * blocks_per_chunk, blocks_per_chunk=blocks_per_chunk),
        parallel=OffloadingParallelConfig(
            rank=0, world_size=1, tp_size=1, pp_size=1, pcp_size=1, dcp_size=1,
            data_parallel_index=0, data_parallel_size=1, data_parallel_rank_local=None,
            is_parallelism_agnostic=True,
        ),
    )
    mgr = TieringOffloadingSpec(cfg).get_manager()
    (tier,) = mgr.secondary_tiers
    assert isinstance(tier, CtxpodSecondaryTier)
    return mgr, tier


def drive(mgr, until, what: str, limit_s: float = 30) -> None:
    """Scheduler steps until ``until()`` (bounded)."""
    deadline = time.monotonic() + limit_s
    while not until():
        assert time.monotonic() < deadline, f"{what} within {limit_s} s"
        mgr.on_schedule_end(STEP)
        time.sleep(0.005)


def chunk_keys(n: int) -> list:
    return [make_offload_key(os.urandom(32), 0) for _ in range(n)]


def store(mgr, tier, keys, seed: int) -> list[bytes]:
    """As the connector does after a GPU -> CPU store: rows written, the store completed."""
    ctx = ReqContext(req_id=f"store-{seed}")
    mgr.on_new_request(ctx)
    out = mgr.prepare_store(keys, ctx)
    rows = np.asarray(mgr.primary_tier.get_kv_memoryview())
    data = []
    for c in out.store_spec.chunk_ids:
        row = os.urandom(tier.block_size_bytes)
        rows[int(c)] = np.frombuffer(row, dtype=np.int8)
        data.append(row)
    mgr.complete_store(keys, ctx, success=True)
    drive(mgr, lambda: all(tier.space.batch_exists([bytes(k) for k in keys])) and not mgr.has_pending_work(),
          "the cascade to ctxpod")
    mgr.on_request_finished(ctx)
    return data


def promote(mgr, keys, data: list[bytes], req_id: str) -> ReqContext:
    """A new request of ``mgr``'s engine finds ``keys`` (through ctxpod) and loads them into
    its CPU tier, row for row ``data``; the request's context (its load not yet completed)."""
    ctx = ReqContext(req_id=req_id)
    mgr.on_new_request(ctx)
    drive(mgr, lambda: all(mgr.lookup(k, ctx) is LookupResult.HIT for k in keys), "the promotion from ctxpod")
    spec = mgr.prepare_load(keys, ctx)
    rows = np.asarray(mgr.primary_tier.get_kv_memoryview())
    assert [rows[int(c)].tobytes() for c in spec.chunk_ids] == data
    return ctx


def test_chunks_cascade_to_ctxpod_and_are_promoted_into_another_engine(node):
    a, ta = manager(node.http)
    b, tb = manager(node.http)
    try:
        keys = chunk_keys(4)
        data = store(a, ta, keys, 1)
        assert ta.space.namespace == tb.space.namespace
        # Engine b has an empty CPU tier: its lookups find the chunks in ctxpod.
        ctx = promote(b, keys, data, "load")
        assert tb.stats["loaded_chunks"] == 4
        b.complete_load(keys, ctx)
        # Keys nobody stored end as a miss (after the batched async lookup answers).
        absent = chunk_keys(2)
        drive(b, lambda: all(b.lookup(k, ctx) is LookupResult.MISS for k in absent), "the misses")
        b.on_request_finished(ctx)
    finally:
        a.shutdown()
        b.shutdown()


def test_two_models_never_see_each_others_chunks(node):
    a, ta = manager(node.http, model="acme/model-a")
    z, tz = manager(node.http, model="globex/model-b")
    try:
        keys = chunk_keys(2)
        store(a, ta, keys, 2)
        assert ta.space.namespace != tz.space.namespace
        ctx = ReqContext(req_id="other")
        z.on_new_request(ctx)
        drive(z, lambda: all(z.lookup(k, ctx) is LookupResult.MISS for k in keys), "model b's misses")
    finally:
        a.shutdown()
        z.shutdown()


def test_a_chunk_held_already_is_not_sent_again(node):
    a, ta = manager(node.http)
    try:
        keys = chunk_keys(2)
        store(a, ta, keys, 3)
        assert ta.stats["stored_chunks"] == 2
        # The same keys from another engine: the store asks first and sends nothing.
        b, tb = manager(node.http)
        try:
            store(b, tb, keys, 4)
            assert (tb.stats["stored_chunks"], tb.stats["skipped_chunks"]) == (0, 2)
        finally:
            b.shutdown()
    finally:
        a.shutdown()


#: Llama-3-70B's KV of one 16-token GPU block: 80 layers, K and V, 8 heads of 128 dims, bf16.
LLAMA3_70B_BLOCK = 80 * 16 * 2 * 8 * 128 * 2


def test_real_model_chunks_cascade_and_are_promoted_across_kill_9(tmp_path):
    """Real model chunks (issue #34): Llama-3-70B's KV of one 16-token GPU block is 5 MiB;
    offloaded one block a chunk (vLLM's default: the offloaded block is the GPU block) a
    chunk is 5 MiB, four blocks a chunk (64 tokens) 20 MiB, a value over one record. Both
    cascade from engine a's CPU tier to the pod; the node is killed (SIGKILL) and started
    again; engine b's lookups find them and promote them into its CPU tier byte for byte."""
    from conftest import Node

    node = Node(tmp_path, "vllm-real", capacity="1GiB")
    try:
        stored = []
        for per_chunk in (1, 4):
            a, ta = manager(node.http, "meta-llama/Meta-Llama-3-70B", block_bytes=LLAMA3_70B_BLOCK,
                            blocks_per_chunk=per_chunk, chunks=2)
            try:
                assert ta.block_size_bytes == per_chunk * LLAMA3_70B_BLOCK
                keys = chunk_keys(2)
                stored.append((per_chunk, keys, store(a, ta, keys, 70 + per_chunk)))
            finally:
                a.shutdown()
        node.kill()
        node.start()
        for per_chunk, keys, data in stored:
            b, tb = manager(node.http, "meta-llama/Meta-Llama-3-70B", block_bytes=LLAMA3_70B_BLOCK,
                            blocks_per_chunk=per_chunk, chunks=2)
            try:
                ctx = promote(b, keys, data, f"load-70b-{per_chunk}")
                assert tb.stats["loaded_chunks"] == 2
                b.complete_load(keys, ctx)
                b.on_request_finished(ctx)
            finally:
                b.shutdown()
    finally:
        node.stop()


def test_a_chunk_over_the_pods_value_limit_is_refused_when_vllm_builds_the_tier(limited_node):
    """Over a pod whose nodes store values of at most 16 MiB, Llama-3-70B's 64-token chunk
    (20 MiB) makes vLLM's build of the tier fail, saying why and what to change, instead of
    every chunk being refused later and every lookup missing."""
    from ctxpod import InvalidRequest

    url = limited_node.http
    with pytest.raises(InvalidRequest) as e:
        manager(url, "meta-llama/Meta-Llama-3-70B", block_bytes=LLAMA3_70B_BLOCK, blocks_per_chunk=4, chunks=2)
    said = str(e.value)
    assert f"{4 * LLAMA3_70B_BLOCK} bytes" in said and f"value limit of {16 << 20} bytes" in said, said
    a, _ = manager(url, "meta-llama/Meta-Llama-3-70B", block_bytes=LLAMA3_70B_BLOCK, chunks=2)
    a.shutdown()


def test_bad_settings_are_refused(node):
    from ctxpod import InvalidRequest

    kv = json.loads(doc_snippet("vllm-kv-transfer-config"))
    (entry,) = kv["kv_connector_extra_config"]["secondary_tiers"]
    with pytest.raises(InvalidRequest, match="unknown setting"):
        CtxpodSecondaryTier(None, memoryview(bytearray(ROW)).cast("b", (1, ROW)), entry["type"],
                            url=node.http, colour="blue")


def test_a_url_of_another_http_service_is_refused_naming_it(other_http_service):
    """A ``url`` where an HTTP service that is not a ctxpod node answers is refused when vLLM
    builds the tier, naming the URL and what was expected."""
    from ctxpod import InvalidRequest

    url = other_http_service.url
    with pytest.raises(InvalidRequest) as e:
        manager(url)
    msg = str(e.value)
    assert "url" in msg and url in msg and "not a ctxpod node" in msg, msg
