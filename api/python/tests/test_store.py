"""The SDK against one real node: every call, per-entry codes, caller memory, bad input."""

from __future__ import annotations

import asyncio
import gc
import os
import threading
import uuid

import numpy as np
import pytest

import ctxpod
from ctxpod import errors


@pytest.fixture
def store(node):
    """A store on a namespace of its own."""
    s = ctxpod.Store.connect(node.http, namespace=f"t-{uuid.uuid4().hex[:12]}")
    s.create_namespace()
    yield s
    s.close()
    s.delete_namespace()


def blob(n: int, seed: int) -> bytes:
    return np.random.default_rng(seed).integers(0, 256, n, dtype=np.uint8).tobytes()


def test_connect_sees_the_node_and_its_cxp1_address(node, store):
    (m,) = store.members()
    assert m["http"] == node.http
    assert m["transfer"] == node.transfer
    assert store.replication() == 1


def test_put_get_exists_remove_round_trip(store):
    data = blob(100_000, 1)
    assert store.put(b"k1", data) == 201
    assert store.put(b"k1", data) == 200  # the same bytes again
    with pytest.raises(errors.Conflict):
        store.put(b"k1", b"other bytes")  # a block's bytes never change under its key
    assert store.get(b"k1") == data
    assert store.get(b"k1") == data
    assert store.exists(b"k1") and not store.exists(b"nope")
    assert store.get(b"nope") is None
    assert store.remove(b"k1") is True
    assert store.get(b"k1") is None and not store.exists(b"k1")
    assert store.remove(b"k1") is False


def test_namespaces_are_created_described_and_deleted(node):
    s = ctxpod.Store.connect(node.http, namespace="ns-life")
    with pytest.raises(errors.NotFound):
        s.namespace_info()
    with pytest.raises(errors.NotFound):
        s.put(b"k", b"v")  # no such namespace: nothing stored anywhere
    info = s.create_namespace(quota_bytes=1 << 20)
    assert info["name"] == "ns-life" and info["quota_bytes"] == 1 << 20
    s.put(b"k", b"v" * 10)
    assert s.namespace_info()["block_count"] == 1
    # Over the namespace's quota: 403, as the HTTP API answers it.
    with pytest.raises(errors.Forbidden):
        s.put(b"big", b"x" * (2 << 20))
    assert s.get(b"big") is None
    s.delete_namespace()
    with pytest.raises(errors.NotFound):
        s.namespace_info()


def test_keys_are_listed_in_pages_by_prefix(store, node):
    keys = [f"a/{i:04d}".encode() for i in range(25)] + [b"b/1", b"b/2", b"\x00", b"\xff\xff"]
    store.batch_put(keys, [b"v%d" % i for i in range(len(keys))], durable=False)
    # Every acknowledged put is listed, in byte order.
    assert list(store.keys()) == sorted(keys)
    page, after = store.list_keys("a/", limit=10)
    assert page == sorted(keys)[1:11] and after == page[-1]
    page, after = store.list_keys(b"a/", after=after, limit=10)
    assert page == [f"a/{i:04d}".encode() for i in range(10, 20)]
    page, after = store.list_keys("a/", after=after, limit=10)
    assert page == [f"a/{i:04d}".encode() for i in range(20, 25)] and after is None
    assert list(store.keys("b/", page_size=1)) == [b"b/1", b"b/2"]
    assert store.list_keys("zz") == ([], None)
    # A removed block is no longer listed; a cursor need not be a key.
    store.remove(b"b/1")
    assert store.list_keys("b/") == ([b"b/2"], None)
    assert store.list_keys(after=b"a/0024x")[0] == [b"b/2", b"\xff\xff"]
    # The namespace is the caller's: another namespace lists nothing of it.
    other = store.with_namespace(f"t-{uuid.uuid4().hex[:12]}")
    other.create_namespace()
    assert other.list_keys() == ([], None)
    assert other.namespace in [n["name"] for n in store.namespaces()]
    other.delete_namespace()
    # Bad arguments are refused before anything is sent.
    for bad in (0, ctxpod.LIST_KEYS_MAX + 1):
        with pytest.raises(errors.InvalidRequest):
            store.list_keys(limit=bad)
    with pytest.raises(TypeError):
        store.list_keys(42)
    with pytest.raises(errors.InvalidRequest):
        store.list_keys(b"x" * (ctxpod.KEY_BYTES_MAX + 1))
    with pytest.raises(errors.NotFound):
        store.with_namespace("no-such-ns").list_keys()


