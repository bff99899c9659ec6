"""The pod's scenario table (appliance/testkit/pod_scenarios.json: members down, copies
missing, tombstones, quota) through the Python SDK, against a real 3-node pod over etcd:
the same rows the Rust suite (appliance/cli/tests/it/pod/doors.rs) runs through the Rust
HTTP and CXP1 clients, a node's forwarding and batches and the S3 door, with the same
answers."""

from __future__ import annotations

import json
import urllib.error
import urllib.request
import uuid
from pathlib import Path

from conftest import Etcd, Node, wait_for

import ctxpod
from ctxpod.errors import CtxpodError

TABLE = json.loads(
    (Path(__file__).resolve().parents[3] / "appliance" / "testkit" / "pod_scenarios.json").read_text()
)
NS, SMALL = "doors", "doors-small"


def _request(method: str, url: str, body: bytes | None = None, headers: dict | None = None) -> int:
    req = urllib.request.Request(url, data=body, method=method, headers=headers or {})
    try:
        with urllib.request.urlopen(req, timeout=30) as r:
            return r.status
    except urllib.error.HTTPError as e:
        return e.code


def _block_url(node: Node, ns: str, key: bytes) -> str:
    return f"{node.http}/v1/namespaces/{ns}/blocks/{key.hex()}"


def _stage(store: ctxpod.Store, by_transfer: dict, ns: str, state: str, key: bytes, data: bytes) -> None:
    """The pod in row's state for ``key``."""
    ranked = [by_transfer[a] for a in store._s.ranked(ns, key)]
    routed = {"x-ctxpod-forwarded-by": "test"}
    s = store.with_namespace(ns)
    if state == "never_stored":
        return
    if state == "both_copies":
        assert s.put(key, data) in (200, 201)
    elif state == "first_copy_missing":
        assert _request("PUT", _block_url(ranked[1], ns, key), data, routed) == 201
    elif state == "only_third_candidate":
        assert _request("PUT", _block_url(ranked[2], ns, key), data, routed) == 201
    elif state == "deleted":
        assert s.put(key, data) in (200, 201)
        assert s.remove(key)
        # A member that missed the delete offers its copy back: refused (the tombstone).
        copy = dict(routed, **{"x-ctxpod-copy": "test"})
        assert _request("PUT", _block_url(ranked[0], ns, key), data, copy) == 410
    else:
        raise AssertionError(f"unknown state {state}")


def _answer(fn) -> str:
    try:
        return fn()
    except CtxpodError as e:
        return f"refused {e.status}" if e.status else f"failed: {e!r}"


def _step(s: ctxpod.Store, op: str, key: bytes, data: bytes) -> str:
    if op == "get":
        def get() -> str:
            b = s.get(key)
            return "miss" if b is None else ("hit" if b == data else f"wrong bytes ({len(b)})")
        return _answer(get)
    if op in ("put", "put_large"):
        value = data if op == "put" else bytes([7]) * TABLE["large_bytes"]
        return _answer(lambda: "stored" if s.put(key, value) in (200, 201) else "?")
    if op == "delete":
        return _answer(lambda: "done" if s.remove(key) else "miss")
    raise AssertionError(f"unknown op {op}")


def test_the_sdk_gives_the_tables_answers(tmp_path):
    etcd = Etcd(tmp_path)
    # Leases long enough that the killed member stays in every view: the SDK must get past
    # a member the pod still names.
    name = f"doors{uuid.uuid4().hex[:6]}"
    lines = f'[pod]\nname = "{name}"\netcd_endpoints = ["{etcd.url}"]\nlease_ttl_s = 60\n'
    nodes = [Node(tmp_path, i, pod=lines) for i in ("a", "b", "c")]
    try:
        wait_for("a pod of three", lambda: len(json.load(urllib.request.urlopen(nodes[0].http + "/v1/cluster"))["members"]) == 3)
        store = ctxpod.Store.connect([n.http for n in nodes], NS)
        store.create_namespace(replication=2)
        store.with_namespace(SMALL).create_namespace(quota_bytes=1 << 20, replication=2)
        wait_for("3 members seen", lambda: (store.refresh(), len(store.members()))[1] == 3)
        by_transfer = {n.transfer: n for n in nodes}
        victim = nodes[2].transfer
        keys = []
        for r, row in enumerate(TABLE["rows"]):
            ns = row.get("namespace", NS)
            killed = row.get("phase") == "member_killed"
            key = next(
                k for k in (f"sdk/{r}/{n}".encode() for n in range(10_000))
                if not killed or store._s.ranked(ns, k)[0] == victim
            )
            data = bytes((r * 31 + i) % 251 for i in range(TABLE["block_bytes"]))
            _stage(store, by_transfer, ns, row["state"], key, data)
            keys.append((row, key, data))
        failures = []
        for phase in (None, "member_killed"):
            if phase:
                nodes[2].kill()
            for row, key, data in keys:
                if row.get("phase") != phase:
                    continue
                s = store.with_namespace(row.get("namespace", NS))
                for op, want in row["steps"]:
                    got = _step(s, op, key, data)
                    if got != want:
                        failures.append(f"{row['name']!r}: {op} answered {got!r}, the table says {want!r}")
        assert not failures, "\n".join(failures)
    finally:
        for n in nodes:
            n.stop()
        etcd.stop()
