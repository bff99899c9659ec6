"""ctxpod as an LMCache remote storage plugin (LMCache 0.5.x).

LMCache loads it from its own configuration, with no patch to LMCache::

    remote_storage_plugins: ["ctxpod"]
    extra_config:
      remote_storage_plugin.ctxpod.module_path: ctxpod.integrations.lmcache
      remote_storage_plugin.ctxpod.class_name: CtxpodConnectorAdapter
      remote_storage_plugin.ctxpod.url: http://10.0.0.5:7400
      remote_storage_plugin.ctxpod.token_file: /etc/ctxpod/token   # when the pod has auth

The plugin's name must be ``ctxpod`` or start with ``ctxpod.`` (``ctxpod.primary``); its
settings are ``remote_storage_plugin.<name>.<setting>``: those of
:data:`ctxpod.integrations._common.SETTINGS`, plus ``pin_ttl_s`` (how long blocks found by an
async lookup stay pinned for the load that follows; LMCache never unpins them, so the pin is a
lease; default 60) and ``durable`` (flush each put before it is acknowledged; default false:
a cache entry lost to a crash is recomputed).

Where a chunk goes: one namespace per (model name, world size, KV dtype, LMCache tags), so
two models (or two tag sets) never share a block; in it, the key ``<worker id>/<chunk hash>``.
The value is LMCache's own 28-byte chunk header (``RemoteMetadata``: length, format, shapes,
dtypes; so partial chunks come back with their shape) followed by the chunk's bytes; with
``extra_config.save_chunk_meta: false`` it is the bytes alone, written from and read into
LMCache's buffers with no copy in Python.

Each namespace also holds one block under ``lmcache.identity`` (a key no chunk has): the
parts of LMCache's key string that the namespace stands for, written with the first put into
it, so that :meth:`CtxpodConnector.list` can spell every chunk's key as LMCache does
(``CacheEngineKey.to_string``).

Lookups are one MATCH per batch (the leading chunks held); the async lookup pins what it
found. LMCache calls the async methods on its storage loop: each runs the SDK's blocking call
in a worker thread (the SDK releases the GIL), so the loop never waits on the network.
"""

from __future__ import annotations

import asyncio
import ctypes
import json
import logging
from collections.abc import Mapping
from typing import Any

from lmcache.utils import CacheEngineKey
from lmcache.v1.memory_management import MemoryObj
from lmcache.v1.protocol import RemoteMetadata
from lmcache.v1.storage_backend.connector import (
    ConnectorAdapter,
    ConnectorContext,
    extract_plugin_type,
)
from lmcache.v1.storage_backend.connector.base_connector import RemoteConnector

from .. import errors
from .._ctxpod import MATCH_KEYS_MAX
from . import _common

logger = logging.getLogger(__name__)

#: The plugin type (the plugin name, up to its first ``.``) this adapter answers for.
PLUGIN_TYPE = "ctxpod"
#: The settings of this plugin, beyond the shared ones.
SETTINGS = {
    **_common.SETTINGS,
    "pin_ttl_s": "seconds a block found by an async lookup stays pinned (default 60)",
    "durable": "flush each put before it is acknowledged (default false)",
}


def plugin_settings(extra_config: Mapping[str, Any] | None, plugin_name: str) -> dict[str, Any]:
    """The ``remote_storage_plugin.<plugin_name>.*`` entries of LMCache's ``extra_config``,
    by setting name; an unknown setting is an error (a typo would otherwise be ignored)."""
    head = f"remote_storage_plugin.{plugin_name}."
    out = {}
    for k, v in (extra_config or {}).items():
        if not isinstance(k, str) or not k.startswith(head):
            continue
        name = k[len(head):]
        if name in ("module_path", "class_name"):
            continue
        if name not in SETTINGS:
            raise errors.InvalidRequest(
                f"LMCache plugin {plugin_name}: unknown setting {k!r} (known: {', '.join(sorted(SETTINGS))})"
            )
        out[name] = v
    return out




def namespace_of(prefix: str, key: CacheEngineKey) -> str:
    """The namespace of a chunk: its model, world size, dtype and tags."""
    return _common.namespace_name(prefix, key.model_name, key.world_size, str(key.dtype), key.tags or ())


def key_of(key: CacheEngineKey) -> bytes:
    """The chunk's key in its namespace: the worker (tensor-parallel rank) and the hash."""
    return f"{key.worker_id:x}/{key.chunk_hash_hex}".encode()