def test_keys_may_be_bytes_str_or_int(store):
    store.put("text-key", b"s")
    store.put(0xDEADBEEF, b"i")
    assert store.get(b"text-key") == b"s"
    assert store.get((0xDEADBEEF).to_bytes(8, "big")) == b"i"
    assert store.get(ctxpod.dynamo_key(0xDEADBEEF)) == b"i"


def test_values_are_any_buffer_read_in_place(store):
    arr = np.arange(1000, dtype=np.float32)
    store.batch_put([b"np", b"ba", b"mv"], [arr, bytearray(b"abc"), memoryview(b"xyz")])
    assert np.frombuffer(store.get(b"np"), dtype=np.float32).tolist() == arr.tolist()
    assert store.batch_get([b"ba", b"mv", b"none"]) == [b"abc", b"xyz", None]


def test_fast_durability_is_stored_too(store):
    assert store.put(b"fast", b"f" * 5000, durable=False) == 201
    assert store.get(b"fast") == b"f" * 5000


def test_batch_calls_answer_per_entry(store):
    keys = [f"b{i}".encode() for i in range(32)]
    vals = [blob(64 * 1024, i) for i in range(32)]
    assert store.batch_put(keys, vals) == [201] * 32
    assert store.batch_exists(keys + [b"missing"]) == [True] * 32 + [False]
    assert store.batch_get(keys) == vals
    bufs = [bytearray(64 * 1024) for _ in keys] + [bytearray(10)]
    assert store.batch_get_into(keys + [b"missing"], bufs) == [64 * 1024] * 32 + [-404]
    assert [bytes(b) for b in bufs[:32]] == vals
    assert store.batch_remove(keys[:2] + [b"missing"]) == [True, True, False]
    assert store.batch_exists(keys[:3]) == [False, False, True]


def test_a_batch_over_one_frame_is_split(store):
    # 24 × 4 MiB = 96 MiB: more than one 64 MiB CXP1 frame.
    keys = [f"big{i}".encode() for i in range(24)]
    vals = [bytes([i]) * (4 << 20) for i in range(24)]
    assert store.batch_put(keys, vals) == [201] * 24
    got = store.batch_get(keys)
    assert all(g == v for g, v in zip(got, vals))


def test_match_prefix_counts_leading_blocks(store):
    chain = [f"c{i}".encode() for i in range(10)]
    store.batch_put(chain[:6], [b"x"] * 6)
    store.put(chain[7], b"x")
    assert store.match_prefix(chain) == 6
    assert store.match_prefix(chain[6:]) == 0
    assert store.match_prefix([]) == 0


def test_pin_and_unpin_count_present_blocks(store):
    store.batch_put([b"p1", b"p2"], [b"1", b"2"])
    assert store.pin([b"p1", b"p2", b"absent"], ttl=30) == 2
    assert store.unpin([b"p1", b"p2", b"absent"]) == 2


def test_get_into_a_buffer_too_small_writes_nothing(store):
    store.put(b"ten", b"0123456789")
    small = bytearray(b"#" * 4)
    with pytest.raises(errors.TooLarge) as e:
        store.get_into(b"ten", small)
    assert e.value.status == 413
    assert small == bytearray(b"#" * 4)
    assert store.get_into(b"absent", bytearray(4)) is None


def test_prefetch_lands_in_caller_memory_and_nowhere_else(store):
    sizes = [4096, 1000, 65536, 1]
    keys = [f"pf{i}".encode() for i in range(4)]
    vals = [blob(n, 10 + i) for i, n in enumerate(sizes)]
    store.batch_put(keys, vals)
    # Entries with a guard gap around each, in one numpy array.
    guard = 0xA5
    mem = np.full(200_000, guard, dtype=np.uint8)
    buf = store.register_buffer(mem)
    offsets, o = [], 512
    for n in sizes:
        offsets.append(o)
        o += n + 777
    t = store.prefetch(keys + [b"absent"], into=(buf, offsets + [o]), sizes=sizes + [100])
    codes = t.wait()
    assert codes == sizes + [-404]
    assert t.ready() and t.progress() == (4, 1, True)
    expect = np.full(200_000, guard, dtype=np.uint8)
    for off, v in zip(offsets, vals):
        expect[off : off + len(v)] = np.frombuffer(v, dtype=np.uint8)
    # Byte for byte: the blocks where asked, every other byte untouched.
    assert np.array_equal(mem, expect)
    del t
    assert store.unregister_buffer(buf) is True
    assert store.unregister_buffer(buf) is False


