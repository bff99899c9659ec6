"""Registered memory stays alive and unmoved while the SDK may write it (issue #32, item 2):
a torch tensor resized or re-``set_`` after registration is refused at the next use with
nothing written, a prefetch in flight never writes freed memory, and raw ``(ptr, size)``
registrations say who keeps the memory alive.

The scenarios that wrote through freed memory before the fix (up to SIGSEGV) run in a
subprocess (buffer_scenario.py), so that this suite survives them and asserts on their
outcome."""

from __future__ import annotations

import asyncio
import gc
import json
import os
import subprocess
import sys
import uuid
from pathlib import Path

import numpy as np
import pytest

import ctxpod
from ctxpod import errors

torch = pytest.importorskip("torch", reason="the tensor suites need torch (scripts/test.sh installs it)")

SCENARIO = Path(__file__).with_name("buffer_scenario.py")
BLOCK = 64 << 10


@pytest.fixture
def store(node):
    s = ctxpod.Store.connect(node.http, namespace=f"b-{uuid.uuid4().hex[:12]}")
    s.create_namespace()
    yield s
    s.close()
    s.delete_namespace()


def scenario(node, mode: str, env: dict | None = None) -> dict:
    """Runs buffer_scenario.py in a process of its own: its report, after asserting that
    it exited normally (a write to unmapped memory ends it with SIGSEGV)."""
    run = subprocess.run(
        [sys.executable, str(SCENARIO), node.http, mode],
        capture_output=True, text=True, timeout=300, env=dict(os.environ, **(env or {})),
    )
    assert run.returncode == 0, f"the scenario died: rc {run.returncode}\n{run.stdout[-2000:]}\n{run.stderr[-4000:]}"
    return json.loads(run.stdout.strip().splitlines()[-1])


def refused(outcome: str) -> bool:
    return outcome.startswith("InvalidRequest: ")


@pytest.mark.parametrize("mode", ["resize_set", "set_before_wait", "numpy_view"])
def test_a_tensor_moved_under_a_running_prefetch_is_never_written_through(node, mode):
    r = scenario(node, mode)
    # The ticket in flight either completed into memory the SDK still held, or raised.
    assert r["ticket_wait"].startswith("ok: [") or refused(r["ticket_wait"]), r
    # Every later use of the moved tensor's memory is refused before anything is sent ...
    for call in ("prefetch_after", "prefetch_ptrs_after", "batch_get_into_after", "get_into_after", "put_from_after"):
        assert refused(r[call]), (call, r)
    assert not r["put_from_stored"], r
    # ... and not one byte of unrelated memory, nor of the tensor's new memory, changed.
    assert r["victim_bytes_changed"] == 0, r
    assert r["tensor_bytes_changed"] == 0, r
    assert r["unregistered"] is True


def test_the_refusal_names_the_buffer_and_what_changed(store):
    store.put(b"k", b"k" * BLOCK)
    t = torch.zeros(4 * BLOCK, dtype=torch.uint8)
    buf = store.register_buffer(t)
    # A shrink keeps the memory (torch does not reallocate), but the tensor is no longer
    # what was registered.
    t.resize_(BLOCK)
    with pytest.raises(errors.InvalidRequest, match=rf"buffer {buf.id} .*torch tensor.*{4 * BLOCK} bytes.*now {BLOCK} bytes"):
        store.prefetch([b"k"], into=(buf, [0]))
    t.resize_(4 * BLOCK)  # back as it was: usable again
    assert store.prefetch([b"k"], into=(buf, [BLOCK])).wait() == [BLOCK]
    other = torch.zeros(4 * BLOCK, dtype=torch.uint8)
    t.set_(other.untyped_storage())
    with pytest.raises(errors.InvalidRequest, match=r"storage was replaced \(set_\)"):
        store.batch_get_into([b"k"], [buf.ptr], [BLOCK])
    assert not other.any()
    # Unregistered, the tensor is the caller's again; registered anew, it is usable.
    assert store.unregister_buffer(buf)
    again = store.register_buffer(t)
    assert store.get_into(b"k", again.ptr + BLOCK, BLOCK) == BLOCK
    assert bytes(other[BLOCK : 2 * BLOCK].numpy()) == b"k" * BLOCK


def test_a_tensor_moved_before_its_ticket_is_read_raises_at_the_read(store):
    keys = [f"w{i}".encode() for i in range(8)]
    store.batch_put(keys, [bytes([i + 1]) * BLOCK for i in range(8)])
    t = torch.zeros(8 * BLOCK, dtype=torch.uint8)
    buf = store.register_buffer(t)
    ticket = store.prefetch(keys, into=(buf, [i * BLOCK for i in range(8)]))
    other = torch.zeros(8 * BLOCK, dtype=torch.uint8)
    t.set_(other.untyped_storage())
    gc.collect()
    with pytest.raises(errors.InvalidRequest, match=f"buffer {buf.id}"):
        ticket.wait(timeout=30)
    with pytest.raises(errors.InvalidRequest, match=f"buffer {buf.id}"):
        ticket.poll()
    assert not other.any()


