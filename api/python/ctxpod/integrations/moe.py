"""MoE expert weights on a ctxpod pod, loaded by routing (issue #36).

A mixture-of-experts model too large for the engine's memory keeps its experts in a
``weights`` namespace (never evicted) and loads, per layer and step, only the experts its
router picks, into the engine's own fused expert tensors (registered with the SDK, so each
shard lands in place). While layer ``L`` runs, the router of layer ``L + 1`` is applied to
layer ``L``'s hidden states to *predict* its experts, and those are prefetched at once
(asynchronously); when layer ``L + 1`` routes for real, what was predicted is waited for and
only a misprediction is fetched then. The model's output is the model's own, bit for bit.

>>> store = ctxpod.Store.connect(seeds, namespace="qwen-moe-experts")
>>> store.create_namespace(namespace_class="weights")
>>> ExpertOffload(store, full_model).save()          # once, by a loader
>>> moe = ExpertOffload(store, model).offload()      # experts now come from the pod
>>> model(input_ids)                                 # logits equal to the full model's
>>> moe.stats()                                      # loaded, predicted, hits, bytes, waited

Works with transformers' fused experts modules (``gate_up_proj`` and ``down_proj``
parameters of shape ``[num_experts, …]``, a router ``gate`` beside them returning
``(logits, weights, top_k_index)``: Qwen2-MoE, Qwen3-MoE, Mixtral, OLMoE in transformers 5),
found by name ``….layers.<i>.mlp.experts``. Keys: :func:`ctxpod.expert_key`.
"""

from __future__ import annotations

import re
import time
from collections.abc import Iterable
from typing import Any

import torch

from .. import Store, Ticket, expert_key
from ..errors import InvalidRequest, NotFound

#: The parameters of a fused experts module that hold expert weights, expert-major.
SHARDS = ("gate_up_proj", "down_proj")

_LAYER = re.compile(r"(?:^|\.)layers\.(\d+)\.mlp\.experts$")


def experts_of(model: torch.nn.Module) -> dict[int, torch.nn.Module]:
    """The fused experts modules of ``model`` by layer index."""
    found: dict[int, torch.nn.Module] = {}
    for name, m in model.named_modules():
        hit = _LAYER.search(name)
        if hit and all(isinstance(getattr(m, s, None), torch.Tensor) for s in SHARDS):
            found[int(hit.group(1))] = m
    if not found:
        raise ValueError("no fused MoE experts modules (….layers.<i>.mlp.experts with gate_up_proj, down_proj)")
    return found


