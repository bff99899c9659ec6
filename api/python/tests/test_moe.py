"""MoE expert weights through a ``weights`` namespace of a real 3-node pod (issue #36): a
seeded Qwen2-MoE model from transformers saves its experts to ctxpod; a copy of it without
them loads, per layer, the experts its router picks (predicting the next layer's and
prefetching them into its own expert tensors) and gives the same logits, bit for bit."""

from __future__ import annotations

import uuid

import pytest
import torch
from transformers import Qwen2MoeConfig, Qwen2MoeForCausalLM

import ctxpod
from ctxpod.integrations.moe import SHARDS, ExpertOffload, experts_of


def tiny_qwen_moe(seed: int = 36) -> Qwen2MoeForCausalLM:
    """A small Qwen2-MoE (4 layers of 16 experts, top-2, bf16): real routing, real expert
    weights (a 360 KiB gate_up_proj and a 180 KiB down_proj shard per expert)."""
    torch.manual_seed(seed)
    config = Qwen2MoeConfig(
        vocab_size=512,
        hidden_size=256,
        intermediate_size=512,
        moe_intermediate_size=352,
        shared_expert_intermediate_size=256,
        num_hidden_layers=4,
        num_attention_heads=4,
        num_key_value_heads=2,
        num_experts=16,
        num_experts_per_tok=2,
        decoder_sparse_step=1,
        max_position_embeddings=256,
    )
    model = Qwen2MoeForCausalLM(config).to(torch.bfloat16).eval()
    # A fresh model's routers start at zero (every expert ties): give them real weights.
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("mlp.gate.weight"):
                p.normal_(0, 0.5)
    return model


@pytest.fixture
def weights_store(pod):
    s = ctxpod.Store.connect([n.http for n in pod], namespace=f"moe-{uuid.uuid4().hex[:10]}")
    assert s.create_namespace(namespace_class="weights")["class"] == "weights"
    yield s
    s.delete_namespace()
    s.close()


def test_experts_loaded_by_routing_give_the_models_own_logits(weights_store):
    full = tiny_qwen_moe()
    prompt = torch.randint(0, 512, (2, 24), generator=torch.Generator().manual_seed(7))
    token = prompt[:1, -1:]
    with torch.no_grad():
        want_prompt, want_token = full(prompt).logits, full(token).logits
    expert_bytes = (2 * 352 * 256 + 256 * 352) * 2
    assert ExpertOffload(weights_store, full).save() == 4 * 16 * expert_bytes

    model = tiny_qwen_moe()  # the same seed: the same dense weights and experts
    moe = ExpertOffload(weights_store, model).offload()
    try:
        for m in experts_of(model).values():
            assert all(int(getattr(m, s).count_nonzero()) == 0 for s in SHARDS), "offloaded"
        with torch.no_grad():
            got = model(prompt).logits
        assert torch.equal(got, want_prompt), (got - want_prompt).abs().max()
        st = moe.stats()
        assert st["loaded"] == sum(len(v) for v in moe.loaded.values()), st
        assert st["bytes"] == st["loaded"] * expert_bytes, st
        # Every expert a router picked was either predicted (and waited for) or fetched
        # when its layer routed; layer 0 has no layer before it to predict it.
        assert st["predicted"] > 0 and st["loaded"] == st["predicted"] + st["fetched_late"], st
        assert st["predicted_used"] + st["fetched_late"] == st["routed"], st
        assert st["fetched_late"] >= len(moe.loaded[0])

        # A decode step after the engine dropped its experts: one token routes to two
        # experts per layer; those are loaded, and at most two predicted ones beside them.
        moe.forget()
        before = moe.stats()
        with torch.no_grad():
            got = model(token).logits
        assert torch.equal(got, want_token), (got - want_token).abs().max()
        after = moe.stats()
        assert after["routed"] - before["routed"] == 8, after
        assert len(moe.loaded[0]) == 2 and all(2 <= len(moe.loaded[i]) <= 4 for i in range(1, 4)), moe.loaded
        assert after["bytes"] - before["bytes"] == (after["loaded"] - before["loaded"]) * expert_bytes
    finally:
        moe.close()


def test_prefetch_experts_lands_each_shard_in_place(weights_store):
    full = tiny_qwen_moe(seed=3)
    ExpertOffload(weights_store, full).save()
    m = experts_of(full)[2]
    gate_up = torch.zeros_like(m.gate_up_proj.data)
    down = torch.zeros_like(m.down_proj.data)
    for t in (gate_up, down):
        weights_store.register_buffer(t)
    ticket = weights_store.prefetch_experts({2: [5, 11]}, {2: {"gate_up_proj": gate_up, "down_proj": down}})
    sizes = ticket.wait()
    assert ticket.keys == [ctxpod.expert_key(2, e, s) for e in (5, 11) for s in ("gate_up_proj", "down_proj")]
    assert sizes == [2 * 352 * 256 * 2, 256 * 352 * 2] * 2
    for e in range(16):
        if e in (5, 11):
            assert torch.equal(gate_up[e], m.gate_up_proj.data[e]) and torch.equal(down[e], m.down_proj.data[e])
        else:
            assert int(gate_up[e].count_nonzero()) == 0 and int(down[e].count_nonzero()) == 0, e
    # An expert the pod does not hold is a miss (-404).
    assert weights_store.prefetch_experts({9: [0]}, {9: {"gate_up_proj": gate_up}}).wait() == [-404]
    with pytest.raises(ctxpod.InvalidRequest, match="expert 16 of layer 2"):
        weights_store.prefetch_experts({2: [16]}, {2: {"down_proj": down}})
    with pytest.raises(ctxpod.InvalidRequest, match="not a registered"):
        weights_store.prefetch_experts({2: [1]}, {2: {"down_proj": torch.zeros_like(down)}})


def test_a_model_whose_expert_is_missing_raises_rather_than_compute_with_zeros(weights_store):
    ExpertOffload(weights_store, tiny_qwen_moe(seed=5)).save()
    weights_store.batch_remove([ctxpod.expert_key(0, e, "down_proj") for e in range(16)])
    model = tiny_qwen_moe(seed=5)
    moe = ExpertOffload(weights_store, model).offload()
    try:
        with pytest.raises(ctxpod.NotFound, match="of layer 0 is not in namespace"), torch.no_grad():
            model(torch.tensor([[1, 2, 3]]))
    finally:
        moe.close()


def test_experts_larger_than_the_pods_values_are_refused_when_built(limited_node):
    """Qwen2-57B-A14B's expert shape (hidden 3584, expert intermediate 2560, bf16: a 36.7 MB
    gate_up_proj shard) against a node whose values stop at 16 MiB."""
    config = Qwen2MoeConfig(
        vocab_size=64,
        hidden_size=3584,
        intermediate_size=256,
        moe_intermediate_size=2560,
        shared_expert_intermediate_size=256,
        num_hidden_layers=1,
        num_attention_heads=28,
        num_key_value_heads=4,
        num_experts=2,
        num_experts_per_tok=1,
    )
    with torch.device("meta"):
        model = Qwen2MoeForCausalLM(config).to(torch.bfloat16)
    s = ctxpod.Store.connect(limited_node.http, namespace="moe-too-big")
    try:
        with pytest.raises(ctxpod.InvalidRequest, match=r"gate_up_proj of layer 0 is 36700160 bytes.*16777216"):
            ExpertOffload(s, model)
    finally:
        s.close()
