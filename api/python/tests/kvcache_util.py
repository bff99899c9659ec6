"""A Hugging Face transformers model's KV cache through ctxpod, shared by
test_transformers.py and bench/ttft.py (examples/transformers_prefix_reuse.py is the
same story, self-contained).

Layout: one ctxpod block per (token block, layer, K|V), keyed by the prompt's chained
Dynamo block hash (salted with a model id) plus two bytes, layer and 0 (K) or 1 (V); its
value is that block's slice of the layer's cache, [kv_heads, block_size, head_dim],
contiguous. A prefix is fetched with one ``prefetch`` into one registered tensor laid
out block-major, ``landing[layer, kv, block] = [kv_heads, block_size, head_dim]`` (a
CXP1 push fills one contiguous range per entry), and each layer's cache tensor
[1, kv_heads, tokens, head_dim] is then made from it by one permuting copy.

Written against transformers 5.x: ``DynamicCache.layers[l].keys/.values``, and the
model's ``cache=`` argument (``past_key_values=`` before 5.x)."""

from __future__ import annotations

import time
from dataclasses import dataclass

import torch
from transformers import DynamicCache, LlamaConfig, LlamaForCausalLM

import ctxpod

# What a node takes in one request (the SDK does not split by count yet): a batch put of
# at most BATCH_ENTRIES_MAX entries, a prefetch of at most MATCH_KEYS_MAX.
PUT_ENTRIES_MAX = 1024
PREFETCH_ENTRIES_MAX = 4096


def tiny_llama(
    hidden=256, layers=4, heads=4, kv_heads=2, intermediate=None, vocab=1000, seed=0, init_range=0.2
) -> LlamaForCausalLM:
    """A randomly initialised Llama (no download), the same for the same arguments. Its
    weights are wider than the usual 0.02, so that what it writes depends on the context:
    greedy tokens vary, and a wrong prefix changes them (0.02 gives near-uniform logits)."""
    torch.manual_seed(seed)
    cfg = LlamaConfig(
        hidden_size=hidden, intermediate_size=intermediate or 2 * hidden, num_hidden_layers=layers,
        num_attention_heads=heads, num_key_value_heads=kv_heads, vocab_size=vocab,
        max_position_embeddings=65536, initializer_range=init_range, attn_implementation="sdpa",
    )
    return LlamaForCausalLM(cfg).eval()


@dataclass(frozen=True)
class Layout:
    layers: int
    kv_heads: int
    head_dim: int
    block_size: int
    dtype: torch.dtype = torch.float32

    @classmethod
    def of(cls, model, block_size: int) -> Layout:
        c = model.config
        return cls(c.num_hidden_layers, c.num_key_value_heads, c.head_dim, block_size, model.dtype)

    @property
    def block_bytes(self) -> int:
        """Bytes of one (block, layer, K|V) entry."""
        return self.kv_heads * self.block_size * self.head_dim * torch.finfo(self.dtype).bits // 8

    def landing(self, blocks: int) -> torch.Tensor:
        """The block-major tensor a prefix of up to ``blocks`` blocks lands in."""
        return torch.zeros(self.layers, 2, blocks, self.kv_heads, self.block_size, self.head_dim, dtype=self.dtype)


def kv_key(h: int, layer: int, kv: int) -> bytes:
    """The key of block ``h`` (a chained block hash), ``layer``, K (0) or V (1)."""
    return ctxpod.dynamo_key(h) + bytes([layer, kv])


def block_hashes(tokens, block_size: int, model_id: str) -> list[int]:
    """The chained hashes of every complete block of ``tokens`` (a 1-D tensor or ints)."""
    tokens = tokens.tolist() if isinstance(tokens, torch.Tensor) else [int(t) for t in tokens]
    return ctxpod.dynamo_block_hashes(tokens, block_size, salt=model_id)


def put_all(store: ctxpod.Store, keys: list[bytes], values: list) -> None:
    """``batch_put`` in batches a node takes, sending again what it answered busy (503)."""
    todo = list(range(len(keys)))
    for attempt in range(200):
        busy = []
        for j in range(0, len(todo), PUT_ENTRIES_MAX):
            idx = todo[j : j + PUT_ENTRIES_MAX]
            for i, s in zip(idx, store.batch_put([keys[i] for i in idx], [values[i] for i in idx])):
                if s == 503:
                    busy.append(i)
                elif s not in (200, 201):
                    raise AssertionError(f"put of {keys[i].hex()}: {s}")
        if not (todo := busy):
            return
        time.sleep(min(0.01 * 2**attempt, 0.5))
    raise AssertionError(f"{len(todo)} blocks still refused as busy")


def as_buffer(t: torch.Tensor):
    """A contiguous CPU tensor as a buffer batch_put takes (its bytes, no copy)."""
    return t.contiguous().view(torch.uint8).numpy()


