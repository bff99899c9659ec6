"""LMCache 0.5.x (the real package from PyPI, on the CPU) loading ctxpod as a remote storage
plugin through its own loader, from the configuration in docs/INTEGRATIONS.md, and storing
and loading KV chunks byte for byte through a real node."""

from __future__ import annotations

import asyncio
import os
import threading
import time

import pytest
from conftest import Node, doc_snippet, engine

os.environ.setdefault("LMCACHE_TRACK_USAGE", "false")
lmcache = engine("lmcache")
torch = engine("torch")

import yaml  # noqa: E402 (lmcache's own dependency)
from lmcache.utils import CacheEngineKey  # noqa: E402
from lmcache.v1.config import LMCacheEngineConfig  # noqa: E402
from lmcache.v1.metadata import LMCacheMetadata  # noqa: E402
from lmcache.v1.storage_backend.local_cpu_backend import LocalCPUBackend  # noqa: E402
from lmcache.v1.storage_backend.remote_backend import RemoteBackend  # noqa: E402

import ctxpod  # noqa: E402
from ctxpod.integrations import lmcache as plugin  # noqa: E402


# (layers, K|V, tokens of a chunk, KV heads, head dim): 64 KiB chunks of bf16.
KV_SHAPE = (4, 2, 16, 4, 16)
CHUNK = 16


def config(url: str, chunk_size: int = CHUNK, cpu_gb: float = 0.05, **extra) -> LMCacheEngineConfig:
    """The docs' configuration, with the test node's URL."""
    d = yaml.safe_load(doc_snippet("lmcache-config").replace("http://10.0.0.5:7400", url))
    d.update(chunk_size=chunk_size, max_local_cpu_size=cpu_gb, lmcache_instance_id="t")
    d["extra_config"].update(extra)
    return LMCacheEngineConfig.from_dict(d)


def metadata(model: str) -> LMCacheMetadata:
    return LMCacheMetadata(
        model_name=model, world_size=1, local_world_size=1, worker_id=0, local_worker_id=0,
        kv_dtype=torch.bfloat16, kv_shape=KV_SHAPE,
    )


class Backends:
    """LMCache's LocalCPUBackend and RemoteBackend (plugin "ctxpod"), on a loop thread."""

    def __init__(self, url: str, model: str = "acme/llama-tiny", ctx=None, **extra) -> None:
        """``ctx``: a ConnectorContext whose configuration and metadata to use instead."""
        self.cfg, self.md = (config(url, **extra), metadata(model)) if ctx is None else (ctx.config, ctx.metadata)
        self.tokens = CHUNK if ctx is None else ctx.metadata.chunk_size
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self.thread.start()
        self.local = LocalCPUBackend(self.cfg, self.md, dst_device="cpu")
        self.remote = RemoteBackend(self.cfg, self.md, self.loop, self.local, dst_device="cpu", plugin_name="ctxpod")
        # LMCache logs a connector that failed to build and goes on without it.
        assert self.remote.connection is not None, "LMCache did not build the ctxpod connector"

    def key(self, h: int) -> CacheEngineKey:
        return CacheEngineKey(self.md.model_name, 1, 0, h, torch.bfloat16)

    def chunk(self, seed: int, tokens: int | None = None):
        tokens = self.tokens if tokens is None else tokens
        obj = self.local.allocate(self.md.get_shapes(tokens), self.md.get_dtypes())
        assert obj is not None
        g = torch.Generator().manual_seed(seed)
        obj.raw_tensor.copy_(torch.randint(0, 256, (obj.get_size(),), dtype=torch.uint8, generator=g))
        return obj, bytes(obj.byte_array)

    def put(self, keys, objs) -> None:
        """LMCache's batched put is fire-and-forget on its loop (its wrapper releases the
        objects after the put): wait until it is held."""
        self.remote.batched_submit_put_task(keys, objs)
        deadline = time.monotonic() + 30
        while self.remote.batched_contains(keys) < len(keys):
            assert time.monotonic() < deadline, "the puts did not land within 30 s"
            time.sleep(0.02)

    def read(self, keys) -> list:
        """LMCache's blocking batched get: each chunk's bytes and shape (None for a miss);
        the buffers go back to LMCache."""
        out = []
        for o in self.remote.batched_get_blocking(keys):
            if o is None:
                out.append(None)
            else:
                out.append((bytes(o.byte_array), tuple(o.get_shapes()[0])))
                o.ref_count_down()
        return out

    def close(self) -> None:
        self.remote.close()
        self.local.close()
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(5)