class ExpertOffload:
    """One model's experts in a ``weights`` namespace of ``store``: :meth:`save` them there,
    then :meth:`offload` the model so that each forward loads the experts its routers pick
    (predicting the next layer's), into the model's own expert tensors."""

    def __init__(self, store: Store, model: torch.nn.Module, *, predict: bool = True) -> None:
        self.store = store
        self.model = model
        self.predict = predict
        self.experts = experts_of(model)
        # Refused when built, not when the first shard fails to store: every shard is one
        # value, at most the pod's value limit.
        limit = store.value_bytes_max
        for layer, m in sorted(self.experts.items()):
            for shard in SHARDS:
                t = getattr(m, shard)
                each = t[0].numel() * t.element_size()
                if each > limit:
                    raise InvalidRequest(
                        f"an expert's {shard} of layer {layer} is {each} bytes, over the pod's "
                        f"value limit of {limit} bytes (value_bytes_max: raise it, up to 1 GiB)"
                    )
        self.routers = {i: getattr(m, "gate", None) for i, m in self._blocks().items()}
        self.loaded: dict[int, set[int]] = {i: set() for i in self.experts}
        self._ahead: dict[int, tuple[Ticket, list[int]]] = {}
        self._hooks: list[Any] = []
        self._buffers: list[Any] = []
        # The one tensor object of each (layer, shard) registered with the store.
        self._tensors: dict[int, dict[str, torch.Tensor]] = {}
        self._stats = {
            "routed": 0,
            "loaded": 0,
            "predicted": 0,
            "predicted_used": 0,
            "fetched_late": 0,
            "bytes": 0,
            "waited_s": 0.0,
        }

    def _blocks(self) -> dict[int, torch.nn.Module]:
        """The MoE blocks (the experts modules' parents) by layer."""
        names = {m: n for n, m in self.model.named_modules()}
        blocks = {}
        for i, m in self.experts.items():
            parent = names[m].rsplit(".", 1)[0]
            blocks[i] = self.model.get_submodule(parent)
        return blocks

    def save(self, *, durable: bool = True) -> int:
        """Stores every expert's shards (one value each) in the store's namespace; returns
        the bytes stored. Keys: ``expert_key(layer, expert, shard)``."""
        total = 0
        for layer, m in sorted(self.experts.items()):
            keys, values = [], []
            for shard in SHARDS:
                w = getattr(m, shard).detach().contiguous()
                for e in range(w.shape[0]):
                    keys.append(expert_key(layer, e, shard))
                    values.append(w[e].contiguous().view(torch.uint8).numpy().tobytes())
            codes = self.store.batch_put(keys, values, durable=durable)
            bad = [(k, c) for k, c in zip(keys, codes) if c not in (200, 201)]
            if bad:
                raise RuntimeError(f"experts of layer {layer} not stored: {bad[:3]}")
            total += sum(len(v) for v in values)
        return total

    def offload(self) -> ExpertOffload:
        """From now on the model's expert weights come from the pod: the local ones are
        zeroed, the tensors registered with the store, and every experts module loads the
        experts its router picked before it runs (a hook). Returns ``self``."""
        for layer, m in self.experts.items():
            self._tensors[layer] = {}
            for shard in SHARDS:
                t = getattr(m, shard).data
                t.zero_()
                self._tensors[layer][shard] = t
                self._buffers.append(self.store.register_buffer(t))
            self._hooks.append(m.register_forward_pre_hook(self._before(layer)))
        return self

    def _regions(self, layer: int) -> dict[str, Any]:
        return self._tensors[layer]

    def _before(self, layer: int):
        def hook(_module: torch.nn.Module, args: tuple) -> None:
            hidden, top_k_index = args[0], args[1]
            chosen = sorted({int(e) for e in top_k_index.flatten().tolist()})
            self._stats["routed"] += len(chosen)
            self._ensure(layer, chosen)
            nxt = layer + 1
            if self.predict and nxt in self.experts and self.routers.get(nxt) is not None:
                self._predict(nxt, hidden)

        return hook

    def _predict(self, layer: int, hidden: torch.Tensor) -> None:
        """Starts fetching the experts layer ``layer``'s router picks for ``hidden``."""
        with torch.no_grad():
            _, _, index = self.routers[layer](hidden)
        want = sorted({int(e) for e in index.flatten().tolist()} - self.loaded[layer])
        if want and layer not in self._ahead:
            ticket = self.store.prefetch_experts({layer: want}, {layer: self._regions(layer)})
            self._ahead[layer] = (ticket, want)
            self._stats["predicted"] += len(want)

    def _ensure(self, layer: int, chosen: Iterable[int]) -> None:
        """Every expert in ``chosen`` is in the model's tensors of ``layer`` when this returns."""
        t0 = time.perf_counter()
        chosen = list(chosen)
        ahead = self._ahead.pop(layer, None)
        if ahead is not None:
            ticket, want = ahead
            self._landed(layer, want, ticket.wait())
            self._stats["predicted_used"] += len(set(want) & set(chosen))
        late = [e for e in chosen if e not in self.loaded[layer]]
        if late:
            ticket = self.store.prefetch_experts({layer: late}, {layer: self._regions(layer)})
            self._landed(layer, late, ticket.wait())
            self._stats["fetched_late"] += len(late)
        self._stats["waited_s"] += time.perf_counter() - t0

    def _landed(self, layer: int, experts: list[int], sizes: list[int | None]) -> None:
        per = len(SHARDS)
        for j, e in enumerate(experts):
            got = sizes[j * per : (j + 1) * per]
            if any(s is None or s < 0 for s in got):
                raise NotFound(f"expert {e} of layer {layer} is not in namespace {self.store.namespace!r}: {got}")
            self.loaded[layer].add(e)
            self._stats["loaded"] += 1
            self._stats["bytes"] += sum(got)

    def forget(self) -> None:
        """Drops what was loaded (as an engine short of memory would): the next forward
        loads again."""
        for layer, m in self.experts.items():
            with torch.no_grad():
                for s in SHARDS:
                    getattr(m, s).zero_()
            self.loaded[layer].clear()

    def stats(self) -> dict[str, float]:
        """Per forward's layers, summed: experts routed to (distinct per layer and
        forward), loaded (``predicted + fetched_late``), predicted, predictions routed to,
        fetched late (not predicted, or not yet loaded), bytes landed, seconds the forward
        waited for them."""
        return dict(self._stats)

    def close(self) -> None:
        """Removes the hooks and unregisters the tensors."""
        for h in self._hooks:
            h.remove()
        for b in self._buffers:
            self.store.unregister_buffer(b)
        self._hooks.clear()
        self._buffers.clear()