def test_large_reads_into_registered_memory_land_in_place(store):
    # Every byte where asked, nothing else.
    keys = [f"lr{i}".encode() for i in range(6)]
    vals = [blob(1 << 20, 70 + i) for i in range(6)]
    store.batch_put(keys, vals)
    mem = np.full(8 << 20, 0x3C, dtype=np.uint8)
    b = store.register_buffer(mem)
    ptrs = [b.ptr + 4096 + i * ((1 << 20) + 4096) for i in range(6)]
    assert store.batch_get_into(keys + [b"nope"], ptrs + [b.ptr], [1 << 20] * 6 + [100]) == [1 << 20] * 6 + [-404]
    expect = np.full(8 << 20, 0x3C, dtype=np.uint8)
    for p, v in zip(ptrs, vals):
        expect[p - b.ptr : p - b.ptr + len(v)] = np.frombuffer(v, dtype=np.uint8)
    assert np.array_equal(mem, expect)


def test_prefetch_by_pointers_and_block_by_block(store):
    keys = [f"pp{i}".encode() for i in range(8)]
    vals = [blob(8192, 40 + i) for i in range(8)]
    store.batch_put(keys, vals)
    mem = bytearray(8192 * 8)
    b = store.register_buffer(mem)
    ptrs = [b.ptr + i * 8192 for i in range(8)]
    t = store.prefetch(keys, into=(ptrs, [8192] * 8), policy="best_effort")
    for i in range(8):
        code = t.wait_for(i, timeout=30)
        assert code == 8192, (i, code)
        assert bytes(mem[i * 8192 : (i + 1) * 8192]) == vals[i]
    assert t.wait() == [8192] * 8
    assert t.keys == keys


def test_prefetch_into_a_torch_like_tensor_and_raw_pointer(store):
    store.put(b"raw", b"R" * 100)
    arr = np.zeros(4096, dtype=np.uint8)
    # Mooncake's register_buffer(ptr, size): memory the caller keeps alive itself.
    ptr = arr.ctypes.data
    b = store.register_buffer(ptr, 4096)
    assert b.obj is None and b.ptr == ptr
    assert store.prefetch([b"raw"], into=([ptr + 100], [200])).wait() == [100]
    assert bytes(arr[100:200]) == b"R" * 100 and not arr[:100].any() and not arr[200:].any()
    assert store.unregister_buffer(ptr)


def test_mooncake_shaped_calls(store):
    mem = np.zeros(3 * 1024, dtype=np.uint8)
    mem[:] = np.frombuffer(blob(3 * 1024, 7), dtype=np.uint8)
    b = store.register_buffer(mem)
    ptrs = [b.ptr, b.ptr + 1024, b.ptr + 2048]
    assert store.batch_put_from([b"m0", b"m1", b"m2"], ptrs, [1024] * 3) == [0, 0, 0]
    assert store.put_from(b"m3", b.ptr, 10) == 0
    assert store.batch_is_exist([b"m0", b"m3", b"zz"]) == [1, 1, 0]
    assert store.is_exist(b"zz") == 0
    want = mem.copy()
    mem[:] = 0
    # Into registered memory a read is a prefetch: each block straight from the socket
    # into its place.
    out = np.zeros(4 * 1024, dtype=np.uint8)
    o = store.register_buffer(out)
    got = store.batch_get_into([b"m2", b"m1", b"m0", b"zz"], [o.ptr, o.ptr + 1024, o.ptr + 2048, o.ptr + 3072], [1024] * 4)
    assert got == [1024, 1024, 1024, -404]
    assert not out[3072:].any()
    mem[:] = out[:3072]
    assert bytes(mem[:1024]) == bytes(want[2048:]) and bytes(mem[2048:]) == bytes(want[:1024])
    assert store.get_into(b"m3", o.ptr + 3072, 1024) == 10
    assert bytes(out[3072:3082]) == bytes(want[:10])