def test_a_registered_tensor_receives_blocks_byte_for_byte(store):
    sizes = [BLOCK, 1000, 4096, 1]
    keys = [f"tb{i}".encode() for i in range(4)]
    vals = [np.random.default_rng(i).integers(0, 256, n, dtype=np.uint8).tobytes() for i, n in enumerate(sizes)]
    store.batch_put(keys, vals)
    t = torch.full((4 << 20,), 0x5A, dtype=torch.uint8)
    buf = store.register_buffer(t)
    # A tensor is guarded (blocks copied in after a check); a numpy array is not (its
    # buffer export keeps it in place: blocks pushed straight in).
    assert buf.guarded and not store.register_buffer(np.zeros(16, dtype=np.uint8)).guarded
    offsets, o = [], 333
    for n in sizes:
        offsets.append(o)
        o += n + 4097
    ticket = store.prefetch(keys + [b"absent"], into=(buf, offsets + [o]), sizes=sizes + [10])
    for i, n in enumerate(sizes):
        assert ticket.wait_for(i, timeout=30) == n
        assert bytes(t[offsets[i] : offsets[i] + n].numpy()) == vals[i]
    assert ticket.wait() == sizes + [-404]
    expect = torch.full((4 << 20,), 0x5A, dtype=torch.uint8)
    for off, v in zip(offsets, vals):
        expect[off : off + len(v)] = torch.frombuffer(bytearray(v), dtype=torch.uint8)
    assert torch.equal(t, expect)
    # Two tickets in flight may not target the same bytes of a tensor either.
    t1 = store.prefetch([keys[0]], into=(buf, [0]), sizes=[BLOCK])
    with pytest.raises(errors.InvalidRequest, match="overlap"):
        store.prefetch([keys[0]], into=(buf, [BLOCK // 2]), sizes=[BLOCK])
    assert t1.wait() == [BLOCK]
    # asyncio, the raw-pointer read and put_from into and from the tensor.
    assert asyncio.run(_awaited(store.prefetch([keys[1]], into=(buf, [2 * BLOCK]), sizes=[1000]))) == [1000]
    assert bytes(t[2 * BLOCK : 2 * BLOCK + 1000].numpy()) == vals[1]
    assert store.batch_get_into([keys[2], b"absent"], [buf.ptr + 3 * BLOCK, buf.ptr], [4096, 10]) == [4096, -404]
    assert bytes(t[3 * BLOCK : 3 * BLOCK + 4096].numpy()) == vals[2]
    assert store.batch_put_from([b"from-t"], [buf.ptr + 3 * BLOCK], [4096]) == [0]
    assert store.get(b"from-t") == vals[2]


async def _awaited(ticket):
    return await ticket


def test_raw_pointer_registrations_say_who_keeps_the_memory_alive():
    for doc in (ctxpod.Store.register_buffer.__doc__, ctxpod._ctxpod._Store.register.__doc__):
        assert "the caller keeps" in doc and "unregister" in doc, doc
    assert "keeps the memory alive" in ctxpod.Buffer.__doc__


def prefetch_tickets(node) -> int:
    """The node's count of prefetch tickets (its /metrics)."""
    import re
    import urllib.request

    text = urllib.request.urlopen(node.http + "/metrics", timeout=10).read().decode()
    return int(re.search(r"^ctxpod_prefetch_tickets_total (\d+)", text, re.M).group(1))


@pytest.mark.parametrize("kind", ["numpy", "torch"])
def test_registered_reads_small_and_large_land_the_same_bytes_and_codes(node, store, kind):
    """``batch_get_into`` into registered memory is a GET and a copy when its sizes add up
    to at most 1 MiB, a prefetch above (issue #35): both land every byte in place, leave
    the rest of the buffer as it was, and say -404 for a miss and -413 (nothing written)
    for a block larger than its room, into a numpy array (written directly) and a torch
    tensor (guarded: checked, then copied in)."""
    rng = np.random.default_rng(35)
    sizes = [BLOCK] * 8 + [1 << 20] * 2
    keys = [f"pp{i}".encode() for i in range(len(sizes))]
    vals = [rng.integers(0, 256, n, dtype=np.uint8).tobytes() for n in sizes]
    store.batch_put(keys, vals)
    size = 16 << 20
    mem = torch.full((size,), 0x5A, dtype=torch.uint8) if kind == "torch" else np.full(size, 0x5A, dtype=np.uint8)
    buf = store.register_buffer(mem)
    assert buf.guarded == (kind == "torch")
    view = mem.numpy() if kind == "torch" else mem
    expect = np.full(size, 0x5A, dtype=np.uint8)
    for label, idx, base, get_path in [
        ("small: 8 x 64 KiB, a miss and a short room", range(8), 0, True),
        ("large: 8 x 64 KiB and 2 x 1 MiB, a miss and a short room", range(10), 8 << 20, False),
    ]:
        ks = [keys[i] for i in idx] + [b"absent", keys[0]]
        rooms = [sizes[i] for i in idx] + [BLOCK, BLOCK - 1]
        ptrs, at = [], base
        for n in rooms:
            ptrs.append(buf.ptr + at)
            at += n + 512
        before = prefetch_tickets(node)
        got = store.batch_get_into(ks, ptrs, rooms)
        assert got == [sizes[i] for i in idx] + [-404, -413], label
        assert (prefetch_tickets(node) == before) == get_path, label
        for i, p in zip(idx, ptrs):
            expect[p - buf.ptr : p - buf.ptr + sizes[i]] = np.frombuffer(vals[i], dtype=np.uint8)
        assert np.array_equal(view, expect), label
