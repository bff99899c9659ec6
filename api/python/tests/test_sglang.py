"""SGLang (the real package from PyPI, on the CPU) building ctxpod as its ``dynamic`` HiCache
storage backend through its own ``StorageBackendFactory``, from the configuration in
docs/INTEGRATIONS.md, driven with a real ``MHATokenToKVPoolHost``: pages stored from and
loaded into the host pool byte for byte through a real node."""

from __future__ import annotations

import hashlib
import json

import pytest
from conftest import doc_snippet, engine

sglang = engine("sglang")
torch = engine("torch")

from sglang.srt.mem_cache.device_pool_info import KVBufferLayout, KVBuffers, MHABufferInfo  # noqa: E402
from sglang.srt.mem_cache.hicache_storage import HiCacheStorageConfig  # noqa: E402
from sglang.srt.mem_cache.pool_host.base import host_memory_budget_scope  # noqa: E402
from sglang.srt.mem_cache.pool_host.mha import MHATokenToKVPoolHost  # noqa: E402
from sglang.srt.mem_cache.storage import StorageBackendFactory  # noqa: E402

import ctxpod  # noqa: E402
from ctxpod.integrations.sglang import LAYOUTS, CtxpodHiCacheStorage  # noqa: E402


LAYERS, HEADS, DIM, PAGE, TOKENS = 2, 2, 16, 16, 256
DTYPE = torch.bfloat16
#: The page size of a HiCache deployment with a storage backend (commonly run with
#: --page-size 64), for the settings tests.
ENGINE_PAGE = 64


def host_pool(layout: str = "page_first", page: int = PAGE, layers: int = LAYERS, heads: int = HEADS,
              dim: int = DIM, tokens: int = TOKENS) -> MHATokenToKVPoolHost:
    """A host pool on the CPU, as SGLang builds it from a device pool's buffer info."""
    k = tuple(torch.zeros(tokens + page, heads, dim, dtype=DTYPE) for _ in range(layers))
    v = tuple(torch.zeros(tokens + page, heads, dim, dtype=DTYPE) for _ in range(layers))

    def table(ts):
        return torch.tensor([t.data_ptr() for t in ts], dtype=torch.uint64)

    info = MHABufferInfo(
        buffers=KVBuffers(k=k, v=v, k_data_ptrs=table(k), v_data_ptrs=table(v), layout=KVBufferLayout.NHD),
        page_size=page, head_num=heads, head_dim=dim, v_head_dim=dim, dtype=DTYPE, device=torch.device("cpu"),
    )
    with host_memory_budget_scope(1 << 40):
        pool = MHATokenToKVPoolHost(
            info, 2.0, 0, page, layout, pin_memory=False, device="cpu",
            device_capacity_tokens=tokens, start_layer=0, end_layer=layers - 1,
        )
    pool._keep = (k, v)
    return pool


def storage_config(url: str, *, tp_rank: int = 0, tp_size: int = 1, model: str = "acme/llama-tiny",
                   **extra) -> HiCacheStorageConfig:
    """SGLang's storage config with the docs' extra-config (the test node's URL)."""
    cfg = json.loads(doc_snippet("sglang-extra-config").replace("http://10.0.0.5:7400", url))
    cfg.update(extra)
    return HiCacheStorageConfig(tp_rank, tp_size, 0, 1, 0, 1, False, False, True, model, extra_config=cfg)


def backend(url: str, pool: MHATokenToKVPoolHost, **kw) -> CtxpodHiCacheStorage:
    b = StorageBackendFactory.create_backend("dynamic", storage_config(url, **kw), pool)
    assert isinstance(b, CtxpodHiCacheStorage)
    b.register_mem_pool_host(pool)
    return b


def page_hashes(n: int, salt: str = "") -> list[str]:
    """A chain of page hashes, as SGLang's are (hex SHA-256 over the previous one)."""
    out, prev = [], salt
    for i in range(n):
        prev = hashlib.sha256(f"{prev}/{i}".encode()).hexdigest()
        out.append(prev)
    return out