def store_kv(store: ctxpod.Store, cache: DynamicCache, hashes: list[int], lay: Layout) -> int:
    """Stores the K and V of every block in ``hashes`` (the first blocks of the sequence
    ``cache`` holds), per layer; the bytes stored."""
    bs = lay.block_size
    keys, values = [], []
    for b, h in enumerate(hashes):
        for layer in range(lay.layers):
            for kv, t in enumerate((cache.layers[layer].keys, cache.layers[layer].values)):
                keys.append(kv_key(h, layer, kv))
                values.append(as_buffer(t[0, :, b * bs : (b + 1) * bs, :]))
    put_all(store, keys, values)
    return len(keys) * lay.block_bytes


def match(store: ctxpod.Store, hashes: list[int]) -> int:
    """Leading blocks of the chain the pod holds (layer 0's K stands for the block; the
    prefetch's per-entry codes say whether every layer came)."""
    return store.match_prefix([kv_key(h, 0, 0) for h in hashes[: ctxpod.MATCH_KEYS_MAX]])


def entries(hashes: list[int], lay: Layout, capacity: int) -> tuple[list[bytes], list[int]]:
    """Keys and byte offsets into a landing tensor of ``capacity`` blocks, for ``hashes``."""
    keys, offsets = [], []
    for layer in range(lay.layers):
        for kv in (0, 1):
            for b, h in enumerate(hashes):
                keys.append(kv_key(h, layer, kv))
                offsets.append(((layer * 2 + kv) * capacity + b) * lay.block_bytes)
    return keys, offsets


def prefetch(store: ctxpod.Store, buf: ctxpod.Buffer, keys: list[bytes], offsets: list[int], size: int) -> list[int]:
    """One prefetch of ``keys`` into ``buf`` at ``offsets`` (room ``size`` each; several
    tickets, all in flight at once, past PREFETCH_ENTRIES_MAX entries), waited: the codes."""
    tickets = [
        store.prefetch(keys[j : j + PREFETCH_ENTRIES_MAX], into=(buf, offsets[j : j + PREFETCH_ENTRIES_MAX]),
                       sizes=[size] * len(keys[j : j + PREFETCH_ENTRIES_MAX]))
        for j in range(0, len(keys), PREFETCH_ENTRIES_MAX)
    ]
    codes = [c for t in tickets for c in t.wait()]
    del tickets  # a finished ticket still reserves its ranges of the buffer until dropped
    return codes


def fetch(store: ctxpod.Store, buf: ctxpod.Buffer, hashes: list[int], lay: Layout, capacity: int) -> list[int]:
    """Prefetches every (block, layer, K|V) of ``hashes`` into the registered landing
    tensor (``capacity`` blocks); the per-entry codes."""
    keys, offsets = entries(hashes, lay, capacity)
    return prefetch(store, buf, keys, offsets, lay.block_bytes)


def build_cache(landing: torch.Tensor, blocks: int, config) -> DynamicCache:
    """A DynamicCache holding the first ``blocks`` blocks of ``landing``: per layer, one
    copy from block-major to [1, kv_heads, tokens, head_dim]."""
    L, _, _, kvh, bs, hd = landing.shape
    cache = DynamicCache(config=config)
    for layer in range(L):
        k, v = (landing[layer, kv, :blocks].transpose(0, 1).reshape(1, kvh, blocks * bs, hd) for kv in (0, 1))
        # The layer adopts the tensors (cache.update would torch.cat them: a second copy).
        cache.layers[layer].lazy_initialization(k, v)
        cache.layers[layer].keys, cache.layers[layer].values = k, v
    return cache


@torch.inference_mode()
def prefill(model, ids: torch.Tensor, cache: DynamicCache | None = None, start: int = 0):
    """Runs ``ids`` [1, n] at positions start.. on ``cache`` (a fresh one if None): the
    last position's logits [vocab] and the cache."""
    if cache is None:
        cache = DynamicCache(config=model.config)
    pos = torch.arange(start, start + ids.shape[1]).unsqueeze(0)
    out = model(ids, cache=cache, position_ids=pos, use_cache=True, logits_to_keep=1)
    return out.logits[0, -1], cache


@torch.inference_mode()
def greedy(model, ids: torch.Tensor, cache: DynamicCache | None, start: int, steps: int):
    """Prefills ``ids`` at ``start`` on ``cache``, then decodes ``steps`` tokens greedily:
    (token ids, logits of every step [steps, vocab])."""
    logits, cache = prefill(model, ids, cache, start)
    pos = start + ids.shape[1]
    toks, all_logits = [], [logits]
    for i in range(steps):
        tok = int(logits.argmax())
        toks.append(tok)
        if i + 1 == steps:
            break
        logits, cache = prefill(model, torch.tensor([[tok]]), cache, pos)
        all_logits.append(logits)
        pos += 1
    return toks, torch.stack(all_logits)
