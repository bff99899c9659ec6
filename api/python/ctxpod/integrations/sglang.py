"""ctxpod as SGLang's HiCache storage tier (L3), loaded as a ``dynamic`` backend.

SGLang builds it from its own flags, with no patch to SGLang::

    --enable-hierarchical-cache --hicache-mem-layout page_first \\
    --hicache-storage-backend dynamic \\
    --hicache-storage-backend-extra-config '{"backend_name": "ctxpod",
        "module_path": "ctxpod.integrations.sglang", "class_name": "CtxpodHiCacheStorage",
        "interface_v1": 1, "url": "http://10.0.0.5:7400"}'

Settings (in the same JSON): those of :data:`ctxpod.integrations._common.SETTINGS`, plus
``prefetch_policy`` / ``prefetch_deadline_ms`` (how the node pushes the pages of one
``batch_get_v1``: ``wait_complete``, the default; ``best_effort``; ``timeout`` with a deadline)
and ``durable`` (flush each page before it is acknowledged; default false). Any other key but
SGLang's own (:data:`SGLANG_KEYS`) is refused, named, as is a ``url`` where something other
than a ctxpod node answers.

With ``interface_v1`` (SGLang's zero-copy path), the host pool's KV buffer is registered
with the pod once, pages are put straight from it, and a ``batch_get_v1`` is one prefetch:
every member pushes its pages into their slots of the host pool, with no copy. Without it
SGLang's copy path (``batch_get`` / ``batch_set`` of whole pages) stores the same blocks.

Where a page goes: one namespace per (model, attention kind, tensor-parallel size, KV
layout: layers, heads, head dim, page size, dtype), so two models or two shardings never
share a block; in it, MHA pages are two blocks, ``<hash>/<tp rank>.<pp rank>/k`` and ``/v``
(each rank holds its own heads), MLA pages one, ``<hash>/<pp rank>/kv`` (written by the
writer rank, read by every rank). SGLang chains page hashes from the request's cache salt, so
tenants with different salts never share a key.
"""

from __future__ import annotations

import ctypes
import logging
from collections.abc import Mapping
from typing import Any

import torch
from sglang.srt.mem_cache.hicache_storage import (
    HiCacheStorage,
    HiCacheStorageConfig,
    HiCacheStorageExtraInfo,
)

from .. import errors
from .._ctxpod import MATCH_KEYS_MAX
from .._store import POLICIES
from . import _common

logger = logging.getLogger(__name__)

#: This backend's settings in ``--hicache-storage-backend-extra-config``, beyond the shared ones.
SETTINGS = {
    **_common.SETTINGS,
    "prefetch_policy": "how a batch_get_v1's pages are pushed: wait_complete (default), best_effort, timeout",
    "prefetch_deadline_ms": "with prefetch_policy timeout: pages not pushed by then miss",
    "durable": "flush each page before it is acknowledged (default false)",
}
#: SGLang's own keys of the same JSON, which reach the backend with its settings: the
#: ``dynamic`` loader's (``backend_name``, ``module_path``, ``class_name``), the zero-copy
#: switch (``interface_v1``), and the prefetch knobs (SGLang's parser takes these out, but
#: the decode-side offload manager passes the JSON on as it is).
SGLANG_KEYS = frozenset({
    "backend_name", "module_path", "class_name", "interface_v1", "tp_lcm_size",
    "prefetch_threshold", "prefetch_timeout_base", "prefetch_timeout_per_ki_token",
    "hicache_storage_pass_prefix_keys",
})
#: Host pool layouts whose pages are whole spans of the KV buffer (K then V for MHA).
LAYOUTS = ("page_first", "page_first_direct", "page_head")




def _bytes_of(t: torch.Tensor) -> memoryview:
    """A writable byte view of a contiguous CPU tensor's memory (for the copy path)."""
    if t.device.type != "cpu" or not t.is_contiguous():
        raise errors.InvalidRequest("the copy path needs contiguous CPU tensors")
    n = t.numel() * t.element_size()
    return memoryview((ctypes.c_char * n).from_address(t.data_ptr())).cast("B")


def _check_page_fits(pool: Any, limit: int) -> None:
    """Refuses, when SGLang registers its host pool, a page whose blocks the pod cannot
    store (over ``limit``, its value limit; each page is one block per part: K and V, or
    MLA's one): otherwise every page would be refused and every prefix lookup would miss."""
    page = int(pool.page_size)
    _, sizes = pool.get_page_buffer_meta(torch.arange(page))
    block = max(int(x) for x in sizes)
    if block <= limit:
        return
    per_token = block // page
    fits = limit // per_token
    advice = f"Or run with --page-size {fits} or less." if fits else "Not one token of it fits."
    raise errors.InvalidRequest(
        f"SGLang HiCache backend ctxpod: a page of this model is a block of {block} bytes per part "
        f"({page} tokens x {per_token} bytes: {pool.layer_num} layers, "
        f"{getattr(pool, 'head_num', '?')} heads of {getattr(pool, 'head_dim', '?')} dims, {pool.dtype}), "
        f"{_common.over_limit(block, limit)} {advice}"
    )