def fill(pool: MHATokenToKVPoolHost, idx: torch.Tensor, seed: int, page: int = PAGE) -> None:
    g = torch.Generator().manual_seed(seed)
    for p in range(0, len(idx), page):
        data = pool.get_data_page(int(idx[p]), flat=False)
        data.copy_(torch.randn(data.shape, generator=g).to(DTYPE))


def pages(pool: MHATokenToKVPoolHost, idx: torch.Tensor) -> list[bytes]:
    return [pool.get_data_page(int(idx[p])).view(torch.uint8).numpy().tobytes() for p in range(0, len(idx), PAGE)]


@pytest.fixture()
def pool():
    return host_pool()


def test_pages_go_from_the_host_pool_to_the_pod_and_back(node, pool):
    b = backend(node.http, pool)
    try:
        keys = page_hashes(6)
        src = pool.alloc(6 * PAGE)
        fill(pool, src, 1)
        want = pages(pool, src)
        assert b.batch_exists(keys) == 0
        assert b.batch_set_v1(keys, src) == [True] * 6
        assert b.batch_exists(keys) == 6
        # The leading run held, as SGLang's prefetch asks: a gap ends it.
        assert b.batch_exists(keys[:2] + page_hashes(1, "other") + keys[2:]) == 2
        dst = pool.alloc(6 * PAGE)
        assert pages(pool, dst) != want
        assert b.batch_get_v1(keys, dst) == [True] * 6
        assert pages(pool, dst) == want
        # Nothing outside the pages asked for was written.
        assert pages(pool, src) == want
        # Each page is two blocks, K and V, in the model's namespace.
        s = ctxpod.Store.connect(node.http, namespace=b.space.namespace)
        k = s.get(f"{keys[0]}/0.0/k".encode())
        assert k is not None and len(k) * 2 == len(want[0])
        # A miss among the pages: that page is False, the others land.
        dst2 = pool.alloc(3 * PAGE)
        assert b.batch_get_v1([keys[0], page_hashes(1, "nope")[0], keys[2]], dst2) == [True, False, True]
    finally:
        b.close()


def test_the_copy_path_reads_the_same_blocks(node, pool):
    b = backend(node.http, pool)
    try:
        keys = page_hashes(2, "copy")
        src = pool.alloc(2 * PAGE)
        fill(pool, src, 2)
        want = pages(pool, src)
        assert b.batch_set(keys, [pool.get_data_page(int(src[p])) for p in (0, PAGE)])
        got = b.batch_get(keys, [pool.get_dummy_flat_data_page() for _ in keys])
        assert [t.view(torch.uint8).numpy().tobytes() for t in got] == want
        # And the zero-copy path reads what the copy path stored.
        dst = pool.alloc(2 * PAGE)
        assert b.batch_get_v1(keys, dst) == [True, True]
        assert pages(pool, dst) == want
        assert b.get(page_hashes(1, "absent")[0], pool.get_dummy_flat_data_page()) is None
    finally:
        b.close()


def test_tensor_parallel_ranks_and_models_never_share_pages(node, pool):
    a = backend(node.http, pool, tp_rank=0, tp_size=2)
    r1 = backend(node.http, host_pool(), tp_rank=1, tp_size=2)
    other = backend(node.http, host_pool(), model="globex/other")
    try:
        keys = page_hashes(3, "tp")
        src = pool.alloc(3 * PAGE)
        fill(pool, src, 3)
        assert a.batch_set_v1(keys, src) == [True] * 3
        assert a.batch_exists(keys) == 3
        assert r1.batch_exists(keys) == 0  # rank 1 holds other heads: its own blocks
        assert other.batch_exists(keys) == 0  # another model: another namespace
        assert other.space.namespace != a.space.namespace
    finally:
        for x in (a, r1, other):
            x.close()


def test_timeout_policy_and_bad_settings(node, pool):
    b = backend(node.http, pool, prefetch_policy="timeout", prefetch_deadline_ms=5000)
    try:
        keys = page_hashes(2, "policy")
        src = pool.alloc(2 * PAGE)
        fill(pool, src, 4)
        assert b.batch_set_v1(keys, src) == [True, True]
        assert b.batch_get_v1(keys, pool.alloc(2 * PAGE)) == [True, True]
    finally:
        b.close()
    with pytest.raises(ctxpod.InvalidRequest, match="prefetch_policy"):
        backend(node.http, pool, prefetch_policy="eventually")
    with pytest.raises(ctxpod.InvalidRequest, match="prefetch_deadline_ms"):
        backend(node.http, pool, prefetch_policy="timeout")
    with pytest.raises(ctxpod.InvalidRequest, match="layout 'layer_first' is not supported"):
        backend(node.http, host_pool("layer_first"))