def test_prefetch_from_asyncio(store):
    keys = [f"as{i}".encode() for i in range(4)]
    store.batch_put(keys, [b"a" * 1000] * 4)
    mem = bytearray(4000)
    buf = store.register_buffer(mem)

    async def main():
        t = store.prefetch(keys, into=(buf, [0, 1000, 2000, 3000]))
        # The event loop keeps running while the ticket is in flight.
        ticks = 0

        async def tick():
            nonlocal ticks
            while True:
                ticks += 1
                await asyncio.sleep(0)

        ticker = asyncio.ensure_future(tick())
        codes = await t
        ticker.cancel()
        return codes, ticks

    codes, ticks = asyncio.run(main())
    assert codes == [1000] * 4 and ticks >= 1
    assert bytes(mem) == b"a" * 4000


def test_a_live_prefetch_reserves_its_ranges(store):
    store.put(b"r", b"r" * 10)
    mem = bytearray(100)
    buf = store.register_buffer(mem)
    t = store.prefetch([b"r"], into=(buf, [0]))
    # Until the ticket is seen done, its bytes (room up to the buffer's end) cannot be the
    # target of another prefetch.
    with pytest.raises(errors.InvalidRequest, match="overlap"):
        store.prefetch([b"r"], into=(buf, [50]), sizes=[10])
    assert t.wait() == [10]
    # Done: the same buffer is reused at once, the finished ticket still alive.
    t2 = store.prefetch([b"r"], into=(buf, [50]), sizes=[10])
    assert t2.wait() == [10] and t.ready()
    for _ in range(3):
        t = store.prefetch([b"r"], into=(buf, [0]), sizes=[10])
        assert t.wait() == [10]
    assert bytes(mem[:10]) == bytes(mem[50:60]) == b"r" * 10


def test_batches_over_the_protocols_entry_limits_are_split(store):
    # 1024 entries per PUT request, 4096 keys per GET / PREFETCH / PIN list.
    keys = [f"many{i}".encode() for i in range(5000)]
    vals = [i.to_bytes(4, "little") * 2 for i in range(5000)]
    assert store.batch_put(keys, vals) == [201] * 5000
    assert store.batch_exists(keys[::7]) == [True] * len(keys[::7])
    assert store.batch_get(keys) == vals
    assert store.pin(keys, ttl=10) == 5000 and store.unpin(keys) == 5000
    mem = np.zeros(5000 * 8, dtype=np.uint8)
    buf = store.register_buffer(mem)
    t = store.prefetch(keys, into=(buf, [i * 8 for i in range(5000)]))
    assert t.wait() == [8] * 5000
    assert mem.tobytes() == b"".join(vals)


def test_cancel_and_deadline(store):
    store.put(b"c", b"c")
    mem = bytearray(16)
    buf = store.register_buffer(mem)
    t = store.prefetch([b"c"], into=(buf, [0]), policy="timeout", deadline_ms=10_000)
    t.cancel()
    (code,) = t.wait(timeout=30)
    assert code in (1, -499)
    with pytest.raises(errors.InvalidRequest, match="deadline"):
        store.prefetch([b"c"], into=(buf, [0]), policy="timeout")


def test_events_stream_stored_and_deleted_keys(store):
    with store.events() as ev:
        store.put(b"e1", b"1")
        store.remove(b"e1")
        got = []
        while len(got) < 2:
            e = ev.next(timeout=10)
            assert e is not None, got
            got.append(e)
    assert got == [ctxpod.Event("stored", b"e1"), ctxpod.Event("deleted", b"e1")]


def test_calls_release_the_gil(store):
    # A thread blocked waiting for an event holds no GIL: this thread runs the put that
    # wakes it. (Were the GIL held, the put could only run after the wait timed out, and
    # the waiter would see nothing.)
    seen = []
    with store.events() as ev:
        ready = threading.Event()

        def waiter():
            ready.set()
            seen.append(ev.next(timeout=30))

        th = threading.Thread(target=waiter)
        th.start()
        ready.wait()
        store.put(b"wake", b"w")
        th.join()
    assert seen == [ctxpod.Event("stored", b"wake")]


# -- bad input: a clear exception, nothing stored -------------------------------------