@pytest.fixture()
def backends(node):
    b = Backends(node.http)
    yield b
    b.close()


def test_the_plugin_loads_from_lmcache_config_and_round_trips_chunks(backends, node):
    b = backends
    keys = [b.key(0x1000 + i) for i in range(6)]
    objs, data = zip(*(b.chunk(i) for i in range(6)))
    assert b.remote.batched_contains(keys) == 0
    b.put(keys, list(objs))
    shape = tuple(objs[0].get_shapes()[0])
    assert b.read(keys) == [(d, shape) for d in data]
    # The chunks are in the model's namespace, under <worker>/<hash>, with LMCache's header.
    ns = plugin.namespace_of("lmcache", keys[0])
    s = ctxpod.Store.connect(node.http, namespace=ns)
    raw = s.get(plugin.key_of(keys[0]))
    assert raw is not None and raw.endswith(data[0]) and len(raw) == len(data[0]) + 28
    # The leading run held, as LMCache's lookup asks: a gap ends it.
    gap = keys[:3] + [b.key(0xdead)] + keys[3:]
    assert b.remote.batched_contains(gap) == 3
    assert b.remote.contains(keys[5])
    assert b.read([b.key(0xbeef)]) == [None]


def test_partial_chunks_come_back_with_their_shape(backends):
    b = backends
    obj, data = b.chunk(7, tokens=5)
    key = b.key(0x2000)
    b.put([key], [obj])
    ((got, shape),) = b.read([key])
    assert got == data
    assert shape[2] == 5


def test_async_lookup_pins_the_prefix_and_the_async_get_stops_at_a_miss(backends, node):
    b = backends
    keys = [b.key(0x3000 + i) for i in range(4)]
    objs, data = zip(*(b.chunk(100 + i) for i in range(4)))
    b.put(keys, list(objs))
    conn = b.remote.connection
    asked = keys[:2] + [b.key(0x3fff)] + keys[2:]
    n = asyncio.run_coroutine_threadsafe(conn.batched_async_contains("l1", asked, pin=True), b.loop).result(30)
    assert n == 2
    s = ctxpod.Store.connect(node.http, namespace=plugin.namespace_of("lmcache", keys[0]))
    # Pinned by the lookup: unpin says so (and ends the pins).
    assert s.unpin([plugin.key_of(k) for k in keys[:2]]) == 2
    got = asyncio.run_coroutine_threadsafe(conn.batched_get_non_blocking("l1", asked), b.loop).result(30)
    assert [bytes(o.byte_array) for o in got] == list(data[:2])
    for o in got:
        o.ref_count_down()


def test_remove_and_exists(backends):
    b = backends
    obj, _ = b.chunk(9)
    key = b.key(0x4000)
    b.put([key], [obj])
    assert b.remote.connection.exists_sync(key)
    assert b.remote.remove(key, force=True)
    assert not b.remote.contains(key)


def test_two_models_never_see_each_others_chunks(node):
    a = Backends(node.http, model="acme/model-a")
    z = Backends(node.http, model="globex/model-b")
    try:
        obj, data = a.chunk(11)
        ka = a.key(0x5000)
        a.put([ka], [obj])
        kz = z.key(0x5000)  # the same chunk hash, another model
        assert z.remote.batched_contains([kz]) == 0
        assert z.read([kz]) == [None]
        assert a.read([ka])[0][0] == data
        assert plugin.namespace_of("lmcache", ka) != plugin.namespace_of("lmcache", kz)
    finally:
        a.close()
        z.close()


def test_list_spells_every_stored_chunk_as_lmcache_does(node):
    """``list()`` over two models, two workers and a tagged tenant: every chunk stored,
    as ``CacheEngineKey.to_string`` spells it, and nothing else of theirs."""
    a = Backends(node.http, model="acme/list-a")
    z = Backends(node.http, model="globex/list-b")
    try:
        keys = [a.key(0x7000 + i) for i in range(3)]
        keys.append(CacheEngineKey("acme/list-a", 2, 1, 0x7100, torch.bfloat16))
        keys.append(CacheEngineKey("acme/list-a", 1, 0, 0x7200, torch.bfloat16, {"lmcache.tag.user": "alice"}))
        keys.append(z.key(0x7000))
        for k in keys:
            obj, _ = a.chunk(k.chunk_hash)
            a.put([k], [obj])
        # 1100 chunks in one namespace: more than one page of the listing.
        many = [z.key(0x10000 + i) for i in range(1100)]
        for at in range(0, len(many), 100):
            objs = [z.chunk(i)[0] for i in range(100)]
            z.put(many[at:at + 100], objs)
        keys += many
        listed = asyncio.run_coroutine_threadsafe(a.remote.connection.list(), a.loop).result(60)
        mine = [k for k in listed if k.split("@")[0] in ("acme/list-a", "globex/list-b")]
        assert sorted(mine) == sorted(k.to_string() for k in keys)
        assert len(mine) == len(set(mine))
        assert {CacheEngineKey.from_string(k) for k in mine} == set(keys)
    finally:
        a.close()
        z.close()