#: Real models' KV (layers, KV heads, head dim; bf16): a page's K (or V) of Llama-3-8B at
#: 64 / 128 tokens is 4 / 8 MiB, of Llama-3-70B 10 / 20 MiB (a value over one record).
MODELS = {"meta-llama/Meta-Llama-3-8B": (32, 8, 128), "meta-llama/Meta-Llama-3-70B": (80, 8, 128)}


def real_page(pool: MHATokenToKVPoolHost, page: int, seed: int) -> tuple[torch.Tensor, bytes]:
    """One page of the pool filled with seeded KV: its indices and its bytes."""
    src = pool.alloc(page)
    g = torch.Generator().manual_seed(seed)
    data = pool.get_data_page(int(src[0]), flat=False)
    data.copy_(torch.randn(data.shape, generator=g).to(DTYPE))
    return src, pool.get_data_page(int(src[0])).view(torch.uint8).numpy().tobytes()


def test_real_model_pages_in_every_layout_are_stored_and_loaded_across_kill_9(tmp_path):
    """SGLang's page sizes (64 and 128 tokens) in both page layouts a HiCache storage
    backend runs with (page_first, page_first_direct), for Llama-3-8B and -70B (issue #34):
    every page stored from the host pool, the node killed (SIGKILL) and started again, then
    loaded into another host pool byte for byte. (SGLang's own host pool cannot be built in
    the page_head layout on the CPU: its per-layer views index the buffer by layer.)"""
    from conftest import Node

    node = Node(tmp_path, "sglang-real", capacity="1GiB")
    layouts = ("page_first", "page_first_direct")
    assert set(layouts) <= set(LAYOUTS)
    configs = [(m, layout, page) for m in MODELS for layout in layouts for page in (64, 128)]
    want = {}
    try:
        for i, (model, layout, page) in enumerate(configs):
            layers, heads, dim = MODELS[model]
            pool = host_pool(layout, page=page, layers=layers, heads=heads, dim=dim, tokens=page)
            b = backend(node.http, pool, model=model)
            try:
                keys = page_hashes(1, f"{model}-{layout}-{page}")
                src, data = real_page(pool, page, i)
                assert len(data) == 2 * page * layers * heads * dim * 2
                assert b.batch_set_v1(keys, src) == [True], (model, layout, page)
                want[(model, layout, page)] = (keys, data)
            finally:
                b.close()
        node.kill()
        node.start()
        for (model, layout, page), (keys, data) in want.items():
            layers, heads, dim = MODELS[model]
            pool = host_pool(layout, page=page, layers=layers, heads=heads, dim=dim, tokens=page)
            b = backend(node.http, pool, model=model)
            try:
                assert b.batch_exists(keys) == 1
                dst = pool.alloc(page)
                assert b.batch_get_v1(keys, dst) == [True], (model, layout, page)
                got = pool.get_data_page(int(dst[0])).view(torch.uint8).numpy().tobytes()
                assert got == data, (model, layout, page)
            finally:
                b.close()
    finally:
        node.stop()


def test_pages_over_the_pods_value_limit_are_refused_when_the_host_pool_registers(limited_node):
    """Over a pod whose nodes store values of at most 16 MiB, Llama-3-70B's page of 128
    tokens (20 MiB per part) is refused when the host pool registers, naming the sizes, the
    limit and the page size that fits; 64 tokens (10 MiB) registers."""
    layers, heads, dim = MODELS["meta-llama/Meta-Llama-3-70B"]
    pool = host_pool(page=128, layers=layers, heads=heads, dim=dim, tokens=128)
    with pytest.raises(ctxpod.InvalidRequest) as e:
        backend(limited_node.http, pool, model="meta-llama/Meta-Llama-3-70B")
    said = str(e.value)
    assert f"block of {128 * 80 * 8 * 128 * 2} bytes per part" in said
    assert f"value limit of {16 << 20} bytes" in said and "--page-size 102 or less" in said, said
    pool = host_pool(page=64, layers=layers, heads=heads, dim=dim, tokens=64)
    backend(limited_node.http, pool, model="meta-llama/Meta-Llama-3-70B").close()


