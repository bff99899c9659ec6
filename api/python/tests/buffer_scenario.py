"""Issue #32, item 2, as a program of its own: a registered 4 MiB torch tensor is resized
to 256 MiB and re-``set_`` to another storage while a prefetch of 64 blocks of 64 KiB into
it is in flight, then garbage-collected; unrelated bytearrays are allocated where the old
memory was. Every later call that names the tensor's old memory must raise, the ticket in
flight must either complete into memory still allocated or raise, and no byte outside the
SDK's own memory may change.

Run by test_buffers.py in a subprocess (a write through freed memory may kill the process:
the test asserts on the exit status and on the JSON report this prints last), and by hand
under a memory checker::

    PYTHONMALLOC=debug MALLOC_CHECK_=3 MALLOC_PERTURB_=165 \\
        python api/python/tests/buffer_scenario.py http://127.0.0.1:7400 [mode]

Prints one JSON object: what each call did, and which bytes changed.
"""

from __future__ import annotations

import gc
import json
import sys
import time
import uuid

import numpy as np
import torch

import ctxpod
from ctxpod import errors

BLOCK = 64 << 10
BLOCKS = 64
TENSOR = BLOCK * BLOCKS  # 4 MiB
GROWN = 256 << 20
FILL = 0xA5


def outcome(fn) -> str:
    """``"ok: <value>"`` or ``"<ExceptionClass>: <message>"`` of one call."""
    try:
        return f"ok: {fn()!r}"[:300]
    except Exception as e:  # noqa: BLE001 (the report says what was raised)
        return f"{type(e).__name__}: {e}"[:300]


def main(url: str, mode: str = "resize_set") -> dict:
    """``mode``: ``resize_set`` (the issue's: resize_ to 256 MiB, then set_, under a running
    prefetch), ``set_before_wait`` (set_ between the prefetch and its wait), or
    ``numpy_view`` (a numpy view of the tensor registered, the tensor moved to shared
    memory: torch refuses to resize a storage a numpy array views, but ``share_memory_``
    moves it and frees the bytes the view points at)."""
    store = ctxpod.Store.connect(url, namespace=f"scn-{uuid.uuid4().hex[:12]}")
    store.create_namespace()
    keys = [f"scn{i}".encode() for i in range(BLOCKS)]
    vals = [bytes([i + 1]) * BLOCK for i in range(BLOCKS)]
    assert store.batch_put(keys, vals, durable=False) == [201] * BLOCKS

    report: dict = {"mode": mode}
    t = torch.zeros(TENSOR, dtype=torch.uint8)
    buf = store.register_buffer(t.numpy() if mode == "numpy_view" else t)
    old_ptr = buf.ptr
    offsets = [i * BLOCK for i in range(BLOCKS)]
    ptrs = [old_ptr + o for o in offsets]

    ticket = store.prefetch(keys, into=(buf, offsets))
    report["in_flight_at_change"] = not ticket.ready()
    if mode == "resize_set":
        # The tensor grows: torch moves it and frees its old memory.
        t.resize_(GROWN)
        report["moved"] = t.data_ptr() != old_ptr
    if mode == "numpy_view":
        t.share_memory_()
        report["moved"] = t.data_ptr() != old_ptr
    if mode in ("resize_set", "set_before_wait"):
        fresh = torch.zeros(TENSOR, dtype=torch.uint8)
        t.set_(fresh.untyped_storage())
        del fresh
    moved_copy = t.clone() if mode == "numpy_view" else None
    gc.collect()

    # Unrelated memory, allocated after the GC: likely where the old memory was.
    victims = [bytearray([FILL]) * TENSOR for _ in range(4)] + [bytearray([FILL]) * BLOCK for _ in range(64)]

    report["ticket_wait"] = outcome(lambda: ticket.wait(timeout=30))
    time.sleep(0.2)  # let any push still in flight land
    report["prefetch_after"] = outcome(lambda: store.prefetch(keys, into=(buf, offsets)).wait(timeout=30))
    report["prefetch_ptrs_after"] = outcome(lambda: store.prefetch(keys, into=(ptrs, [BLOCK] * BLOCKS)).wait(timeout=30))
    report["batch_get_into_after"] = outcome(lambda: store.batch_get_into(keys, ptrs, [BLOCK] * BLOCKS))
    report["get_into_after"] = outcome(lambda: store.get_into(keys[0], old_ptr, BLOCK))
    report["put_from_after"] = outcome(lambda: store.batch_put_from([b"scn-from"], [old_ptr], [BLOCK]))
    time.sleep(0.2)

    report["victim_bytes_changed"] = sum(
        int(np.count_nonzero(np.frombuffer(v, dtype=np.uint8) != FILL)) for v in victims
    )
    # The tensor's memory now (its new storage, or the grown one past the old 4 MiB): the
    # SDK never wrote it.
    if mode == "numpy_view":
        # Its shared-memory copy holds what had landed before the move, no more: compare
        # with a copy taken right away.
        report["tensor_bytes_changed"] = int(torch.count_nonzero(t != moved_copy).item())
    else:
        report["tensor_bytes_changed"] = int(torch.count_nonzero(t).item())
    report["put_from_stored"] = store.exists(b"scn-from")
    del ticket
    report["unregistered"] = store.unregister_buffer(buf)
    store.delete_namespace()
    return report


if __name__ == "__main__":
    print(json.dumps(main(*sys.argv[1:3])), flush=True)
