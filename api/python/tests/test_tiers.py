"""A node of two flash tiers through the SDK (issue #36): blocks demoted to the dense tier
as the fast one fills come back byte for byte; ``Store.promote`` moves them to the fast
tier and says so; a prefetch promotes what it stages without being asked; a node of one
tier counts every present block as fast; a namespace with ``compression="zstd"`` holds a
model's KV cache compressed in the dense tier and gives it back tensor for tensor."""

from __future__ import annotations

import json
import re
import urllib.request
import uuid

import numpy as np
import pytest

import ctxpod
from conftest import Node, engine, wait_for

MIB = 1 << 20
BLOCKS = 80


def two_tiers(dense: str) -> str:
    """A node's settings for a simulated SLC + QLC pair: fast 4 regions of 16 MiB, dense
    of ``dense``."""
    return (
        'region_bytes = "16MiB"\n'
        '[[tiers]]\nname = "fast"\ndevice = "sim:slc"\ncapacity = "65MiB"\n'
        f'[[tiers]]\nname = "dense"\ndevice = "sim:qlc"\ncapacity = "{dense}"\n'
    )


@pytest.fixture(scope="module")
def tiered(root):
    """A node on a simulated SLC + QLC pair: fast 4 regions of 16 MiB, dense 16."""
    n = Node(root, "tiered", extra=two_tiers("257MiB"))
    yield n
    n.stop()


def metric(node: Node, name: str) -> float:
    text = urllib.request.urlopen(node.http + "/metrics", timeout=5).read().decode()
    m = re.search(rf"^{re.escape(name)} (\S+)$", text, re.M)
    return float(m.group(1)) if m else 0.0


def blocks(n: int) -> list[bytes]:
    rng = np.random.default_rng(36)
    return [rng.integers(0, 256, MIB, dtype=np.uint8).tobytes() for _ in range(n)]


def test_promote_moves_demoted_blocks_and_they_read_back(tiered):
    s = ctxpod.Store.connect([tiered.http], namespace="default")
    try:
        keys = [f"t{uuid.uuid4().hex[:8]}-{i}".encode() for i in range(BLOCKS)]
        data = blocks(BLOCKS)
        for k, d in zip(keys, data):
            s.put(k, d)
        assert metric(tiered, "ctxpod_tier_demoted_records_total") > 0, "fast filled and demoted"
        before = metric(tiered, "ctxpod_tier_promoted_records_total")
        r = s.promote(keys + [b"absent"])
        assert r["promoted"] >= 1 and r["promoted"] <= r["fast"] <= BLOCKS, r
        assert metric(tiered, "ctxpod_tier_promoted_records_total") - before >= r["promoted"]
        assert s.batch_get(keys) == data
        # The node's stats name both tiers, their traffic, and (simulated drives) ratings.
        stats = json.loads(urllib.request.urlopen(tiered.http + "/v1/stats", timeout=5).read())
        fast, dense = stats["tiers"]
        assert (fast["name"], dense["name"]) == ("fast", "dense")
        assert fast["written_bytes"] > 0 and dense["written_bytes"] > 0 and dense["read_bytes"] > 0
        assert fast["moved_out_bytes"] > 0, "demoted from fast"
        per_byte = [t["rated_written_bytes"] / t["capacity_bytes"] for t in (fast, dense)]
        assert per_byte[0] > 50 * per_byte[1], "SLC's 60 DWPD against QLC's 0.58"
        with pytest.raises(ctxpod.InvalidRequest):
            s.promote(["not a key" * 100])
    finally:
        s.close()


def test_a_prefetch_promotes_what_it_stages(tiered):
    s = ctxpod.Store.connect([tiered.http], namespace="default")
    try:
        keys = [f"p{uuid.uuid4().hex[:8]}-{i}".encode() for i in range(BLOCKS)]
        data = blocks(BLOCKS)
        for k, d in zip(keys, data):
            s.put(k, d)
        # The oldest blocks are in the dense tier by now: prefetch eight of them.
        first = keys[:8]
        buf = bytearray(8 * MIB)
        s.register_buffer(buf)
        before = metric(tiered, "ctxpod_tier_promoted_records_total")
        t = s.prefetch(first, (buf, [i * MIB for i in range(8)]))
        assert all(n == MIB for n in t.wait(timeout=60)), "every block staged"
        assert bytes(buf) == b"".join(data[:8])
        wait_for(
            "prefetched blocks promoted by the idle node",
            lambda: metric(tiered, "ctxpod_tier_promoted_records_total") - before >= 8,
        )
        # All eight are in the fast tier now: asking again moves none.
        assert s.promote(first) == {"promoted": 0, "fast": 8}
        s.unregister_buffer(buf)
    finally:
        s.close()


