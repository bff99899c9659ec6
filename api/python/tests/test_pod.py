"""The SDK against a real 3-node pod over etcd, two copies of each block (R = 2): every
batch is split by member, each block lands on its R members, prefetch fills one buffer
from every member, reads fall back when a member is down."""

from __future__ import annotations

import json
import urllib.error
import urllib.request
import uuid

import numpy as np
import pytest

import ctxpod


def held_locally(member_http: str, ns: str, key: bytes) -> bool:
    """Whether this member itself holds the block (a routed GET is served locally)."""
    req = urllib.request.Request(
        f"{member_http}/v1/namespaces/{ns}/blocks/{key.hex()}", headers={"x-ctxpod-forwarded-by": "sdk-test"}
    )
    try:
        return urllib.request.urlopen(req, timeout=5).status == 200
    except urllib.error.HTTPError as e:
        if e.code == 404:
            return False
        raise


@pytest.fixture
def store(pod):
    s = ctxpod.Store.connect([n.http for n in pod], namespace=f"p-{uuid.uuid4().hex[:12]}")
    s.create_namespace()
    yield s
    s.close()


def blocks(n: int, size: int = 16 * 1024) -> tuple[list[bytes], list[bytes]]:
    rng = np.random.default_rng(n)
    keys = [f"pod-{uuid.uuid4().hex[:8]}-{i}".encode() for i in range(n)]
    vals = [rng.integers(0, 256, size, dtype=np.uint8).tobytes() for _ in range(n)]
    return keys, vals


def test_the_store_sees_every_member_and_its_cxp1_address(pod, store):
    ms = store.members()
    assert sorted(m["transfer"] for m in ms) == sorted(n.transfer for n in pod)
    assert store.replication() == 2


def test_each_block_lands_on_its_two_ranked_members_and_no_other(pod, store):
    keys, vals = blocks(24)
    assert store.batch_put(keys, vals) == [201] * 24
    by_transfer = {n.transfer: n.http for n in pod}
    firsts = set()
    for k in keys:
        ranked = store._s.ranked(store.namespace, k)
        firsts.add(ranked[0])
        holders = {t for t, h in by_transfer.items() if held_locally(h, store.namespace, k)}
        assert holders == set(ranked[:2]), k
    assert len(firsts) == 3, "24 keys spread over all three members"
    assert store.batch_get(keys) == vals


def test_match_exists_pin_across_members(store):
    keys, vals = blocks(12)
    store.batch_put(keys[:8], vals[:8])
    store.put(keys[9], vals[9])
    assert store.match_prefix(keys) == 8
    assert store.batch_exists(keys) == [True] * 8 + [False, True, False, False]
    assert store.pin(keys, ttl=30) == 9
    assert store.unpin(keys) == 9


def test_prefetch_fills_one_buffer_from_every_member(pod, store):
    keys, vals = blocks(30, 8192)
    store.batch_put(keys, vals)
    senders = {store._s.ranked(store.namespace, k)[0] for k in keys}
    assert len(senders) == 3
    guard = 0x5A
    mem = np.full(30 * 9000, guard, dtype=np.uint8)
    buf = store.register_buffer(mem)
    offsets = [i * 9000 for i in range(30)]
    t = store.prefetch(keys, into=(buf, offsets), sizes=[8192] * 30)
    assert t.wait() == [8192] * 30
    expect = np.full_like(mem, guard)
    for o, v in zip(offsets, vals):
        expect[o : o + 8192] = np.frombuffer(v, dtype=np.uint8)
    assert np.array_equal(mem, expect)


def test_events_come_from_every_member(store):
    keys, vals = blocks(9)
    with store.events() as ev:
        store.batch_put(keys, vals)
        seen = set()
        while len(seen) < 9:
            e = ev.next(timeout=10)
            assert e is not None, seen
            assert e.kind == "stored"
            seen.add(e.key)
    # Each key is stored on two members: both report it, one stream.
    assert seen == set(keys)


def test_remove_deletes_every_copy(pod, store):
    keys, vals = blocks(6)
    store.batch_put(keys, vals)
    assert store.batch_remove(keys[:3]) == [True] * 3
    for k in keys[:3]:
        assert not any(held_locally(n.http, store.namespace, k) for n in pod)
    assert store.batch_exists(keys) == [False] * 3 + [True] * 3


