"""ctxpod as a secondary tier of vLLM's ``OffloadingConnector`` (vLLM 0.33, tiering spec).

vLLM loads it from its own configuration, with no patch to vLLM::

    --kv-transfer-config '{"kv_connector": "OffloadingConnector", "kv_role": "kv_both",
      "kv_connector_extra_config": {"spec_name": "TieringOffloadingSpec",
        "cpu_bytes_to_use": 10737418240,
        "secondary_tiers": [{"type": "CtxpodSecondaryTier",
          "module_path": "ctxpod.integrations.vllm", "url": "http://10.0.0.5:7400"}]}}'

Every other key of the tier's entry is a setting: those of
:data:`ctxpod.integrations._common.SETTINGS`, plus ``durable`` (flush each chunk before the
store is reported; default false), ``skip_held`` (ask which chunks the pod holds before a
store and send only the others; default true) and ``locality`` (vLLM's).

The CPU tier's memory (one row per chunk, over a shared mmap) is registered with the pod
once: a store puts rows straight from it, a load is one prefetch that pushes every chunk
into its row, and nothing blocks the scheduler: stores run on a worker thread, loads are
prefetch tickets polled in ``get_finished_jobs``, lookups are batched per request and
step by vLLM's ``AsyncLookupManager`` (one ``batch_exists`` per request).

Where a chunk goes: one namespace per vLLM storage identity (model, dtype, tokens per hash,
parallel layout, KV groups: the fields vLLM's own file and object tiers hash) and row size;
the key is vLLM's ``OffloadKey`` (the chunk's chained block hash and its KV group). vLLM
seeds the chain with the request's cache salt, so tenants with different salts never share
a key.

Prefix lookup: vLLM asks a tier one key at a time and counts the leading hits itself, so the
tier cannot answer with one MATCH; the batched existence query per request is the closest
the interface allows (it costs the first scheduling step of a cold request).
"""

from __future__ import annotations

import ctypes
import logging
import threading
import time
from collections import deque
from collections.abc import Iterable
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any, ClassVar

from vllm.v1.kv_offload.base import (
    Locality,
    LookupResult,
    Medium,
    OffloadKey,
    ReqContext,
    RequestOffloadingContext,
    ScheduleEndContext,
)
from vllm.v1.kv_offload.tiering.async_lookup import AsyncLookupManager
from vllm.v1.kv_offload.tiering.base import JobResult, SecondaryTierManager, TransferJob

from .. import errors
from . import _common

logger = logging.getLogger(__name__)

#: This tier's settings (keys of its ``secondary_tiers`` entry), beyond the shared ones.
SETTINGS = {
    **_common.SETTINGS,
    "durable": "flush each chunk before the store is reported (default false)",
    "skip_held": "send only the chunks the pod does not hold yet (default true)",
}




def storage_identity(offloading_spec: Any) -> dict[str, Any]:
    """What must be equal for two engines to share a chunk: vLLM's own storage identity
    (its file mapper's fields, parallelism-agnostic where the layout allows)."""
    from vllm.v1.kv_offload.file_mapper import FileMapper

    return FileMapper.from_offloading_spec("", offloading_spec, blocks_per_file=1, parallel_agnostic=True).get_run_config()


class _Lookups(AsyncLookupManager):
    """vLLM's batched async lookups, one ``batch_exists`` per request and step."""

    def __init__(self, tier: CtxpodSecondaryTier, tier_type: str) -> None:
        super().__init__(tier_type=tier_type)
        self._tier = tier

    def batch_lookup(self, keys: list[OffloadKey], req_context: ReqContext) -> Iterable[bool]:
        return self._tier.space.batch_exists([bytes(k) for k in keys])