def test_bad_keys_and_types(store):
    with pytest.raises(errors.InvalidRequest, match="1..=128"):
        store.put(b"", b"x")
    with pytest.raises(errors.InvalidRequest, match="1..=128"):
        store.put(b"k" * 129, b"x")
    with pytest.raises(TypeError, match="bytes, str or int"):
        store.put(1.5, b"x")
    with pytest.raises(errors.InvalidRequest):
        store.put(-1, b"x")
    with pytest.raises(TypeError):
        store.put(b"k", 12345)  # not a buffer
    with pytest.raises(TypeError, match="sequence of keys"):
        store.batch_exists(b"abc")
    with pytest.raises(errors.InvalidRequest, match="2 keys but 1 values"):
        store.batch_put([b"a", b"b"], [b"1"])
    assert store.batch_exists([b"k", b"a", b"b"]) == [False, False, False]


def test_bad_buffers(store):
    with pytest.raises(errors.InvalidRequest, match="read-only"):
        store.register_buffer(b"immutable bytes")
    with pytest.raises(errors.InvalidRequest, match="C-contiguous"):
        store.register_buffer(np.zeros((10, 10), dtype=np.uint8)[:, ::2])
    with pytest.raises(errors.InvalidRequest, match="null"):
        store.register_buffer(0, 10)
    with pytest.raises(errors.InvalidRequest, match="read-only"):
        store.get_into(b"x", b"not writable")
    mem = bytearray(1000)
    store.register_buffer(mem)
    with pytest.raises(errors.InvalidRequest, match="overlap"):
        store.register_buffer(memoryview(mem)[100:200])


def test_a_freed_or_unregistered_buffer_is_refused(store):
    store.put(b"u", b"u" * 10)
    mem = bytearray(64)
    buf = store.register_buffer(mem)
    # While registered, the bytearray cannot be resized (its memory is lent).
    with pytest.raises(BufferError):
        mem.extend(b"x" * 10_000)
    ptr = buf.ptr
    store.unregister_buffer(buf)
    with pytest.raises(errors.InvalidRequest, match="not registered"):
        store.prefetch([b"u"], into=(buf, [0]))
    with pytest.raises(errors.InvalidRequest, match="not inside a registered buffer"):
        store.prefetch([b"u"], into=([ptr], [10]))
    with pytest.raises(errors.InvalidRequest, match="not inside a registered buffer"):
        store.batch_get_into([b"u"], [ptr], [10])
    with pytest.raises(errors.InvalidRequest, match="not inside a registered buffer"):
        store.batch_put_from([b"v"], [ptr], [10])
    assert store.get(b"v") is None
    # Unregistered, it may be resized again.
    mem.extend(b"x" * 10_000)


def test_registered_memory_outlives_the_callers_reference(store):
    store.put(b"keep", b"K" * 4096)
    arr = np.zeros(8192, dtype=np.uint8)
    buf = store.register_buffer(arr)
    del arr
    gc.collect()
    t = store.prefetch([b"keep"], into=(buf, [4096]))
    assert t.wait() == [4096]
    view = np.asarray(buf.obj)
    assert bytes(view[4096:]) == b"K" * 4096 and not view[:4096].any()


def test_out_of_range_prefetch_is_refused_with_nothing_sent(store):
    mem = bytearray(100)
    buf = store.register_buffer(mem)
    with pytest.raises(errors.InvalidRequest, match="not inside a registered buffer"):
        store.prefetch([b"a"], into=(buf, [90]), sizes=[20])
    with pytest.raises(errors.InvalidRequest, match="policy"):
        store.prefetch([b"a"], into=(buf, [0]), policy="eventually")
    with pytest.raises(errors.InvalidRequest, match="lease_ms"):
        store.prefetch([b"a"], into=(buf, [0]), lease_ms=10**9)
    with pytest.raises(errors.InvalidRequest, match="2 keys, 1 places"):
        store.prefetch([b"a", b"b"], into=(buf, [0]))
    assert mem == bytearray(100)


def test_bad_connect_arguments():
    with pytest.raises(errors.InvalidRequest, match="HTTP URL"):
        ctxpod.Store.connect("127.0.0.1:7401")
    with pytest.raises(errors.InvalidRequest, match="ca_file"):
        ctxpod.Store.connect("https://127.0.0.1:1")
    with pytest.raises(errors.Unavailable):
        ctxpod.Store.connect(f"http://127.0.0.1:{_closed_port()}")