def test_a_read_only_token_reads_but_cannot_store(auth_node, pool):
    rw = backend(auth_node.http, pool, token=auth_node.tokens["rw"])
    ro = backend(auth_node.http, host_pool(), token=auth_node.tokens["ro"])
    try:
        keys = page_hashes(1, "auth")
        src = pool.alloc(PAGE)
        fill(pool, src, 5)
        assert ro.batch_set_v1(keys, src) == [False]
        assert rw.batch_set_v1(keys, src) == [True]
        assert ro.batch_exists(keys) == 1
    finally:
        rw.close()
        ro.close()


def sglang_extra_config(url: str, **extra) -> dict:
    """The docs' extra-config JSON with ``extra`` added, through SGLang's own parser of
    --hicache-storage-backend-extra-config (which takes its prefetch knobs out): the dict
    SGLang hands the backend."""
    from sglang.srt.mem_cache.hybrid_cache.hybrid_cache_controller import HybridCacheController

    cfg = json.loads(doc_snippet("sglang-extra-config").replace("http://10.0.0.5:7400", url))
    cfg.update(extra)
    parsed, *_ = HybridCacheController.parse_storage_backend_extra_config(json.dumps(cfg))
    return parsed


def test_unknown_settings_are_refused_naming_them(node):
    """A setting the backend does not know is refused when SGLang builds it, named (a typo
    such as prefetch_polcy would otherwise leave the default in force unnoticed); SGLang's
    own keys of the same JSON are not settings of the backend, and are accepted."""
    pool = host_pool(page=ENGINE_PAGE)
    for typo in ({"prefetch_polcy": "best_effort"}, {"tokn_file": "/etc/ctxpod/token"}, {"URL": node.http}):
        (name,) = typo
        cfg = sglang_extra_config(node.http, **typo)
        assert name in cfg  # SGLang passes it on
        with pytest.raises(ctxpod.InvalidRequest, match=rf"unknown setting.*'{name}'"):
            StorageBackendFactory.create_backend(
                "dynamic", HiCacheStorageConfig(0, 1, 0, 1, 0, 1, False, False, True, "m", extra_config=cfg), pool)
    # SGLang's own: the dynamic loader's keys, interface_v1, and the prefetch knobs (taken
    # out by its parser, but passed on as they are by the decode-side offload manager).
    own = {"prefetch_threshold": 256, "prefetch_timeout_base": 1, "prefetch_timeout_per_ki_token": 0.25,
           "hicache_storage_pass_prefix_keys": False}
    b = backend(node.http, pool, prefetch_policy="best_effort", **own)
    try:
        assert b.policy == "best_effort"
        keys = page_hashes(2, "settings")
        src = pool.alloc(2 * ENGINE_PAGE)
        fill(pool, src, 6, ENGINE_PAGE)
        assert b.batch_set_v1(keys, src) == [True, True]
        assert b.batch_get_v1(keys, pool.alloc(2 * ENGINE_PAGE)) == [True, True]
    finally:
        b.close()


def test_a_url_of_another_http_service_is_refused_naming_it(other_http_service):
    """A ``url`` that reaches an HTTP service which is not a ctxpod node is an
    ``InvalidRequest`` naming the setting, the URL and what was expected, raised when SGLang
    builds the backend."""
    url = other_http_service.url
    cfg = sglang_extra_config(url)
    with pytest.raises(ctxpod.InvalidRequest) as e:
        StorageBackendFactory.create_backend(
            "dynamic", HiCacheStorageConfig(0, 1, 0, 1, 0, 1, False, False, True, "m", extra_config=cfg),
            host_pool(page=ENGINE_PAGE))
    msg = str(e.value)
    assert "url" in msg and url in msg and "not a ctxpod node" in msg, msg
