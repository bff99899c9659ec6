"""Direct calls (issue #35): a GET answered on the calling thread over a connection of its
own (``Store.connect(direct_connections=N)``), against real nodes: the same bytes as the
shared connection, connections bounded however many threads call, a connection the node
closed while idle replaced, a frozen node costing one deadline, a node that refuses the
extra connections served the shared way, tokens and tenants as on the shared connection."""

from __future__ import annotations

import os
import re
import signal
import threading
import time
import urllib.request
import uuid

import numpy as np
import pytest

import ctxpod
from ctxpod import errors

from conftest import Node, wait_for

#: A vLLM block of Llama-3-8B at its default block_size 16, one layer's K and V:
#: 2 x 16 tokens x 8 KV heads x 128 dims x 2 bytes (bf16).
VLLM_LAYER_BLOCK = 2 * 16 * 8 * 128 * 2


def blocks(n: int, seed: int, size: int = VLLM_LAYER_BLOCK) -> list[bytes]:
    rng = np.random.default_rng(seed)
    return [rng.integers(0, 256, size, dtype=np.uint8).tobytes() for _ in range(n)]


def connections_to(port: int) -> int:
    """Established TCP connections of this process to ``port`` on loopback."""
    mine = set()
    for fd in os.listdir("/proc/self/fd"):
        try:
            link = os.readlink(f"/proc/self/fd/{fd}")
        except OSError:
            continue
        if link.startswith("socket:["):
            mine.add(link[8:-1])
    n = 0
    with open("/proc/net/tcp") as f:
        for line in f.readlines()[1:]:
            p = line.split()
            if int(p[2].split(":")[1], 16) == port and p[3] == "01" and p[9] in mine:
                n += 1
    return n


def idle_closes(node: Node) -> int:
    """CXP1 connections the node closed as idle (its /metrics)."""
    text = urllib.request.urlopen(node.http + "/metrics", timeout=10).read().decode()
    m = re.search(r'^ctxpod_connections_refused_total\{listener="transfer",why="idle"\} (\d+)', text, re.M)
    return int(m.group(1)) if m else 0


@pytest.fixture(scope="module")
def idle_node(root):
    """A node that closes CXP1 connections idle for a second."""
    n = Node(root, "idle-1s", extra="idle_timeout_s = 1")
    yield n
    n.stop()


def store_on(node: Node, **kw) -> ctxpod.Store:
    s = ctxpod.Store.connect(node.http, namespace=f"d-{uuid.uuid4().hex[:12]}", **kw)
    s.create_namespace()
    return s


def test_every_get_shape_is_answered_directly_with_the_same_bytes(node):
    direct, shared = store_on(node), store_on(node, direct_connections=0)
    for s in (direct, shared):
        keys = [f"blk-{i}".encode() for i in range(32)]
        vals = blocks(len(keys), 1)
        assert s.batch_put(keys, vals) == [201] * len(keys)
        calls = 0
        assert s.get(keys[0]) == vals[0]
        calls += 1
        assert s.batch_get(keys[:16]) == vals[:16]
        calls += 1
        assert s.batch_get([b"missing", keys[3]]) == [None, vals[3]]
        calls += 1
        out = bytearray(VLLM_LAYER_BLOCK)
        assert s.get_into(keys[5], out) == VLLM_LAYER_BLOCK and bytes(out) == vals[5]
        calls += 1
        # Registered memory, batch 1 and 16 (a GET and a copy up to 1 MiB).
        buf = np.zeros(16 * VLLM_LAYER_BLOCK, dtype=np.uint8)
        b = s.register_buffer(buf)
        ptrs = [b.ptr + i * VLLM_LAYER_BLOCK for i in range(16)]
        assert s.batch_get_into(keys[16:17], ptrs[:1], [VLLM_LAYER_BLOCK]) == [VLLM_LAYER_BLOCK]
        calls += 1
        assert s.batch_get_into(keys[16:], ptrs, [VLLM_LAYER_BLOCK] * 16) == [VLLM_LAYER_BLOCK] * 16
        calls += 1
        assert buf.tobytes() == b"".join(vals[16:])
        # A room too small: nothing written, as on the shared path.
        assert s.batch_get_into([keys[0]], [ptrs[0]], [100]) == [-413]
        calls += 1
        assert s.direct_calls() == (calls if s is direct else 0)
        s.unregister_buffer(b)
    for s in (direct, shared):
        s.close()
        s.delete_namespace()


