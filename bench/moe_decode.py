"""Decode steps of a MoE model whose experts come from a node (issue #36): how long a step
waits for its experts with the next layer's experts predicted and prefetched
(`ExpertOffload(predict=True)`) and without (each layer fetches on routing), every step
starting with no expert loaded (`forget()`: an engine that keeps none between steps) and
every read from flash (a node restarted with a 64 MiB DRAM tier for each arm).

The model: a transformers Qwen2-MoE with Qwen1.5-MoE-A2.7B's expert shapes (hidden 2048,
expert intermediate 1408, 16 experts of its 60, top-4, bf16, 4 layers), seeded; each step
checks the logits against the model with its own experts.

    ~/.cache/ctxpod-venv/bin/python bench/moe_decode.py --ctxpod-bin ~/.cache/ctxpod-target/debug/ctxpod
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import sys
import tempfile
import time

import torch
from transformers import Qwen2MoeConfig, Qwen2MoeForCausalLM

sys.path.insert(0, os.path.dirname(__file__))
from benchnode import start_node, stop_node  # noqa: E402

import ctxpod  # noqa: E402
from ctxpod.integrations.moe import ExpertOffload  # noqa: E402


def model(layers: int, experts: int, top_k: int) -> Qwen2MoeForCausalLM:
    torch.manual_seed(36)
    config = Qwen2MoeConfig(
        vocab_size=1024, hidden_size=2048, intermediate_size=1024, moe_intermediate_size=1408,
        shared_expert_intermediate_size=1024, num_hidden_layers=layers, num_attention_heads=16,
        num_key_value_heads=16, num_experts=experts, num_experts_per_tok=top_k,
        decoder_sparse_step=1, max_position_embeddings=512)
    m = Qwen2MoeForCausalLM(config).to(torch.bfloat16).eval()
    with torch.no_grad():
        for name, p in m.named_parameters():
            if name.endswith("mlp.gate.weight"):
                p.normal_(0, 0.05)
    return m


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--ctxpod-bin", required=True)
    ap.add_argument("--dir", default="/work/bench")
    ap.add_argument("--layers", type=int, default=4)
    ap.add_argument("--experts", type=int, default=16)
    ap.add_argument("--top-k", type=int, default=4)
    ap.add_argument("--steps", type=int, default=8)
    a = ap.parse_args()
    os.makedirs(a.dir, exist_ok=True)
    work = tempfile.mkdtemp(dir=a.dir, prefix="moe-decode-")
    data = os.path.join(work, "node")
    full = model(a.layers, a.experts, a.top_k)
    tokens = torch.randint(0, 1024, (a.steps, 1, 1), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        want = [full(t).logits for t in tokens]
    try:
        node, url = start_node(a.ctxpod_bin, data, capacity="8GiB", dram="64MiB")
        s = ctxpod.Store.connect(url, namespace="moe-decode")
        s.create_namespace(namespace_class="weights")
        stored = ExpertOffload(s, full).save()
        s.close()
        stop_node(node)
        print(f"stored {stored / 1e9:.2f} GB of experts", file=sys.stderr)
        print("| arm | ms a step waits for experts, median (range) | step ms, median | experts loaded a step | of them routed | GB/s while waiting |")
        print("|---|---|---|---|---|---|")
        for predict in (False, True, False, True):
            node, url = start_node(a.ctxpod_bin, data, capacity="8GiB", dram="64MiB")
            s = ctxpod.Store.connect(url, namespace="moe-decode")
            m = model(a.layers, a.experts, a.top_k)
            moe = ExpertOffload(s, m, predict=predict).offload()
            waits, steps, loaded, routed, moved = [], [], [], [], []
            for t, w in zip(tokens, want):
                moe.forget()
                before = moe.stats()
                t0 = time.perf_counter()
                with torch.no_grad():
                    got = m(t).logits
                steps.append(time.perf_counter() - t0)
                assert torch.equal(got, w), "logits differ"
                after = moe.stats()
                waits.append(after["waited_s"] - before["waited_s"])
                loaded.append(after["loaded"] - before["loaded"])
                routed.append(after["routed"] - before["routed"])
                moved.append(after["bytes"] - before["bytes"])
            moe.close()
            s.close()
            stop_node(node)
            print(f"| {'predicted' if predict else 'on routing'} | {statistics.median(waits) * 1e3:.0f} "
                  f"({min(waits) * 1e3:.0f}–{max(waits) * 1e3:.0f}) | {statistics.median(steps) * 1e3:.0f} | "
                  f"{statistics.mean(loaded):.1f} | {statistics.mean(routed):.1f} | "
                  f"{sum(moved) / sum(waits) / 1e9:.2f} |")
    finally:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