def test_without_chunk_headers_chunks_are_read_into_lmcache_buffers(node):
    b = Backends(node.http, model="acme/raw", save_chunk_meta=False)
    try:
        keys = [b.key(0x6000 + i) for i in range(3)]
        objs, data = zip(*(b.chunk(200 + i) for i in range(3)))
        b.put(keys, list(objs))
        assert [g for g, _ in b.read(keys)] == list(data)
        s = ctxpod.Store.connect(node.http, namespace=plugin.namespace_of("lmcache", keys[0]))
        assert s.get(plugin.key_of(keys[0])) == data[0]
    finally:
        b.close()


def test_bad_settings_are_refused_with_the_setting_named(node):
    from lmcache.v1.storage_backend.connector import ConnectorContext

    cfg, md = config(node.http, **{"remote_storage_plugin.ctxpod.pin_ttl": "5"}), metadata("m")
    ctx = ConnectorContext("plugin://ctxpod", asyncio.new_event_loop(), None, cfg, md, "ctxpod")
    with pytest.raises(ctxpod.InvalidRequest, match="unknown setting 'remote_storage_plugin.ctxpod.pin_ttl'"):
        plugin.CtxpodConnectorAdapter().create_connector(ctx)
    cfg = config(node.http, **{"remote_storage_plugin.ctxpod.url": ""})
    ctx = ConnectorContext("plugin://ctxpod", asyncio.new_event_loop(), None, cfg, md, "ctxpod")
    with pytest.raises(ctxpod.InvalidRequest, match="set `url`"):
        plugin.CtxpodConnectorAdapter().create_connector(ctx)


# Llama-3-8B's KV cache: 32 layers, K and V, 8 KV heads of 128 dims, bf16: 128 KiB a token.
LLAMA3_8B_LAYERS, LLAMA3_8B_HEADS, LLAMA3_8B_DIM = 32, 8, 128


def llama3_8b_context(url: str, chunk_size: int, **extra):
    """LMCache's context for building the plugin's connector for Llama-3-8B's KV at
    ``chunk_size`` tokens a chunk (the docs' configuration otherwise)."""
    from lmcache.v1.storage_backend.connector import ConnectorContext

    d = yaml.safe_load(doc_snippet("lmcache-config").replace("http://10.0.0.5:7400", url))
    d.update(chunk_size=chunk_size, max_local_cpu_size=0.2, lmcache_instance_id="t")
    d["extra_config"].update(extra)
    md = LMCacheMetadata(
        model_name="meta-llama/Meta-Llama-3-8B", world_size=1, local_world_size=1, worker_id=0,
        local_worker_id=0, kv_dtype=torch.bfloat16, chunk_size=chunk_size,
        kv_shape=(LLAMA3_8B_LAYERS, 2, chunk_size, LLAMA3_8B_HEADS, LLAMA3_8B_DIM),
    )
    cfg = LMCacheEngineConfig.from_dict(d)
    return ConnectorContext("plugin://ctxpod", asyncio.new_event_loop(), None, cfg, md, "ctxpod")