def test_direct_connections_are_bounded_however_many_threads_call(node):
    s = store_on(node, direct_connections=2)
    keys = [f"t-{i}".encode() for i in range(96)]
    vals = blocks(len(keys), 2)
    assert s.batch_put(keys, vals) == [201] * len(keys)
    wrong, most = [], [0]
    stop = threading.Event()

    def reader(t: int) -> None:
        for r in range(40):
            i = (t * 16 + r) % len(keys)
            if s.get(keys[i]) != vals[i]:
                wrong.append((t, i))

    def watch() -> None:
        while not stop.is_set():
            most[0] = max(most[0], connections_to(int(node.transfer.rsplit(":", 1)[1])))
            time.sleep(0.002)

    w = threading.Thread(target=watch)
    w.start()
    threads = [threading.Thread(target=reader, args=(t,)) for t in range(6)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=120)
        assert not t.is_alive(), "a reader hung"
    stop.set()
    w.join()
    assert wrong == []
    # The shared connection and at most two direct ones, for six threads.
    assert 2 <= most[0] <= 3, most[0]
    assert 0 < s.direct_calls() <= 6 * 40
    s.close()
    s.delete_namespace()


def test_a_direct_connection_the_node_closed_while_idle_is_replaced(idle_node):
    s = store_on(idle_node)
    (v,) = blocks(1, 3)
    assert s.put(b"k", v) == 201
    # A live subscription keeps the shared connection open: only the direct one idles.
    events = s.events()
    assert s.get(b"k") == v and s.direct_calls() == 1
    before = idle_closes(idle_node)
    wait_for("the node to close the idle direct connection", lambda: idle_closes(idle_node) >= before + 1)
    port = int(idle_node.transfer.rsplit(":", 1)[1])
    assert connections_to(port) == 1  # the shared one; the direct one is closed
    assert s.get(b"k") == v
    assert s.direct_calls() == 2
    assert connections_to(port) == 2
    assert idle_closes(idle_node) == before + 1
    events.close()
    s.close()


def test_a_frozen_node_costs_a_direct_get_one_deadline(root):
    n = Node(root, f"frozen-{uuid.uuid4().hex[:6]}")
    try:
        s = store_on(n, connect_timeout=1, request_timeout=1, down_for=1)
        (v,) = blocks(1, 4)
        assert s.put(b"k", v) == 201
        assert s.get(b"k") == v and s.direct_calls() == 1
        # A second store whose direct connection opens only once the node is frozen.
        late = ctxpod.Store.connect(n.http, namespace=s.namespace, connect_timeout=1, request_timeout=1, down_for=1)
        assert late.exists(b"k")  # its shared connection is open; no direct one yet
        n.proc.send_signal(signal.SIGSTOP)
        try:
            for who in (s, late):
                t0 = time.monotonic()
                # The only member does not answer: a miss, within a liveness bound (a
                # hang would be the bug).
                assert who.get(b"k") is None
                assert time.monotonic() - t0 < 8, "a direct get outlived its deadlines"
        finally:
            n.proc.send_signal(signal.SIGCONT)
        assert s.direct_calls() == 1 and late.direct_calls() == 0
        # Thawed: answered again (over new connections).
        wait_for("the thawed node to answer", lambda: s.get(b"k") == v)
        assert s.direct_calls() >= 2
        s.close()
        late.close()
    finally:
        n.stop()


