"""ctxpod as an L2 of LMCache's multiprocess server, through its ``native_plugin`` adapter.

LMCache builds it from its own ``--l2-adapter`` JSON, with no patch to LMCache::

    lmcache server ... --l2-adapter '{"type": "native_plugin",
        "module_path": "ctxpod.integrations.lmcache_l2", "class_name": "CtxpodL2Client",
        "adapter_params": {"url": "http://10.0.0.5:7400"}}'

``adapter_params`` are the settings of :data:`ctxpod.integrations._common.SETTINGS`, plus
``durable`` (default false).

The I/O is the SDK's Rust ``_L2``: each ``submit_*`` takes LMCache's buffers and returns a
future id at once, the transfers run on the SDK's runtime (no Python thread waits on the
network), and completions are signalled on ``event_fd()``, which LMCache polls.

Where an object goes: LMCache's key ``model@kv_rank@group@hash[@cache_salt]`` becomes the
namespace of (model, cache salt), so two models or two tenants' salts never share a block,
and in it the key ``<kv rank>/<group>/<chunk hash>``.
"""

from __future__ import annotations

from typing import Any

from .. import errors
from .._ctxpod import _L2
from . import _common

#: This client's settings (``adapter_params``), beyond the shared ones.
SETTINGS = {**_common.SETTINGS, "durable": "flush each object before the store completes (default false)"}


class CtxpodL2Client:
    """The client LMCache's ``native_plugin`` adapter drives (see the module's documentation)."""

    def __init__(self, **settings: Any) -> None:
        who = "LMCache native_plugin CtxpodL2Client"
        _common.check_known(settings, SETTINGS, who)
        self.prefix = str(_common.setting(settings, "namespace_prefix", "lmcache"))
        _common.namespace_name(self.prefix, "check")
        self.durable = _common.flag(_common.setting(settings, "durable", False), f"{who}: durable")
        replication = _common.setting(settings, "replication")
        self.store = _common.connect(settings, who=who)
        self._io = _L2(self.store._s, None if replication is None else int(replication))
        self._spaces: dict[tuple[str, str], str] = {}

    def _where(self, keys: list[str]) -> tuple[list[str], list[bytes]]:
        spaces, out = [], []
        for k in keys:
            parts = k.split("@")
            if len(parts) not in (4, 5):
                raise errors.InvalidRequest(f"not an LMCache object key: {k!r}")
            model, rank, group, chunk = parts[:4]
            salt = parts[4] if len(parts) == 5 else ""
            ns = self._spaces.get((model, salt))
            if ns is None:
                ns = self._spaces[(model, salt)] = _common.namespace_name(self.prefix, model, salt)
            spaces.append(ns)
            out.append(f"{rank}/{group}/{chunk}".encode())
        return spaces, out

    def event_fd(self) -> int:
        return self._io.event_fd()

    def submit_batch_get(self, keys: list[str], memoryviews: list[memoryview]) -> int:
        return self._io.submit_get(*self._where(keys), list(memoryviews))

    def submit_batch_set(self, keys: list[str], memoryviews: list[memoryview]) -> int:
        return self._io.submit_set(*self._where(keys), list(memoryviews), self.durable)

    def submit_batch_exists(self, keys: list[str]) -> int:
        return self._io.submit_exists(*self._where(keys))

    def submit_batch_delete(self, keys: list[str]) -> int:
        return self._io.submit_delete(*self._where(keys))

    def drain_completions(self) -> list[tuple[int, bool, str, list[bool] | None]]:
        return self._io.drain()

    def close(self) -> None:
        self.store.close()