def test_a_listing_is_the_whole_pods_each_key_once(pod, store):
    keys, vals = blocks(40, size=512)
    store.batch_put(keys, vals)
    # Two copies of each block on three members; each key is listed once, in order, and the
    # pages of the pod follow one another.
    assert list(store.keys(page_size=7)) == sorted(keys)
    # Any node answers for the pod, over plain HTTP.
    import json

    for n in pod:
        with urllib.request.urlopen(f"{n.http}/v1/namespaces/{store.namespace}/blocks?limit=1000", timeout=10) as r:
            assert json.load(r) == {"keys": sorted(k.hex() for k in keys)}
    # A member's own page (routed to it) holds only what it holds.
    local = urllib.request.Request(
        f"{pod[0].http}/v1/namespaces/{store.namespace}/blocks", headers={"x-ctxpod-forwarded-by": "sdk-test"}
    )
    with urllib.request.urlopen(local, timeout=10) as r:
        own = {bytes.fromhex(k) for k in json.load(r)["keys"]}
    assert own == {k for k in keys if held_locally(pod[0].http, store.namespace, k)}
    assert 0 < len(own) < len(keys)


def test_a_listing_with_a_member_down_is_refused_not_short(pod, store):
    keys, vals = blocks(12, size=512)
    store.batch_put(keys, vals)
    victim = pod[2]
    victim.kill()
    try:
        with pytest.raises(ctxpod.errors.Unavailable):
            store.list_keys()
        with pytest.raises(urllib.error.HTTPError) as e:
            urllib.request.urlopen(f"{pod[0].http}/v1/namespaces/{store.namespace}/blocks", timeout=30)
        assert e.value.code == 503
    finally:
        victim.start()
    store.refresh()
    assert list(store.keys()) == sorted(keys)


def test_any_nodes_s3_door_answers_for_the_pod(pod, store):
    """The S3 door in a pod (auth off: any credentials): an object put through one node's
    door is read, listed and deleted through every other's, and lands on its R members."""
    boto3 = pytest.importorskip("boto3")
    from botocore.config import Config

    def s3(node):
        return boto3.client("s3", endpoint_url=node.s3, aws_access_key_id="any", aws_secret_access_key="any",
                            region_name="us-east-1", config=Config(s3={"addressing_style": "path"}))

    keys, vals = blocks(12, size=100_000)
    names = [k.decode() for k in keys]
    for name, v in zip(names, vals):
        s3(pod[0]).put_object(Bucket=store.namespace, Key=name, Body=v)
    for n in pod[1:]:
        for name, v in zip(names, vals):
            assert s3(n).get_object(Bucket=store.namespace, Key=name)["Body"].read() == v
        listed = s3(n).list_objects_v2(Bucket=store.namespace)["Contents"]
        assert [o["Key"] for o in listed] == sorted(names)
    # Each object is a block of the pod, on its two ranked members (the SDK sees it too).
    assert store.batch_get(keys) == vals
    for k in keys:
        holders = {n.transfer for n in pod if held_locally(n.http, store.namespace, k)}
        assert holders == set(store._s.ranked(store.namespace, k)[:2])
    s3(pod[2]).delete_objects(Bucket=store.namespace, Delete={"Objects": [{"Key": k} for k in names]})
    assert store.batch_exists(keys) == [False] * 12


def test_reads_fall_back_when_a_member_is_down(pod, store):
    keys, vals = blocks(18)
    store.batch_put(keys, vals)
    victim = pod[1]
    victim.kill()
    try:
        # Every block has a second copy: all are read, matched, prefetched from the others.
        assert store.batch_get(keys) == vals
        assert store.match_prefix(keys) == 18
        mem = bytearray(18 * 16 * 1024)
        buf = store.register_buffer(mem)
        t = store.prefetch(keys, into=(buf, [i * 16 * 1024 for i in range(18)]))
        codes = t.wait()
        assert codes == [16 * 1024] * 18, codes
        assert bytes(mem) == b"".join(vals)
        # Writes go to the two reachable members in rank order.
        k2, v2 = blocks(6)
        assert store.batch_put(k2, v2) == [201] * 6
    finally:
        victim.start()
    store.refresh()
    assert store.batch_get(k2) == v2


def pod_s3(node):
    """boto3 on a member's S3 door (auth off: any credentials)."""
    boto3 = pytest.importorskip("boto3")
    from botocore.config import Config

    return boto3.client("s3", endpoint_url=node.s3, aws_access_key_id="any", aws_secret_access_key="any",
                        region_name="us-east-1",
                        config=Config(s3={"addressing_style": "path"}, retries={"max_attempts": 1}))


