"""A transformers model's prefix KV cache through a real node: stored per (block, layer,
K|V) under the prompt's chained block hashes, matched and prefetched for a second prompt
that shares the prefix, and decoded from there: the same tokens as a full recompute.

torch and transformers are required: without them this module fails to import (no skip).
The model is a small randomly initialised Llama (kvcache_util.tiny_llama), float32.
"""

from __future__ import annotations

import uuid

import pytest
import torch

import ctxpod
from kvcache_util import (
    Layout,
    block_hashes,
    build_cache,
    fetch,
    greedy,
    kv_key,
    match,
    prefill,
    store_kv,
    tiny_llama,
)

BS = 16  # tokens per block
MODEL_ID = "tiny-llama-test"
STEPS = 8  # greedy tokens decoded after the prompt
# Float32 both ways: the cached path differs from a recompute only in how the attention
# is chunked (the suffix against 48 cached positions vs all positions at once), a few
# ulps at most (0 on the machines tried); 1e-4 is far above that and far below the
# logits' gaps (checked below) and the effect of a wrong block (> 1).
TOL = dict(atol=1e-4, rtol=1e-4)


@pytest.fixture(scope="module")
def model():
    return tiny_llama()


@pytest.fixture
def store(node):
    s = ctxpod.Store.connect(node.http, namespace=f"hf-{uuid.uuid4().hex[:12]}")
    s.create_namespace()
    yield s
    s.close()
    s.delete_namespace()


def prompts():
    """A: 4 blocks and 7 tokens. B: A's first 3 blocks, then 21 tokens of its own (so its
    4th block differs from A's)."""
    g = torch.Generator().manual_seed(1)
    a = torch.randint(0, 1000, (1, 4 * BS + 7), generator=g)
    b = torch.cat([a[:, : 3 * BS], torch.randint(0, 1000, (1, 21), generator=g)], dim=1)
    assert not torch.equal(a[:, 3 * BS : 4 * BS], b[:, 3 * BS : 4 * BS])
    return a, b


def served_a(store, model):
    """Prompt A prefilled and its 4 complete blocks stored: (A, B, A's cache, layout)."""
    a, b = prompts()
    lay = Layout.of(model, BS)
    _, cache_a = prefill(model, a)
    hashes_a = block_hashes(a[0], BS, MODEL_ID)
    assert len(hashes_a) == 4
    assert store_kv(store, cache_a, hashes_a, lay) == 4 * lay.layers * 2 * lay.block_bytes
    assert store.namespace_info()["block_count"] == 4 * lay.layers * 2
    return a, b, cache_a, lay


def fetched_prefix(store, b, lay):
    """B's cached prefix matched and prefetched into one registered tensor: (blocks,
    landing tensor, codes)."""
    hashes_b = block_hashes(b[0], BS, MODEL_ID)
    n = match(store, hashes_b)
    landing = lay.landing(n)
    buf = store.register_buffer(landing)
    codes = fetch(store, buf, hashes_b[:n], lay, n)
    store.unregister_buffer(buf)
    return n, landing, codes


def test_a_prefix_from_ctxpod_decodes_like_a_full_recompute(store, model):
    a, b, cache_a, lay = served_a(store, model)

    n, landing, codes = fetched_prefix(store, b, lay)
    assert n == 3  # the shared blocks, not B's own 4th
    assert codes == [lay.block_bytes] * (n * lay.layers * 2)
    # What landed is A's cache, bit for bit.
    for layer in range(lay.layers):
        for kv, t in enumerate((cache_a.layers[layer].keys, cache_a.layers[layer].values)):
            got = landing[layer, kv].transpose(0, 1).reshape(1, lay.kv_heads, n * BS, lay.head_dim)
            assert torch.equal(got, t[:, :, : n * BS])

    cache = build_cache(landing, n, model.config)
    assert cache.get_seq_length() == n * BS
    toks, logits = greedy(model, b[:, n * BS :], cache, n * BS, STEPS)  # only B's suffix
    toks_full, logits_full = greedy(model, b, None, 0, STEPS)  # all of B from scratch

    top2 = logits_full.topk(2, dim=-1).values
    assert (top2[:, 0] - top2[:, 1]).min() > 100 * TOL["atol"], "argmax too close to a tie to compare"
    assert len(set(toks_full)) > 1  # a model that says something, not one token
    assert toks == toks_full
    torch.testing.assert_close(logits, logits_full, **TOL)


def test_a_wrong_prefix_changes_the_output(store, model):
    a, b, _, lay = served_a(store, model)
    n, landing, codes = fetched_prefix(store, b, lay)
    assert n == 3 and all(c == lay.block_bytes for c in codes)
    _, logits_full = greedy(model, b, None, 0, STEPS)

    landing[:, :, 1] = 0  # block 1 lost, every layer
    _, logits = greedy(model, b[:, n * BS :], build_cache(landing, n, model.config), n * BS, STEPS)
    assert (logits[0] - logits_full[0]).abs().max() > 1.0
    assert not torch.allclose(logits, logits_full, **TOL)

    # Another model's chain (another salt) matches nothing of this one's.
    assert match(store, block_hashes(b[0], BS, "another-model")) == 0
    # A prompt that differs in its first block matches nothing either (the chain).
    other = torch.cat([torch.flip(a[:, : 3 * BS], dims=[1]), b[:, 3 * BS :]], dim=1)
    assert match(store, block_hashes(other[0], BS, MODEL_ID)) == 0


def test_a_missing_layer_shows_in_the_prefetch_codes(store, model):
    """match_prefix looks at layer 0's K; a block missing a later layer is matched, and
    its entry's code says so (-404) while the others land."""
    _, b, _, lay = served_a(store, model)
    hashes_b = block_hashes(b[0], BS, MODEL_ID)
    assert store.remove(kv_key(hashes_b[2], lay.layers - 1, 1))
    n, _, codes = fetched_prefix(store, b, lay)
    assert n == 3
    missing = ((lay.layers - 1) * 2 + 1) * n + 2  # entry (last layer, V, block 2)
    assert codes[missing] == -404
    assert [c for i, c in enumerate(codes) if i != missing] == [lay.block_bytes] * (len(codes) - 1)
