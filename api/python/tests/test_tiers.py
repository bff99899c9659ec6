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
from conftest import Node, wait_for

MIB = 1 << 20
BLOCKS = 80


@pytest.fixture(scope="module")
def tiered(root):
    """A node on a simulated SLC + QLC pair: fast 4 regions of 16 MiB, dense 16."""
    extra = (
        'region_bytes = "16MiB"\n'
        '[[tiers]]\nname = "fast"\ndevice = "sim:slc"\ncapacity = "65MiB"\n'
        '[[tiers]]\nname = "dense"\ndevice = "sim:qlc"\ncapacity = "257MiB"\n'
    )
    n = Node(root, "tiered", extra=extra)
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