def test_a_chunk_over_the_pods_value_limit_is_refused_when_lmcache_builds_the_connector(limited_node):
    """LMCache's default chunk_size (256) of Llama-3-8B's KV is 32 MiB: over a pod whose
    nodes store at most 16 MiB, the connector refuses to be built, naming the sizes, the
    limit and the chunk_size that fits, instead of letting every put be refused later and
    every lookup miss (issue #34)."""
    url = limited_node.http
    with pytest.raises(ctxpod.InvalidRequest) as e:
        plugin.CtxpodConnectorAdapter().create_connector(llama3_8b_context(url, 256))
    said = str(e.value)
    assert f"{32 * 2**20 + 28} bytes" in said and "chunk_size 256" in said
    assert f"value limit of {16 * 2**20} bytes" in said and "value_bytes_max" in said
    # 127 tokens: 127 x 128 KiB + the 28-byte header; without the header, 128.
    assert "at most 127 tokens" in said
    with pytest.raises(ctxpod.InvalidRequest, match="at most 128 tokens"):
        plugin.CtxpodConnectorAdapter().create_connector(llama3_8b_context(url, 256, save_chunk_meta=False))
    # A chunk size that fits builds, and LMCache's backends store and read back a full
    # chunk of that shape (8 MiB + 28 B: just over one record, three extents) byte for byte.
    b = Backends(url, ctx=llama3_8b_context(url, 64))
    try:
        obj, data = b.chunk(8)
        assert len(data) == 64 * 128 * 1024
        b.put([b.key(8)], [obj])
        assert b.read([b.key(8)])[0][0] == data
    finally:
        b.close()


def test_a_wrong_token_is_refused(auth_node):
    cfg = config(auth_node.http, **{"remote_storage_plugin.ctxpod.token": "not-a-token"})
    from lmcache.v1.storage_backend.connector import ConnectorContext

    ctx = ConnectorContext("plugin://ctxpod", asyncio.new_event_loop(), None, cfg, metadata("m"), "ctxpod")
    with pytest.raises(ctxpod.Unauthorized):
        conn = plugin.CtxpodConnectorAdapter().create_connector(ctx)
        conn.exists_sync(CacheEngineKey("m", 1, 0, 1, torch.bfloat16))


class CpuKV(__import__("lmcache.v1.gpu_connector.mock_gpu_connector", fromlist=["MockGPUConnector"]).MockGPUConnector):
    """A stand-in for LMCache's GPU connector over one CPU tensor, (K|V, layers, tokens,
    heads x head dim): LMCache's own ``MockGPUConnector`` copies nothing, and the engine's
    real connectors need CUDA. Only the copies are ours; the engine around them is LMCache's."""

    def __init__(self, tokens: int, kv_shape: tuple = KV_SHAPE) -> None:
        super().__init__(kv_shape=kv_shape)
        layers, kv, _, heads, dim = kv_shape
        self.kv = torch.zeros(kv, layers, tokens, heads * dim, dtype=torch.bfloat16)

    def batched_from_gpu(self, memory_objs, starts, ends, **kwargs):
        for o, s, e in zip(memory_objs, starts, ends):
            o.tensor.copy_(self.kv[:, :, s:e, :])

    def batched_to_gpu(self, memory_objs, starts, ends, **kwargs):
        for o, s, e in zip(memory_objs, starts, ends):
            if o is not None:
                self.kv[:, :, s:e, :].copy_(o.tensor)


def engine_for(url: str, name: str, tokens: int, md: LMCacheMetadata | None = None, cpu_gb: float = 0.05,
               **extra):
    """An LMCacheEngine over ``tokens`` of KV in CPU memory (``md``: the model's metadata,
    the toy model's by default), configured as the docs say (``extra``: more of its
    ``extra_config``)."""
    from lmcache.utils import mock_up_broadcast_fn, mock_up_broadcast_object_fn
    from lmcache.v1.cache_engine import LMCacheEngineBuilder

    chunk = CHUNK if md is None else md.chunk_size
    md = md or metadata("acme/engine-e2e")
    gpu = CpuKV(tokens, tuple(md.kv_shape))
    cfg = config(url, chunk_size=chunk, cpu_gb=cpu_gb, **extra)
    e = LMCacheEngineBuilder.get_or_create(name, cfg, md, gpu,
                                           mock_up_broadcast_fn, mock_up_broadcast_object_fn)
    e.post_init()
    return e, gpu