def test_a_node_of_one_tier_counts_every_block_fast(node):
    s = ctxpod.Store.connect([node.http], namespace="default")
    try:
        keys = [f"o{uuid.uuid4().hex[:8]}-{i}".encode() for i in range(3)]
        for k in keys:
            s.put(k, b"x" * 4096)
        assert s.promote(keys + [b"absent"]) == {"promoted": 0, "fast": 3}
    finally:
        s.close()


def test_a_compressed_namespace_holds_a_models_kv_and_gives_it_back(tiered):
    """The KV cache of a seeded Llama-shaped model (8 KV heads of head_dim 64, bf16), one
    block per layer and 256-token chunk (LMCache's chunk size), in a namespace compressed
    with zstd: more of it than the fast tier holds, so most is demoted, compressed; every
    block reads back equal to the model's tensors, and the namespace says what it saved."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(36)
    cfg = LlamaConfig(
        hidden_size=512, intermediate_size=1024, num_hidden_layers=2, num_attention_heads=8,
        num_key_value_heads=8, head_dim=64, vocab_size=1024, max_position_embeddings=512,
    )
    model = LlamaForCausalLM(cfg).to(torch.bfloat16).eval()
    s = ctxpod.Store.connect([tiered.http], namespace=f"kvz-{uuid.uuid4().hex[:8]}")
    try:
        with pytest.raises(ValueError):
            s.create_namespace(compression="gzip")
        assert s.create_namespace(compression="zstd")["compression"] == "zstd"
        tensors: dict[bytes, torch.Tensor] = {}
        with torch.no_grad():
            for chunk in range(80):
                ids = torch.randint(0, cfg.vocab_size, (1, 256), generator=torch.Generator().manual_seed(chunk))
                cache = model(ids, use_cache=True).past_key_values
                for layer in range(cfg.num_hidden_layers):
                    kv = torch.stack([cache.layers[layer].keys, cache.layers[layer].values]).contiguous()
                    key = f"{chunk}/{layer}".encode()
                    tensors[key] = kv
                    s.put(key, kv.view(torch.uint8).numpy().tobytes())
        info = s.namespace_info()
        assert info["compression"] == "zstd"
        assert info["used_bytes"] == 160 * 512 * 1024
        # Most chunks were demoted, and zstd saves at least an eighth on them.
        assert info["compressed_bytes"] >= info["used_bytes"] // 4, info
        assert info["compressed_stored_bytes"] * 8 <= info["compressed_bytes"] * 7, info
        for key, kv in tensors.items():
            got = torch.frombuffer(bytearray(s.get(key)), dtype=torch.bfloat16).view(kv.shape)
            assert torch.equal(got, kv), key
        # Off again: later moves leave blocks as they are; what is compressed still reads.
        assert s.create_namespace()["compression"] is None
        assert s.get(b"0/0") == tensors[b"0/0"].view(torch.uint8).numpy().tobytes()
    finally:
        s.delete_namespace()
        s.close()


# -- large values and the S3 door on two tiers ------------------------------------------


@pytest.fixture(scope="module")
def tiered_values(root):
    """A node like ``tiered`` with a dense tier of room for the values below, its own so
    that the blocks of the tests above do not fill it."""
    n = Node(root, "tiered-values", extra=two_tiers("513MiB"))
    yield n
    n.stop()


def weights(n: int, seed: int) -> bytes:
    """``n`` bytes of bf16 values drawn as a layer's weights are (normal, small): the high
    half of float32s, little-endian, as torch stores bf16."""
    rng = np.random.default_rng(seed)
    f = (rng.standard_normal(n // 2) * 0.02).astype(np.float32)
    return (f.view(np.uint32) >> 16).astype(np.uint16).tobytes()


def turn_fast_over(put, tag: str, mib: int = 96) -> None:
    """Writes ``mib`` blocks of 1 MiB (random: they do not compress) so that the fast tier
    (65 MiB) turns over and what was written before is demoted."""
    for k, d in zip([f"{tag}-{i}" for i in range(mib)], blocks(mib)):
        put(k, d)


def test_a_large_value_is_promoted_through_the_sdk(tiered_values):
    """A value of 20 MiB + 4321 B (five 4 MiB extents and a short one), written to the
    dense tier (where large values go), comes to the fast one whole on ``Store.promote``
    (one value promoted, its bytes in the promoted count); demoted again as 96 MiB of
    blocks go through the fast tier, it is promoted again; a promote of a value in the
    fast tier moves nothing; it reads back byte-exact."""
    n = tiered_values
    s = ctxpod.Store.connect([n.http], namespace="default")
    try:
        key = f"v{uuid.uuid4().hex[:8]}".encode()
        value = weights((20 << 20) + 4322, 1)[: (20 << 20) + 4321]
        assert s.put(key, value) == 201
        before = metric(n, "ctxpod_tier_promoted_bytes_total")
        assert s.promote([key]) == {"promoted": 1, "fast": 1}
        assert metric(n, "ctxpod_tier_promoted_bytes_total") - before >= len(value)
        assert s.promote([key]) == {"promoted": 0, "fast": 1}
        turn_fast_over(lambda k, d: s.put(k.encode(), d), f"b{uuid.uuid4().hex[:6]}")
        # Demoted with its regions; promoted again within the move budget (the demotions
        # just spent it: a call moves what it allows and says so, the next moves on).
        before = metric(n, "ctxpod_tier_promoted_bytes_total")
        wait_for("promoted again", lambda: s.promote([key])["fast"] == 1, timeout=30)
        assert metric(n, "ctxpod_tier_promoted_bytes_total") - before >= len(value), "it had left"
        assert s.get(key) == value
    finally:
        s.close()


def test_s3_objects_in_a_tiered_compressing_namespace(tiered_values):
    """A bucket whose namespace compresses with zstd, on two tiers: a 32 MiB object (a
    Llama-3-8B LMCache chunk's size) and 1 MiB ones of bf16 weights, demoted (and
    compressed) as the fast tier turns over, read back through the S3 door whole and in
    ranges across extents, byte for byte; the namespace counts what zstd saved."""
    boto3 = engine("boto3")
    from botocore.config import Config

    n = tiered_values
    s3 = boto3.client(
        "s3", endpoint_url=n.s3, aws_access_key_id="any", aws_secret_access_key="any",
        region_name="us-east-1", config=Config(s3={"addressing_style": "path"}, retries={"max_attempts": 1}),
    )
    bucket = f"tz-{uuid.uuid4().hex[:8]}"
    s3.create_bucket(Bucket=bucket)
    s = ctxpod.Store.connect([n.http], namespace=bucket)
    try:
        assert s.create_namespace(compression="zstd")["compression"] == "zstd"
        big = weights(32 << 20, 2)
        small = {f"layer-{i}": weights(1 << 20, 10 + i) for i in range(8)}
        s3.put_object(Bucket=bucket, Key="chunk-0", Body=big)
        for k, v in small.items():
            s3.put_object(Bucket=bucket, Key=k, Body=v)
        turn_fast_over(lambda k, d: s3.put_object(Bucket=bucket, Key=k, Body=d), "filler")
        info = s.namespace_info()
        assert info["compressed_bytes"] >= len(big), info
        assert info["compressed_stored_bytes"] * 8 <= info["compressed_bytes"] * 7, info
        assert s3.get_object(Bucket=bucket, Key="chunk-0")["Body"].read() == big
        for lo, hi in ((0, 99), ((4 << 20) - 7, (12 << 20) + 5), ((32 << 20) - 1000, (32 << 20) - 1)):
            got = s3.get_object(Bucket=bucket, Key="chunk-0", Range=f"bytes={lo}-{hi}")["Body"].read()
            assert got == big[lo : hi + 1], (lo, hi)
        for k, v in small.items():
            assert s3.get_object(Bucket=bucket, Key=k)["Body"].read() == v, k
        # Promoted back (the object whole, as one value: over calls, within the move
        # budget, since the reads above hinted it too), it still reads the same.
        wait_for("the object promoted", lambda: s.promote([b"chunk-0"])["fast"] == 1, timeout=30)
        assert s3.get_object(Bucket=bucket, Key="chunk-0")["Body"].read() == big
    finally:
        for page in s3.get_paginator("list_objects_v2").paginate(Bucket=bucket):
            for o in page.get("Contents", []):
                s3.delete_object(Bucket=bucket, Key=o["Key"])
        s.close()