class CtxpodHiCacheStorage(HiCacheStorage):
    """SGLang's ``HiCacheStorage`` over a ctxpod pod (see the module's documentation)."""

    def __init__(self, storage_config: HiCacheStorageConfig, kwargs: Mapping[str, Any] | None = None) -> None:
        self.config = storage_config
        extra = dict(storage_config.extra_config or {})
        who = "SGLang HiCache backend ctxpod"
        # A key that is neither a setting nor SGLang's own is a mistake (a typo such as
        # prefetch_polcy would otherwise leave the default in force): refused, named.
        _common.check_known(extra, SETTINGS, who, SGLANG_KEYS)
        settings = {k: v for k, v in extra.items() if k in SETTINGS}
        self.prefix = str(_common.setting(settings, "namespace_prefix", "sglang"))
        _common.namespace_name(self.prefix, "check")
        self.policy = str(_common.setting(settings, "prefetch_policy", "wait_complete"))
        if self.policy not in POLICIES:
            raise errors.InvalidRequest(f"{who}: prefetch_policy is one of {', '.join(POLICIES)}")
        deadline = _common.setting(settings, "prefetch_deadline_ms")
        if (self.policy == "timeout") != (deadline is not None):
            raise errors.InvalidRequest(f"{who}: prefetch_deadline_ms goes with prefetch_policy timeout (only)")
        self.deadline_ms = None if deadline is None else int(deadline)
        self.durable = _common.flag(_common.setting(settings, "durable", False), f"{who}: durable")
        replication = _common.setting(settings, "replication")
        self.mla = bool(storage_config.is_mla_model)
        rank = f"{storage_config.pp_rank}" if self.mla else f"{storage_config.tp_rank}.{storage_config.pp_rank}"
        self.parts = ("kv",) if self.mla else ("k", "v")
        self._suffixes = [f"/{rank}/{p}".encode() for p in self.parts]
        self.store = _common.connect(settings, who=who)
        self.replication = None if replication is None else int(replication)
        self.space = None  # the namespace's store, once the host pool says what a page is
        self.mem_pool_host = None
        self.registered = None

    # -- the host pool ---------------------------------------------------------------

    def register_mem_pool_host(self, mem_pool_host: Any) -> None:
        """Names the namespace after the pool's page layout and registers its KV buffer,
        so pages are put from and pushed into it with no copy."""
        super().register_mem_pool_host(mem_pool_host)
        pool = mem_pool_host
        layout = getattr(pool, "layout", None)
        if layout not in LAYOUTS:
            raise errors.InvalidRequest(
                f"SGLang HiCache backend ctxpod: host layout {layout!r} is not supported "
                f"(use --hicache-mem-layout {' or '.join(LAYOUTS)}: whole pages per block)"
            )
        _check_page_fits(pool, _common.value_limit(self.store))
        c = self.config
        identity = (
            c.model_name or "model", "mla" if self.mla else "mha", 1 if self.mla else c.tp_size,
            layout, pool.page_size, pool.layer_num, getattr(pool, "head_num", 0),
            getattr(pool, "head_dim", 0), str(pool.dtype),
        )
        ns = _common.namespace_name(self.prefix, *identity)
        self.space = _common.Namespaces(self.store, self.replication).get(ns)
        buf = pool.kv_buffer
        self.registered = self.space.register_buffer(buf.data_ptr(), buf.numel() * buf.element_size())

    def _need_pool(self) -> Any:
        if self.space is None:
            raise errors.InvalidRequest("SGLang HiCache backend ctxpod: no host pool registered yet")
        return self.space

    def _spans(self, keys: list[str], host_indices: torch.Tensor) -> tuple[Any, list[bytes], list[int], list[int]]:
        """The namespace's store, the pages' blocks, and their (address, size) spans in the
        host pool, block for block."""
        s = self._need_pool()
        ptrs, sizes = self.mem_pool_host.get_page_buffer_meta(host_indices)
        blocks = self._keys(keys)
        if len(ptrs) != len(blocks):
            raise errors.InvalidRequest(f"{len(keys)} pages but {len(ptrs)} host spans")
        return s, blocks, list(ptrs), list(sizes)

    def _keys(self, hashes: list[str]) -> list[bytes]:
        """Each page's blocks, page after page (K then V for MHA)."""
        return [h.encode() + s for h in hashes for s in self._suffixes]

    # -- SGLang's zero-copy interface (interface_v1) -----------------------------------

    def batch_exists(self, keys: list[str], extra_info: HiCacheStorageExtraInfo | None = None) -> int:
        """How many leading pages the pod holds whole: MATCH over their blocks."""
        s = self._need_pool()
        blocks = self._keys(keys)
        per = len(self.parts)
        held = 0
        step = MATCH_KEYS_MAX - MATCH_KEYS_MAX % per
        try:
            for at in range(0, len(blocks), step):
                part = blocks[at:at + step]
                got = s.match_prefix(part)
                held += got
                if got < len(part):
                    break
        except errors.CtxpodError as e:
            # Counted as held so far: the prefetch asks for no more than that.
            logger.warning("ctxpod: batch_exists of %d pages: %s", len(keys), e)
        return held // per

    def batch_get_v1(self, keys: list[str], host_indices: torch.Tensor,
                     extra_info: HiCacheStorageExtraInfo | None = None) -> list[bool]:
        """One prefetch: each member pushes its pages straight into their host slots."""
        s, blocks, ptrs, sizes = self._spans(keys, host_indices)
        try:
            t = s.prefetch(blocks, into=(ptrs, sizes), policy=self.policy,
                           deadline_ms=self.deadline_ms, lease_ms=0)
            codes = t.wait()
        except errors.CtxpodError as e:
            # SGLang's IO thread takes False as "not loaded" and recomputes those pages.
            logger.warning("ctxpod: batch_get_v1 of %d pages: %s", len(keys), e)
            return [False] * len(keys)
        return self._per_page(codes, sizes, lambda c, n: c == n)

    def batch_set_v1(self, keys: list[str], host_indices: torch.Tensor,
                     extra_info: HiCacheStorageExtraInfo | None = None) -> list[bool]:
        """The pages, put straight from the host pool."""
        s, blocks, ptrs, sizes = self._spans(keys, host_indices)
        try:
            codes = s.batch_put_from(blocks, ptrs, sizes, durable=self.durable)
        except errors.CtxpodError as e:
            logger.warning("ctxpod: batch_set_v1 of %d pages: %s", len(keys), e)
            return [False] * len(keys)
        return self._per_page(codes, sizes, lambda c, _: c == 0 or self._stored(-c))

    def _per_page(self, codes: list[Any], sizes: list[int], ok: Any) -> list[bool]:
        per = len(self.parts)
        return [all(ok(codes[i + j], sizes[i + j]) for j in range(per)) for i in range(0, len(codes), per)]

    @staticmethod
    def _stored(status: int) -> bool:
        # 409: the key holds other bytes, from an earlier compute of the same prefix (KV is
        # not bit-identical across batch shapes); either is a valid page, so it is kept.
        return status in (200, 201, 409)

    # -- SGLang's copy path (whole flat pages) -----------------------------------------

    def exists(self, key: str) -> bool:
        return self.batch_exists([key]) == 1

    def get(self, key: str, target_location: Any = None, target_sizes: Any = None) -> torch.Tensor | None:
        return self.batch_get([key], [target_location])[0]

    def batch_get(self, keys: list[str], target_locations: Any = None,
                  target_sizes: Any = None) -> list[torch.Tensor | None]:
        """Each page into its flat page tensor (K half, then V half); None for a miss."""
        s = self._need_pool()
        if target_locations is None or len(target_locations) != len(keys):
            raise errors.InvalidRequest("batch_get needs one target page tensor per key")
        views = []
        for t in target_locations:
            v = _bytes_of(t)
            half = len(v) // len(self.parts)
            views += [v[i * half:(i + 1) * half] for i in range(len(self.parts))]
        codes = s.batch_get_into(self._keys(keys), views)
        ok = self._per_page(codes, [len(v) for v in views], lambda c, n: c == n)
        return [t if good else None for t, good in zip(target_locations, ok)]

    def set(self, key: str, value: Any = None, target_location: Any = None, target_sizes: Any = None) -> bool:
        return self.batch_set([key], [value])

    def batch_set(self, keys: list[str], values: Any = None, target_locations: Any = None,
                  target_sizes: Any = None) -> bool:
        """Each flat page (K half, then V half) under its blocks."""
        s = self._need_pool()
        if values is None or len(values) != len(keys):
            raise errors.InvalidRequest("batch_set needs one page tensor per key")
        parts = []
        for t in values:
            v = _bytes_of(t.contiguous())
            half = len(v) // len(self.parts)
            parts += [bytes(v[i * half:(i + 1) * half]) for i in range(len(self.parts))]
        sts = s.batch_put(self._keys(keys), parts, durable=self.durable)
        return all(self._stored(st) for st in sts)

    # -- the rest --------------------------------------------------------------------

    def clear(self) -> None:
        """SGLang's flush-storage: every page of this namespace, in the whole pod."""
        s = self._need_pool()
        s.delete_namespace()
        s.create_namespace(replication=self.replication)

    def get_stats(self) -> None:
        return None

    def close(self) -> None:
        if self.space is not None and self.registered is not None:
            self.space.unregister_buffer(self.registered)
        self.store.close()