@pytest.mark.parametrize("replication", [1, 2])
def test_delete_bucket_is_refused_while_any_member_holds_an_object(pod, replication):
    """30 objects put through one member's door, on keys that the third member holds none
    of: DeleteBucket through that member (and the second) is refused BucketNotEmpty, and all
    30 stay (before: it answered 204 and the bucket was gone on every node, 30/30 lost).
    Emptied, the bucket is deleted through any member."""
    from botocore.exceptions import ClientError

    ns = f"db-{uuid.uuid4().hex[:10]}"
    s = ctxpod.Store.connect([n.http for n in pod], namespace=ns)
    s.create_namespace(replication=replication)
    bystander = pod[2].transfer
    names: list[str] = []
    i = 0
    while len(names) < 30:
        name = f"obj-{i:05d}"
        i += 1
        if bystander not in s._s.ranked(ns, name.encode())[:replication]:
            names.append(name)
    for name in names:
        pod_s3(pod[0]).put_object(Bucket=ns, Key=name, Body=name.encode() * 100)
    assert not any(held_locally(pod[2].http, ns, name.encode()) for name in names)
    for member in (pod[2], pod[1]):
        with pytest.raises(ClientError) as e:
            pod_s3(member).delete_bucket(Bucket=ns)
        assert e.value.response["Error"]["Code"] == "BucketNotEmpty", e.value
    for member in pod:
        for name in names:
            assert pod_s3(member).get_object(Bucket=ns, Key=name)["Body"].read() == name.encode() * 100
    pod_s3(pod[1]).delete_objects(Bucket=ns, Delete={"Objects": [{"Key": k} for k in names]})
    pod_s3(pod[2]).delete_bucket(Bucket=ns)
    for member in pod:
        with pytest.raises(ClientError) as e:
            pod_s3(member).head_bucket(Bucket=ns)
        assert e.value.response["ResponseMetadata"]["HTTPStatusCode"] == 404
    s.close()


def test_delete_bucket_is_refused_while_a_member_cannot_say(pod):
    """With a member down, the pod cannot know the bucket is empty: DeleteBucket is refused
    (SlowDown, 503) and the bucket stays."""
    from botocore.exceptions import ClientError

    ns = f"dd-{uuid.uuid4().hex[:10]}"
    s = ctxpod.Store.connect([n.http for n in pod], namespace=ns)
    s.create_namespace()
    pod[1].kill()
    try:
        with pytest.raises(ClientError) as e:
            pod_s3(pod[0]).delete_bucket(Bucket=ns)
        assert e.value.response["ResponseMetadata"]["HTTPStatusCode"] == 503, e.value
    finally:
        pod[1].start()
    pod_s3(pod[0]).head_bucket(Bucket=ns)
    s.close()


def test_create_bucket_on_an_existing_bucket_keeps_its_pod_settings(pod):
    """A namespace of quota 1 MiB and two copies: CreateBucket through another member
    answers BucketAlreadyOwnedByYou and every member keeps both settings."""
    from botocore.exceptions import ClientError

    ns = f"cb-{uuid.uuid4().hex[:10]}"
    s = ctxpod.Store.connect([n.http for n in pod], namespace=ns)
    s.create_namespace(quota_bytes=1 << 20, replication=2)
    for member in pod:
        with pytest.raises(ClientError) as e:
            pod_s3(member).create_bucket(Bucket=ns)
        assert e.value.response["Error"]["Code"] == "BucketAlreadyOwnedByYou"
    import json

    for member in pod:
        info = json.load(urllib.request.urlopen(f"{member.http}/v1/namespaces/{ns}", timeout=5))
        assert (info["quota_bytes"], info["replication"]) == (1 << 20, 2), member.http
    s.close()


HALF_MIB = 512 << 10


def _put_half(pod, s, ns: str, i: int, name: str) -> bool:
    """One 512 KiB object: even i through the SDK, odd i through member i % 3's S3 door.
    True if stored; a refusal must be the quota's (403), nothing else."""
    from botocore.exceptions import ClientError

    body = np.random.default_rng(1000 + i).integers(0, 256, HALF_MIB, dtype=np.uint8).tobytes()
    if i % 2 == 0:
        try:
            s.put(name.encode(), body)
            return True
        except ctxpod.errors.CtxpodError as e:
            assert isinstance(e, ctxpod.errors.Forbidden) and e.status == 403, e
            return False
    try:
        pod_s3(pod[i % 3]).put_object(Bucket=ns, Key=name, Body=body)
        return True
    except ClientError as e:
        assert e.response["ResponseMetadata"]["HTTPStatusCode"] == 403, e.response
        return False