#: The key of the block, in each namespace the plugin writes, that names what the namespace
#: stands for (no chunk key has a ``.``).
IDENTITY_KEY = b"lmcache.identity"


def identity_of(key: CacheEngineKey) -> bytes:
    """What a chunk's namespace stands for, as LMCache spells it in a key string: the parts
    before the worker id and the hash (model, world size) and those after (dtype, tags)."""
    parts = key.to_string().split("@")
    return json.dumps({"head": parts[:2], "tail": parts[4:]}, separators=(",", ":")).encode()


def key_string(identity: bytes, key: bytes) -> str | None:
    """LMCache's key string of the chunk stored under ``key`` in a namespace whose identity
    block is ``identity`` (None for a key that is not a chunk's)."""
    ident = json.loads(identity)
    worker, sep, chunk_hash = key.decode("ascii", "replace").partition("/")
    if not sep:
        return None
    try:
        worker_id = int(worker, 16)
    except ValueError:
        return None
    return "@".join([*ident["head"], str(worker_id), chunk_hash, *ident["tail"]])


class CtxpodConnector(RemoteConnector):
    """LMCache's ``RemoteConnector`` over a ctxpod pod (see the module's documentation)."""

    def __init__(self, context: ConnectorContext, settings: Mapping[str, Any]) -> None:
        super().__init__(context.config, context.metadata)
        who = f"LMCache plugin {context.plugin_name}"
        self.loop = context.loop
        self.local_cpu_backend = context.local_cpu_backend
        self.prefix = str(_common.setting(settings, "namespace_prefix", "lmcache"))
        _common.namespace_name(self.prefix, "check")
        try:
            self.pin_ttl = float(_common.setting(settings, "pin_ttl_s", 60))
        except (TypeError, ValueError):
            raise errors.InvalidRequest(f"{who}: pin_ttl_s is a number of seconds") from None
        if not 0 < self.pin_ttl <= 3600:
            raise errors.InvalidRequest(f"{who}: pin_ttl_s is in (0, 3600]")
        self.durable = _common.flag(_common.setting(settings, "durable", False), f"{who}: durable")
        replication = _common.setting(settings, "replication")
        self.store = _common.connect(settings, who=who)
        self._check_chunk_fits(who, context.metadata, _common.value_limit(self.store))
        self.spaces = _common.Namespaces(self.store, None if replication is None else int(replication))
        # Namespaces whose identity block this process wrote (or found written).
        self._named: set[str] = set()

    def _check_chunk_fits(self, who: str, md: Any, limit: int) -> None:
        """Refuses, when LMCache builds the connector, a configuration whose full chunks
        the pod cannot store (over ``limit``, its value limit): otherwise every put would be
        refused and logged by LMCache, and every later lookup would miss."""
        header = self.remote_metadata_bytes if self.save_chunk_meta else 0
        value = self.full_chunk_size_bytes + header
        if value <= limit:
            return
        per_token = self.single_token_size
        fits = (limit - header) // per_token
        advice = f"Or set chunk_size to at most {fits} tokens." if fits else "Not one token of it fits."
        raise errors.InvalidRequest(
            f"{who}: a full chunk of this model is {value} bytes (chunk_size {md.chunk_size} tokens x "
            f"{per_token} bytes of KV per token, shapes {[tuple(x) for x in self.meta_shapes]}"
            f"{', with its ' + str(header) + '-byte header' if header else ''}), "
            f"{_common.over_limit(value, limit)} {advice}"
        )

    # -- where chunks go -------------------------------------------------------------

    def _groups(self, keys: list[CacheEngineKey]) -> list[tuple[str, list[int]]]:
        """Runs of consecutive keys in one namespace: (namespace, their indices)."""
        runs: list[tuple[str, list[int]]] = []
        for i, k in enumerate(keys):
            ns = namespace_of(self.prefix, k)
            if runs and runs[-1][0] == ns:
                runs[-1][1].append(i)
            else:
                runs.append((ns, [i]))
        return runs

    # -- lookups ---------------------------------------------------------------------

    def support_batched_contains(self) -> bool:
        return True

    def batched_contains(self, keys: list[CacheEngineKey]) -> int:
        """How many leading chunks of ``keys`` the pod holds: one MATCH per namespace run."""
        return self._prefix_held(keys)

    def _prefix_held(self, keys: list[CacheEngineKey]) -> int:
        n = 0
        for ns, idx in self._groups(keys):
            s = self.spaces.get(ns)
            for at in range(0, len(idx), MATCH_KEYS_MAX):
                part = [key_of(keys[i]) for i in idx[at:at + MATCH_KEYS_MAX]]
                got = s.match_prefix(part)
                n += got
                if got < len(part):
                    return n
        return n

    def support_batched_async_contains(self) -> bool:
        return True

    async def batched_async_contains(self, lookup_id: str, keys: list[CacheEngineKey], pin: bool = False) -> int:
        """The leading chunks held; with ``pin``, they stay pinned for ``pin_ttl_s`` (the
        load that follows finds them even under eviction pressure)."""

        def run() -> int:
            n = self._prefix_held(keys)
            if pin and n:
                for ns, idx in self._groups(keys[:n]):
                    self.spaces.get(ns).pin([key_of(keys[i]) for i in idx], self.pin_ttl)
            return n

        return await asyncio.to_thread(run)

    def exists_sync(self, key: CacheEngineKey) -> bool:
        return self.spaces.get(namespace_of(self.prefix, key)).exists(key_of(key))

    async def exists(self, key: CacheEngineKey) -> bool:
        return await asyncio.to_thread(self.exists_sync, key)

    # -- reads -----------------------------------------------------------------------

    def support_batched_get(self) -> bool:
        return True

    async def get(self, key: CacheEngineKey) -> MemoryObj | None:
        return (await self.batched_get([key]))[0]

    async def batched_get(self, keys: list[CacheEngineKey]) -> list[MemoryObj | None]:
        return await asyncio.to_thread(self._get, keys)

    def support_batched_get_non_blocking(self) -> bool:
        return True

    async def batched_get_non_blocking(self, lookup_id: str, keys: list[CacheEngineKey]) -> list[MemoryObj]:
        """The leading chunks found, as LMCache's async loader expects; the chunks after
        the first miss are released."""
        got = await self.batched_get(keys)
        out: list[MemoryObj] = []
        for obj in got:
            if obj is None:
                break
            out.append(obj)
        for obj in got[len(out):]:
            if obj is not None:
                obj.ref_count_down()
        return out

    def _get(self, keys: list[CacheEngineKey]) -> list[MemoryObj | None]:
        out: list[MemoryObj | None] = [None] * len(keys)
        try:
            for ns, idx in self._groups(keys):
                s = self.spaces.get(ns)
                ks = [key_of(keys[i]) for i in idx]
                if self.save_chunk_meta:
                    for i, v in zip(idx, s.batch_get(ks)):
                        out[i] = None if v is None else self._with_header(keys[i], v)
                else:
                    self._get_raw(s, ks, idx, out)
        except BaseException:
            for obj in out:
                if obj is not None:
                    obj.ref_count_down()
            raise
        return out

    def _with_header(self, key: CacheEngineKey, v: bytes) -> MemoryObj | None:
        """A chunk stored as header + bytes, in a buffer of LMCache's (None if it is
        malformed or there is no room: LMCache then treats it as a miss)."""
        hdr = self.remote_metadata_bytes
        if len(v) < hdr:
            logger.warning("ctxpod: chunk %s is %d bytes, shorter than its header", key.to_string(), len(v))
            return None
        md = RemoteMetadata.deserialize(v[:hdr])
        if md.length != len(v) - hdr:
            logger.warning("ctxpod: chunk %s: header says %d bytes, %d stored", key.to_string(), md.length, len(v) - hdr)
            return None
        obj = self.local_cpu_backend.allocate(md.shapes, md.dtypes, md.fmt)
        if obj is None:
            logger.warning("ctxpod: no room in LMCache's CPU buffer for chunk %s", key.to_string())
            return None
        room = obj.get_size()
        if room != md.length:
            obj.ref_count_down()
            logger.warning("ctxpod: chunk %s: %d bytes for a buffer of %d", key.to_string(), md.length, room)
            return None
        # `byte_array` is a "<B" view that memoryview assignment refuses: copy by address.
        src = ctypes.cast(ctypes.c_char_p(v), ctypes.c_void_p).value
        ctypes.memmove(obj.data_ptr, src + hdr, md.length)
        return obj

    def _get_raw(self, s: Any, ks: list[bytes], idx: list[int], out: list[MemoryObj | None]) -> None:
        """Chunks stored as bytes alone, read straight into full-chunk buffers of LMCache's
        and cut to the bytes that came (partial chunks)."""
        objs = []
        for _ in ks:
            obj = self.local_cpu_backend.allocate(self.meta_shapes, self.meta_dtypes, self.meta_fmt)
            if obj is None:
                break
            objs.append(obj)
        codes = s.batch_get_into(ks[: len(objs)], [o.byte_array for o in objs]) if objs else []
        for i, obj, n in zip(idx, objs, codes):
            if n <= 0:
                obj.ref_count_down()
            elif n < self.full_chunk_size_bytes:
                out[i] = self.reshape_partial_chunk(obj, n)
            else:
                out[i] = obj

    # -- writes ----------------------------------------------------------------------

    def support_batched_put(self) -> bool:
        return True

    async def put(self, key: CacheEngineKey, memory_obj: MemoryObj) -> None:
        await self.batched_put([key], [memory_obj])

    async def batched_put(self, keys: list[CacheEngineKey], memory_objs: list[MemoryObj]) -> None:
        await asyncio.to_thread(self._put, keys, memory_objs)

    def _put(self, keys: list[CacheEngineKey], objs: list[MemoryObj]) -> None:
        refused = []
        for ns, idx in self._groups(keys):
            ks = [key_of(keys[i]) for i in idx]
            values: list[Any] = []
            for i in idx:
                view = objs[i].byte_array
                if self.save_chunk_meta:
                    o = objs[i]
                    hdr = RemoteMetadata(len(view), o.get_shapes(), o.get_dtypes(), o.get_memory_format())
                    values.append(b"".join((hdr.serialize(), view)))
                else:
                    values.append(view)
            # The namespace's identity goes with its first put from this process (200 when
            # another process wrote it already).
            named = ns in self._named
            if not named:
                ks.append(IDENTITY_KEY)
                values.append(identity_of(keys[idx[0]]))
            sts = self.spaces.get(ns).batch_put(ks, values, durable=self.durable)
            if not named:
                if sts.pop() in (200, 201):
                    self._named.add(ns)
            # 409: the key holds other bytes, from an earlier compute of the same chunk (KV
            # is not bit-identical across batch shapes); that chunk is as good, and kept.
            refused += [(keys[i].to_string(), st) for i, st in zip(idx, sts) if st not in (200, 201, 409)]
        if refused:
            # LMCache logs a failed put and goes on (the chunk is recomputed next time).
            raise errors.from_status(refused[0][1], f"ctxpod refused {len(refused)} chunk(s), first {refused[0]}")

    def remove_sync(self, key: CacheEngineKey) -> bool:
        return self.spaces.get(namespace_of(self.prefix, key)).remove(key_of(key))

    # -- the rest --------------------------------------------------------------------

    async def list(self) -> list[str]:
        """Every chunk this plugin's namespaces hold in the pod, as LMCache's key strings
        (``CacheEngineKey.from_string`` reads them back): the namespaces of the caller's
        tenant under this plugin's ``namespace_prefix`` are listed a page at a time.
        LMCache asks it in its tools (loading every stored chunk into the CPU tier)."""
        return await asyncio.to_thread(self._list)

    def _list(self) -> list[str]:
        out: list[str] = []
        head = f"{self.prefix}-"
        for info in self.store.namespaces():
            name = info["name"]
            if not name.startswith(head):
                continue
            s = self.store.with_namespace(name)
            identity = s.get(IDENTITY_KEY)
            if identity is None:
                # Not written by this plugin (or by a version before identity blocks).
                continue
            for k in s.keys():
                if k != IDENTITY_KEY and (spelt := key_string(identity, k)) is not None:
                    out.append(spelt)
        return out

    def support_ping(self) -> bool:
        return True

    async def ping(self) -> int:
        """0 when a member of the pod answers; LMCache's health monitor asks."""
        try:
            await asyncio.to_thread(self.store.refresh)
            return 0
        except errors.CtxpodError as e:
            logger.warning("ctxpod: ping: %s", e)
            return 1

    async def close(self) -> None:
        self.store.close()


class CtxpodConnectorAdapter(ConnectorAdapter):
    """The class LMCache's plugin loader names (``class_name``): builds a
    :class:`CtxpodConnector` from the plugin's settings."""

    def __init__(self) -> None:
        super().__init__(f"plugin://{PLUGIN_TYPE}")

    def can_parse(self, url: str) -> bool:
        return url.startswith("plugin://") and extract_plugin_type(url[len("plugin://"):]) == PLUGIN_TYPE

    def create_connector(self, context: ConnectorContext) -> RemoteConnector:
        name = context.plugin_name or PLUGIN_TYPE
        extra = context.config.extra_config if context.config is not None else None
        return CtxpodConnector(context, plugin_settings(extra, name))