def test_the_whole_engine_stores_and_retrieves_kv_through_ctxpod(node):
    """Engine A stores a prompt's KV; engine B, with an empty CPU cache of its own, retrieves
    it from ctxpod through LMCache's storage manager and lands the same tensor."""
    from lmcache.v1.cache_engine import LMCacheEngineBuilder

    n = 4 * CHUNK
    tokens = torch.arange(1000, 1000 + n)
    a, ga = engine_for(node.http, "engine-a", n)
    b, gb = engine_for(node.http, "engine-b", n)
    try:
        g = torch.Generator().manual_seed(42)
        ga.kv.copy_(torch.randn(ga.kv.shape, generator=g).to(torch.bfloat16))
        a.store(tokens)
        deadline = time.monotonic() + 30
        while b.lookup(tokens) < n:
            assert time.monotonic() < deadline, "engine b did not find the prompt within 30 s"
            time.sleep(0.05)
        # What b found is in ctxpod: the model's namespace holds the prompt's 4 chunks (and
        # the block naming the namespace's identity).
        key = CacheEngineKey("acme/engine-e2e", 1, 0, 1, torch.bfloat16)
        s = ctxpod.Store.connect(node.http, namespace=plugin.namespace_of("lmcache", key))
        assert s.namespace_info()["block_count"] == 4 + 1
        assert len([k for k in s.keys() if k != plugin.IDENTITY_KEY]) == 4
        got = b.retrieve(tokens)
        assert int(got.sum()) == n
        assert torch.equal(gb.kv, ga.kv)
        # Another prompt is not there.
        assert b.lookup(torch.arange(5000, 5000 + n)) == 0
    finally:
        LMCacheEngineBuilder.destroy("engine-a")
        LMCacheEngineBuilder.destroy("engine-b")


def llama3_8b_metadata() -> LMCacheMetadata:
    """Llama-3-8B's KV at LMCache's default chunk_size (256 tokens): 32 MiB a chunk."""
    return LMCacheMetadata(
        model_name="meta-llama/Meta-Llama-3-8B", world_size=1, local_world_size=1, worker_id=0,
        local_worker_id=0, kv_dtype=torch.bfloat16, chunk_size=256,
        kv_shape=(LLAMA3_8B_LAYERS, 2, 256, LLAMA3_8B_HEADS, LLAMA3_8B_DIM),
    )


def test_the_whole_engine_stores_llama3_8b_chunks_and_retrieves_them_after_kill_9(tmp_path):
    """Llama-3-8B's KV at LMCache's default chunk_size (256): each chunk is 32 MiB + its
    28-byte header, one value. Engine A stores a 512-token prompt; the node is killed
    (SIGKILL) and started again; engine B, with an empty CPU cache, finds the prompt and
    lands the same tensor, byte for byte (issue #34)."""
    from lmcache.v1.cache_engine import LMCacheEngineBuilder

    node = Node(tmp_path, "llama", capacity="1GiB")
    md = llama3_8b_metadata()
    n = 2 * 256
    tokens = torch.arange(7000, 7000 + n)
    key = CacheEngineKey("meta-llama/Meta-Llama-3-8B", 1, 0, 1, torch.bfloat16)
    space = plugin.namespace_of("lmcache", key)
    try:
        a, ga = engine_for(node.http, "llama-a", n, md=md, cpu_gb=0.3)
        g = torch.Generator().manual_seed(8)
        ga.kv.copy_(torch.randn(ga.kv.shape, generator=g).to(torch.bfloat16))
        a.store(tokens)
        s = ctxpod.Store.connect(node.http, namespace=space)
        # Both chunks stored: LMCache puts them on its own thread. Listed, not counted: a
        # namespace's block_count takes a value when the node admits its publish, before
        # the index holds it (and before the put is answered), so a kill right after the
        # count could take the value with it; a listed key is in the index, synced.
        def stored() -> list[bytes] | None:
            try:
                held = [k for k in s.keys() if k != plugin.IDENTITY_KEY]
            except ctxpod.NotFound:
                return None  # not created yet
            return held if len(held) == 2 else None

        held = until(stored, "both chunks stored")
        chunk = 32 * 2**20 + 28
        assert [len(s.get(k)) for k in held] == [chunk, chunk]
        s.close()
        LMCacheEngineBuilder.destroy("llama-a")
        node.kill()
        node.start()
        b, gb = engine_for(node.http, "llama-b", n, md=md, cpu_gb=0.3)
        assert b.lookup(tokens) == n
        got = b.retrieve(tokens)
        assert int(got.sum()) == n
        assert torch.equal(gb.kv, ga.kv)
    finally:
        LMCacheEngineBuilder.destroy("llama-a")
        LMCacheEngineBuilder.destroy("llama-b")
        node.stop()


def until(fn, what: str, limit_s: float = 30):
    deadline = time.monotonic() + limit_s
    while (r := fn()) is None:
        assert time.monotonic() < deadline, f"{what} within {limit_s} s"
        time.sleep(0.01)
    return r