class CtxpodSecondaryTier(SecondaryTierManager):
    """vLLM's ``SecondaryTierManager`` over a ctxpod pod (see the module's documentation)."""

    medium: ClassVar[Medium] = Medium.STORAGE

    def __init__(self, offloading_spec: Any, primary_kv_view: memoryview, tier_type: str,
                 backpressure_detector: Any = None, locality: str | None = None, **settings: Any) -> None:
        super().__init__(offloading_spec, primary_kv_view, tier_type, backpressure_detector)
        who = f"vLLM secondary tier {tier_type}"
        _common.check_known(settings, SETTINGS, who)
        self.locality = Locality(locality) if locality is not None else None
        self.durable = _common.flag(_common.setting(settings, "durable", False), f"{who}: durable")
        self.skip_held = _common.flag(_common.setting(settings, "skip_held", True), f"{who}: skip_held")
        prefix = str(_common.setting(settings, "namespace_prefix", "vllm"))
        identity = storage_identity(offloading_spec)
        ns = _common.namespace_name(prefix, identity.get("model_name", "model"),
                                    sorted(identity.items()), self.block_size_bytes)
        replication = _common.setting(settings, "replication")
        self.store = _common.connect(settings, who=who)
        limit = _common.value_limit(self.store)
        if self.block_size_bytes > limit:
            # Every chunk would be refused and every lookup would miss: refused here, while
            # vLLM builds the tier, with what to change.
            raise errors.InvalidRequest(
                f"{who}: a chunk of this model is {self.block_size_bytes} bytes (one row of the CPU "
                f"tier), {_common.over_limit(self.block_size_bytes, limit)} Or offload in smaller "
                f"chunks (a smaller offloading block_size, fewer GPU blocks per chunk)."
            )
        self.space = _common.Namespaces(self.store, None if replication is None else int(replication)).get(ns)
        view = primary_kv_view
        self._base = ctypes.addressof(ctypes.c_char.from_buffer(view))
        self._buffer = self.space.register_buffer(self._base, view.nbytes)
        self._lookups = _Lookups(self, tier_type)
        self._stores = ThreadPoolExecutor(max_workers=2, thread_name_prefix=f"ctxpod-{tier_type}")
        # Jobs in flight: job id -> (keys, a store's future or a load's ticket, start).
        self._inflight: dict[int, tuple[list[OffloadKey], Any, float]] = {}
        self._finished: deque[JobResult] = deque()
        self._lock = threading.Lock()
        #: Chunks this tier moved, and chunks it did not send because the pod held them.
        self.stats = {"stored_chunks": 0, "skipped_chunks": 0, "loaded_chunks": 0, "failed_chunks": 0}

    def _spans(self, job: TransferJob) -> tuple[list[int], list[int]]:
        bs = self.block_size_bytes
        return [self._base + int(c) * bs for c in job.chunk_ids], [bs] * len(job.chunk_ids)

    # -- lookups ---------------------------------------------------------------------

    def lookup(self, key: OffloadKey, req_context: ReqContext) -> LookupResult:
        found = self._lookups.lookup(key, req_context)
        if found is None:
            return LookupResult.RETRY
        return LookupResult.HIT if found else LookupResult.MISS

    def on_schedule_end(self, context: ScheduleEndContext) -> None:
        self._lookups.flush()

    def on_new_request(self, req_context: ReqContext) -> RequestOffloadingContext:
        return RequestOffloadingContext()

    def on_request_finished(self, req_context: ReqContext) -> None:
        self._lookups.cleanup(req_context.req_id)

    # -- transfers -------------------------------------------------------------------

    def submit_store(self, job_metadata: TransferJob) -> None:
        keys = [bytes(k) for k in job_metadata.keys]
        ptrs, sizes = self._spans(job_metadata)
        fut = self._stores.submit(self._store, keys, ptrs, sizes)
        with self._lock:
            self._inflight[job_metadata.job_id] = (list(job_metadata.keys), fut, time.monotonic())

    def _store(self, keys: list[bytes], ptrs: list[int], sizes: list[int]) -> int:
        """Puts the rows the pod does not hold yet; the bytes sent."""
        if self.skip_held:
            held = self.space.batch_exists(keys)
            todo = [i for i, h in enumerate(held) if not h]
            with self._lock:
                self.stats["skipped_chunks"] += len(keys) - len(todo)
            keys, ptrs, sizes = ([x[i] for i in todo] for x in (keys, ptrs, sizes))
        if not keys:
            return 0
        codes = self.space.batch_put_from(keys, ptrs, sizes, durable=self.durable)
        # -409: the key holds other bytes from an earlier compute of the same chunk (KV is
        # not bit-identical across batch shapes); as good a chunk, so kept.
        bad = [c for c in codes if c not in (0, -409)]
        with self._lock:
            self.stats["stored_chunks"] += len(codes) - len(bad)
            self.stats["failed_chunks"] += len(bad)
        if bad:
            raise errors.from_status(-bad[0], f"ctxpod refused {len(bad)} of {len(codes)} chunks")
        return sum(sizes)

    def submit_load(self, job_metadata: TransferJob) -> None:
        keys = list(job_metadata.keys)
        ptrs, sizes = self._spans(job_metadata)
        try:
            t = self.space.prefetch([bytes(k) for k in keys], into=(ptrs, sizes), lease_ms=0)
        except errors.CtxpodError as e:
            logger.warning("ctxpod: load job %d: %s", job_metadata.job_id, e)
            self._lookups.mark_miss(keys)
            self._finished.append(JobResult(job_id=job_metadata.job_id, success=False, successful_keys=()))
            return
        with self._lock:
            self._inflight[job_metadata.job_id] = (keys, t, time.monotonic())

    def _result(self, job_id: int, keys: list[OffloadKey], work: Any, started: float) -> JobResult:
        took = time.monotonic() - started
        if isinstance(work, Future):
            try:
                sent = work.result()
                return JobResult(job_id=job_id, success=True, transfer_time=took, transfer_bytes=sent)
            except Exception as e:  # noqa: BLE001 (reported as a failed store, as vLLM expects)
                logger.warning("ctxpod: store job %d: %s", job_id, e)
                return JobResult(job_id=job_id, success=False, transfer_time=took)
        codes = work.wait(0)
        ok = [k for k, c in zip(keys, codes) if c == self.block_size_bytes]
        self.stats["loaded_chunks"] += len(ok)
        self.stats["failed_chunks"] += len(keys) - len(ok)
        if len(ok) < len(keys):
            # Answer MISS from now on for what did not land, or vLLM asks for it again.
            self._lookups.mark_miss([k for k, c in zip(keys, codes) if c != self.block_size_bytes])
        return JobResult(job_id=job_id, success=len(ok) == len(keys), successful_keys=ok,
                         transfer_time=took, transfer_bytes=len(ok) * self.block_size_bytes)

    def _done(self, work: Any) -> bool:
        return work.done() if isinstance(work, Future) else work.ready()

    def get_finished_jobs(self) -> Iterable[JobResult]:
        with self._lock:
            done = [(j, v) for j, v in self._inflight.items() if self._done(v[1])]
            for j, _ in done:
                del self._inflight[j]
        out = [self._finished.popleft() for _ in range(len(self._finished))]
        out += [self._result(j, keys, work, t0) for j, (keys, work, t0) in done]
        return out

    def has_pending_work(self) -> bool:
        return bool(self._inflight) or bool(self._finished)

    def drain_jobs(self) -> None:
        """Waits for every job in flight (vLLM's cache reset); the results stay queued."""
        with self._lock:
            inflight = list(self._inflight.values())
        for _, work, _ in inflight:
            if isinstance(work, Future):
                work.exception()
            else:
                work.wait()

    def shutdown(self) -> None:
        self.drain_jobs()
        self._stores.shutdown(wait=True)
        self._lookups.shutdown()
        self.space.unregister_buffer(self._buffer)
        self.store.close()