@pytest.mark.parametrize("replication", [1, 2])
def test_a_namespace_quota_holds_for_the_whole_pod(pod, replication):
    """A 1 MiB namespace over 3 members: of 8 x 512 KiB objects put through the SDK and
    through every member's S3 door, 2 are stored and 6 refused with the quota's 403 (before:
    each member applied the quota to itself alone, 5 of 8 went in). A deleted object makes
    room for one more, and no more."""
    ns = f"qp-{uuid.uuid4().hex[:10]}"
    s = ctxpod.Store.connect([n.http for n in pod], namespace=ns)
    s.create_namespace(quota_bytes=1 << 20, replication=replication)
    stored = [f"half-{i}" for i in range(8) if _put_half(pod, s, ns, i, f"half-{i}")]
    assert len(stored) == 2, stored
    s.remove(stored[0].encode())
    assert _put_half(pod, s, ns, 8, "again-8")
    assert not _put_half(pod, s, ns, 9, "again-9")
    s.close()


def _pod_used(pod, ns: str) -> int:
    """Bytes of the namespace the members hold, every copy (each member's own count)."""
    import json

    total = 0
    for member in pod:
        req = urllib.request.Request(f"{member.http}/v1/namespaces/{ns}", headers={"x-ctxpod-forwarded-by": "sdk-test"})
        total += json.load(urllib.request.urlopen(req, timeout=5))["used_bytes"]
    return total


@pytest.mark.parametrize("replication", [1, 2])
def test_concurrent_puts_through_three_members_never_take_the_pod_over_its_quota(pod, replication):
    """3 clients, each on its own member's S3 door, 12 x 512 KiB each at once into a 1 MiB
    namespace: the members hold at most quota x R bytes (0 bytes over), and at most 2
    objects are stored."""
    import concurrent.futures

    ns = f"qc-{uuid.uuid4().hex[:10]}"
    s = ctxpod.Store.connect([n.http for n in pod], namespace=ns)
    s.create_namespace(quota_bytes=1 << 20, replication=replication)

    def client(c: int) -> int:
        return sum(_put_half(pod, s, ns, 2 * (c + 3 * j) + 1, f"c{c}-{j}") for j in range(12))

    with concurrent.futures.ThreadPoolExecutor(3) as ex:
        stored = sum(ex.map(client, range(3)))
    used = _pod_used(pod, ns)
    print(f"R={replication}: stored {stored} objects, members hold {used} bytes, over by {used - (1 << 20) * replication}")
    assert used <= (1 << 20) * replication, used
    assert stored <= 2
    s.close()


def namespace_on(member_http: str, ns: str) -> dict:
    """What this member itself says of namespace `ns` (GET /v1/namespaces/{ns})."""
    with urllib.request.urlopen(f"{member_http}/v1/namespaces/{ns}", timeout=5) as r:
        return json.loads(r.read())


# One projection of one expert of Qwen1.5-MoE-A2.7B in bf16: 2048 x 1408 x 2 bytes.
SHARD_BYTES = 2048 * 1408 * 2


def test_a_weights_namespace_is_the_pods_and_its_class_is_fixed(pod):
    s = ctxpod.Store.connect([n.http for n in pod], namespace=f"w-{uuid.uuid4().hex[:12]}")
    try:
        info = s.create_namespace(namespace_class="weights")
        assert info["class"] == "weights"
        assert [namespace_on(n.http, s.namespace)["class"] for n in pod] == ["weights"] * 3
        # A settings change that leaves the class out keeps it.
        assert s.create_namespace(quota_bytes=1 << 30)["class"] == "weights"
        with pytest.raises(ctxpod.Conflict, match="weights"):
            s.create_namespace(namespace_class="kv")
        with pytest.raises(ValueError, match="unknown namespace class"):
            s.create_namespace(namespace_class="cold")
        assert [namespace_on(n.http, s.namespace)["class"] for n in pod] == ["weights"] * 3
        assert s.with_namespace("default").namespace_info()["class"] == "kv"
        # Expert shards go in and come back whole, from their R = 2 members.
        rng = np.random.default_rng(36)
        keys = [f"0/{e}".encode() for e in range(4)]
        shards = [rng.integers(0, 256, SHARD_BYTES, dtype=np.uint8).tobytes() for _ in keys]
        assert s.batch_put(keys, shards) == [201] * 4
        assert s.batch_get(keys) == shards
    finally:
        s.close()