def test_connect_to_another_http_service_names_the_url(other_http_service):
    """A seed URL of an HTTP service that is not a ctxpod node (a wrong port, another
    service) is refused naming that URL and what was expected, not as a bare
    ``NotFound: HTTP 404: None``."""
    url = other_http_service.url
    with pytest.raises(errors.ProtocolError) as e:
        ctxpod.Store.connect(url)
    msg = str(e.value)
    assert url in msg and "not a ctxpod node" in msg and "GET /v1/cluster" in msg, msg
    assert not isinstance(e.value, errors.NotFound)


def _closed_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_dynamo_block_hashes_match_the_cli(node):
    import subprocess

    from conftest import BIN

    tokens = list(range(1, 33))
    out = subprocess.run([BIN, "hash", "--block-size", "16", *map(str, tokens)], capture_output=True, text=True, check=True).stdout
    hashes = ctxpod.dynamo_block_hashes(tokens, 16)
    assert len(hashes) == 2
    for h in hashes:
        assert ctxpod.dynamo_key(h).hex() in out
    # Dynamo's published vectors (ai-dynamo/dynamo lib/llm/src/tokens.rs, block size 4,
    # no salt): two tokens of a partial block are not hashed.
    assert ctxpod.dynamo_block_hashes(list(range(1, 15)), 4) == [
        14643705804678351452,
        4945711292740353085,
        12583592247330656132,
    ]
    with pytest.raises(errors.InvalidRequest):
        ctxpod.dynamo_block_hashes([1], 0)


# -- authentication --------------------------------------------------------------------


def test_tokens_roles_and_tenants(auth_node):
    url, t = auth_node.http, auth_node.tokens
    with pytest.raises(errors.Unauthorized):
        ctxpod.Store.connect(url, "ns", token="acme-rw.not-the-secret").put(b"k", b"v")
    with pytest.raises(errors.Unauthorized):
        ctxpod.Store.connect(url, "ns").put(b"k", b"v")
    rw = ctxpod.Store.connect(url, "shared", token=t["rw"])
    rw.create_namespace()
    assert rw.put(b"k", b"acme's") == 201
    ro = ctxpod.Store.connect(url, "shared", token=t["ro"])
    assert ro.get(b"k") == b"acme's" and ro.direct_calls() == 1
    with pytest.raises(errors.Forbidden):
        ro.put(b"k2", b"x")
    assert rw.get(b"k2") is None
    # Another tenant's namespace of the same name is another namespace.
    other = ctxpod.Store.connect(url, "shared", token=t["other"])
    assert other.get(b"k") is None
    with pytest.raises(errors.NotFound):
        other.put(b"k", b"globex's")  # its own "shared" does not exist yet
    other.create_namespace()
    assert other.get(b"k") is None and other.match_prefix([b"k"]) == 0
    assert other.put(b"k", b"globex's") == 201
    assert rw.get(b"k") == b"acme's"
    admin = ctxpod.Store.connect(url, "shared", token=t["admin"])
    assert admin.members()[0]["http"] == url


def test_version_and_constants():
    assert ctxpod.__version__.count(".") == 2
    assert ctxpod.KEY_BYTES_MAX == 128 and ctxpod.BLOCK_BYTES_MAX == 8 << 20
    assert os.path.exists(os.path.join(os.path.dirname(ctxpod.__file__), "py.typed"))


def test_a_test_node_whose_port_was_taken_starts_on_others(root, monkeypatch):
    """The harness: a port taken between picking it and the node binding it (another
    test's connection got it) makes the node exit saying so; it starts on other ports."""
    import socket

    import conftest

    taken = socket.socket()
    taken.bind(("127.0.0.1", 0))
    taken.listen()
    port = taken.getsockname()[1]
    real = conftest.free_port
    handed = iter([port])
    monkeypatch.setattr(conftest, "free_port", lambda: next(handed, None) or real())
    try:
        n = conftest.Node(root, f"port-taken-{uuid.uuid4().hex[:6]}")
        try:
            assert n.port != port
            assert "Address already in use" in (n.dir / "node.log").read_text()
            assert ctxpod.Store.connect(n.http).members()
        finally:
            n.stop()
    finally:
        taken.close()