def test_the_multiprocess_servers_l2_adapter_moves_objects_through_ctxpod(backends, node):
    """LMCache's own native_plugin adapter, built by its factory from the docs' --l2-adapter
    JSON, storing, finding and loading objects through ctxpod's Rust L2 client."""
    import json

    from lmcache.v1.distributed.api import ObjectKey
    from lmcache.v1.distributed.l2_adapters.factory import create_l2_adapter_from_registry
    from lmcache.v1.distributed.l2_adapters.native_plugin_l2_adapter import NativePluginL2AdapterConfig

    d = json.loads(doc_snippet("lmcache-l2-adapter").replace("http://10.0.0.5:7400", node.http))
    d.pop("type")
    adapter = create_l2_adapter_from_registry(NativePluginL2AdapterConfig.from_dict(d))
    b = backends
    try:
        keys = [ObjectKey(chunk_hash=bytes([i]) * 16, model_name="acme/l2", kv_rank=0) for i in range(3)]
        objs, data = zip(*(b.chunk(300 + i) for i in range(3)))
        tid = adapter.submit_store_task(keys, list(objs))
        stored = until(lambda: adapter.pop_completed_store_tasks().get(tid), "the store")
        assert stored >= 0
        absent = ObjectKey(chunk_hash=b"\xee" * 16, model_name="acme/l2", kv_rank=0)
        tid = adapter.submit_lookup_and_lock_task(keys + [absent], {})
        found = until(lambda: adapter.query_lookup_and_lock_result(tid), "the lookup")
        assert [found.test(i) for i in range(4)] == [True, True, True, False]
        dsts = [b.chunk(0)[0] for _ in keys]
        for o in dsts:
            o.raw_tensor.zero_()
        tid = adapter.submit_load_task(keys, dsts)
        loaded = until(lambda: adapter.query_load_result(tid), "the load")
        assert [loaded.test(i) for i in range(3)] == [True] * 3
        assert [bytes(o.byte_array) for o in dsts] == list(data)
        # Another tenant's cache salt: another namespace, nothing found.
        salted = [ObjectKey(chunk_hash=k.chunk_hash, model_name="acme/l2", kv_rank=0, cache_salt="globex") for k in keys]
        tid = adapter.submit_lookup_and_lock_task(salted, {})
        found = until(lambda: adapter.query_lookup_and_lock_result(tid), "the salted lookup")
        assert found.popcount() == 0
        for o in list(objs) + dsts:
            o.ref_count_down()
    finally:
        adapter.close()


def test_the_l2_client_refuses_bad_input_before_anything_is_sent(node):
    from ctxpod.integrations.lmcache_l2 import CtxpodL2Client

    with pytest.raises(ctxpod.InvalidRequest, match="unknown setting"):
        CtxpodL2Client(url=node.http, colour="blue")
    c = CtxpodL2Client(url=node.http)
    try:
        key = "acme/l2@00000000@0@" + "ab" * 16
        with pytest.raises(ctxpod.InvalidRequest, match="not an LMCache object key"):
            c.submit_batch_exists(["no-at-signs"])
        with pytest.raises(ctxpod.InvalidRequest, match="one of each per entry"):
            c.submit_batch_get([key, key], [memoryview(bytearray(8))])
        with pytest.raises(ctxpod.InvalidRequest, match="read-only"):
            c.submit_batch_get([key], [memoryview(b"12345678")])
        assert c._io.in_flight() == 0
        assert c.drain_completions() == []
        # A miss is a completion with the key not found, and the signal is cleared by drain.
        fid = c.submit_batch_get([key], [memoryview(bytearray(8))])
        got = until(lambda: c.drain_completions() or None, "the completion")
        assert got == [(fid, True, "", [False])]
    finally:
        c.close()


def test_a_url_of_another_http_service_is_refused_naming_it(other_http_service):
    """A ``url`` where an HTTP service that is not a ctxpod node answers is refused, naming
    the URL and what was expected, by the remote plugin and by the L2 client."""
    from lmcache.v1.storage_backend.connector import ConnectorContext

    from ctxpod.integrations.lmcache_l2 import CtxpodL2Client

    url = other_http_service.url
    ctx = ConnectorContext("plugin://ctxpod", asyncio.new_event_loop(), None, config(url), metadata("m"), "ctxpod")
    for build in (lambda: plugin.CtxpodConnectorAdapter().create_connector(ctx), lambda: CtxpodL2Client(url=url)):
        with pytest.raises(ctxpod.InvalidRequest) as e:
            build()
        msg = str(e.value)
        assert "url" in msg and url in msg and "not a ctxpod node" in msg, msg
