#!/usr/bin/env python3
"""Reuse a prompt prefix's KV cache from ctxpod with Hugging Face transformers.

Request 1 is prefilled and its KV cache is stored in ctxpod, one block per (16 tokens,
layer, K|V), under the prompt's chained block hashes. Request 2 shares the first blocks
(a system prompt, say): its cached prefix is found with match_prefix, pushed by the node
straight into one registered tensor with a single prefetch, and only its own suffix is
computed. The greedy tokens are the same as with a full recompute.

    ctxpod serve --data-dir /tmp/ctxpod --capacity 4GiB &     # a node on 127.0.0.1:7400
    python examples/transformers_prefix_reuse.py --url http://127.0.0.1:7400

Needs torch and transformers 5.x (no download: a small random Llama stands in for a real
model; with a real one, salt the hashes with its name and revision)."""

import argparse

import torch
from transformers import DynamicCache, LlamaConfig, LlamaForCausalLM

import ctxpod

ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
ap.add_argument("--url", default="http://127.0.0.1:7400", help="a ctxpod node (or any member of a pod)")
ap.add_argument("--namespace", default="transformers-example")
args = ap.parse_args()

BS, MODEL_ID = 16, "tiny-llama-random-0"  # tokens per block; the hashes' salt
torch.manual_seed(0)
cfg = LlamaConfig(hidden_size=256, intermediate_size=512, num_hidden_layers=4, num_attention_heads=4,
                  num_key_value_heads=2, vocab_size=1000, initializer_range=0.2)
model = LlamaForCausalLM(cfg).eval()
L, KVH, HD = cfg.num_hidden_layers, cfg.num_key_value_heads, cfg.head_dim
ENTRY = KVH * BS * HD * 4  # bytes of one (block, layer, K|V): [kv_heads, BS, head_dim] float32

store = ctxpod.Store.connect(args.url, namespace=args.namespace)
store.create_namespace()


def key(h, layer, kv):  # block hash + layer + K(0)/V(1)
    return ctxpod.dynamo_key(h) + bytes([layer, kv])


@torch.inference_mode()
def generate(ids, cache, start, steps=8):
    """Runs ids at positions start.. on cache, then decodes greedily: the tokens."""
    toks = []
    for _ in range(steps):
        pos = torch.arange(start, start + ids.shape[1]).unsqueeze(0)
        out = model(ids, cache=cache, position_ids=pos, use_cache=True, logits_to_keep=1)
        start += ids.shape[1]
        toks.append(int(out.logits[0, -1].argmax()))
        ids = torch.tensor([[toks[-1]]])
    return toks


system = torch.randint(0, 1000, (1, 5 * BS))  # shared by both requests: 5 blocks
req1 = torch.cat([system, torch.randint(0, 1000, (1, 23))], dim=1)
req2 = torch.cat([system, torch.randint(0, 1000, (1, 19))], dim=1)

# --- Request 1: prefill, then store the KV of every complete block. -------------------
cache1 = DynamicCache(config=cfg)
generate(req1, cache1, 0, steps=1)
h1 = ctxpod.dynamo_block_hashes(req1[0].tolist(), BS, salt=MODEL_ID)
keys, values = [], []
for b, h in enumerate(h1):
    for layer in range(L):
        for kv, t in enumerate((cache1.layers[layer].keys, cache1.layers[layer].values)):
            keys.append(key(h, layer, kv))  # the slice [kv_heads, BS, head_dim], contiguous
            values.append(t[0, :, b * BS:(b + 1) * BS].contiguous().numpy())
assert all(s in (200, 201) for s in store.batch_put(keys, values))
print(f"request 1: {req1.shape[1]} tokens prefilled, {len(h1)} blocks x {L} layers x K,V stored "
      f"({len(keys)} entries, {len(keys) * ENTRY} bytes)")

# --- Request 2: match the cached prefix, prefetch it in one call, compute the rest. ---
h2 = ctxpod.dynamo_block_hashes(req2[0].tolist(), BS, salt=MODEL_ID)
n = store.match_prefix([key(h, 0, 0) for h in h2])  # layer 0's K stands for the block
# One tensor, block-major: landing[layer, kv, block] is one entry's [kv_heads, BS, head_dim]
# (each pushed block fills one contiguous range). In an engine: allocate and register once.
landing = torch.empty(L, 2, n, KVH, BS, HD)
buf = store.register_buffer(landing)
fetch_keys, offsets = [], []
for layer in range(L):
    for kv in (0, 1):
        for b in range(n):
            fetch_keys.append(key(h2[b], layer, kv))
            offsets.append(((layer * 2 + kv) * n + b) * ENTRY)
ticket = store.prefetch(fetch_keys, into=(buf, offsets), sizes=[ENTRY] * len(fetch_keys))
codes = ticket.wait()  # per entry: bytes landed, or -404 (then recompute from that block)
assert codes == [ENTRY] * len(fetch_keys), codes
del ticket
store.unregister_buffer(buf)

# Per layer, one copy from block-major to the cache's [1, kv_heads, tokens, head_dim].
cache2 = DynamicCache(config=cfg)
for layer, lc in enumerate(cache2.layers):
    k, v = (landing[layer, kv].transpose(0, 1).reshape(1, KVH, n * BS, HD) for kv in (0, 1))
    lc.lazy_initialization(k, v)
    lc.keys, lc.values = k, v  # adopted as they are (cache.update would copy them again)
toks = generate(req2[:, n * BS:], cache2, n * BS)  # only the suffix is computed
full = generate(req2, DynamicCache(config=cfg), 0)  # the whole prompt, for comparison
print(f"request 2: {n} of {len(h2)} blocks matched ({n * BS} of {req2.shape[1]} tokens), "
      f"{sum(codes)} bytes fetched in {len(codes)} entries, {req2.shape[1] - n * BS} tokens computed")
print(f"greedy tokens from the cached prefix: {toks}")
print(f"greedy tokens from a full recompute:  {full}")
print("tokens equal:", toks == full)
assert toks == full