def test_a_node_that_refuses_extra_connections_is_read_the_shared_way(root):
    n = Node(root, f"one-conn-{uuid.uuid4().hex[:6]}", extra="connections_per_peer_max = 1")
    try:
        s = ctxpod.Store.connect(n.http, namespace="default")
        keys = [f"o-{i}".encode() for i in range(4)]
        vals = blocks(len(keys), 5)
        assert s.batch_put(keys, vals) == [201] * len(keys)
        for k, v in zip(keys, vals):
            assert s.get(k) == v
        assert s.direct_calls() == 0
        s.close()
    finally:
        n.stop()


def test_a_connection_refused_at_the_cap_is_tried_again_until_one_is_let_go(root):
    """A node at its per-peer connection cap closes a new connection at once, before it
    reads a byte: the SDK takes that as the node being busy and asks again with the busy
    backoff, so a connection let go meanwhile (here one held by this process, closed
    0.3 s later, as the harness's readiness probe is closed just before the SDK connects)
    lets ``Store.connect`` through instead of failing it with a transport error."""
    import socket

    n = Node(root, f"one-conn-held-{uuid.uuid4().hex[:6]}", extra="connections_per_peer_max = 1")
    try:
        held = socket.create_connection(("127.0.0.1", n.port))
        held.sendall(b"GET /readyz HTTP/1.1\r\nHost: x\r\n\r\n")
        assert held.recv(64).startswith(b"HTTP/1.1 200"), "the held connection is the node's one"
        threading.Timer(0.3, held.close).start()
        s = ctxpod.Store.connect(n.http, namespace="default")
        (v,) = blocks(1, 9)
        assert s.put(b"after-the-cap", v) == 201
        assert s.get(b"after-the-cap") == v
        s.close()
    finally:
        n.stop()


def test_direct_gets_carry_the_token_and_its_tenant(auth_node):
    t = auth_node.tokens
    ns = f"dt-{uuid.uuid4().hex[:8]}"
    rw = ctxpod.Store.connect(auth_node.http, ns, token=t["rw"])
    rw.create_namespace()
    (v,) = blocks(1, 6)
    assert rw.put(b"k", v) == 201
    ro = ctxpod.Store.connect(auth_node.http, ns, token=t["ro"])
    assert ro.get(b"k") == v and ro.direct_calls() == 1
    # Another tenant's namespace of the same name is another namespace (none yet).
    other = ctxpod.Store.connect(auth_node.http, ns, token=t["other"])
    assert other.get(b"k") is None and other.direct_calls() == 1
    rw.delete_namespace()
    for s in (rw, ro, other):
        s.close()


@pytest.mark.parametrize("bad", [-1, ctxpod.DIRECT_CONNECTIONS_MAX + 1, True, "2", 1.5])
def test_bad_direct_connections_are_refused(node, bad):
    with pytest.raises(errors.InvalidRequest, match="direct_connections"):
        ctxpod.Store.connect(node.http, direct_connections=bad)


def test_a_batch_across_members_asks_them_at_once_a_lone_read_goes_direct(pod):
    """In a pod of three (R = 2) a batch whose keys live on several members asks them
    side by side over the shared connections (a direct call would make each wait for
    the last); a read of one member's keys goes direct."""
    s = ctxpod.Store.connect([n.http for n in pod], namespace=f"dp-{uuid.uuid4().hex[:12]}")
    s.create_namespace(replication=2)
    keys = [f"p-{i}".encode() for i in range(24)]
    vals = blocks(len(keys), 7)
    assert s.batch_put(keys, vals) == [201] * len(keys)
    firsts = {s._s.ranked(s.namespace, k)[0] for k in keys}
    assert len(firsts) == 3, "24 keys land first on every member"
    assert s.batch_get(keys) == vals
    assert s.direct_calls() == 0
    for k, v in zip(keys[:6], vals[:6]):
        assert s.get(k) == v
    assert s.direct_calls() == 6
    s.close()
    s.delete_namespace()
