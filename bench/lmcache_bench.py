#!/usr/bin/env python3
"""LMCache's remote backend storing and retrieving KV chunks, on three remotes, in one run:

- ctxpod: the plugin (ctxpod.integrations.lmcache) against a node started here;
- lm: LMCache's own server (`python -m lmcache.v1.server`), `remote_url: lm://...`;
- fs: LMCache's file-system connector, `remote_url: fs://.../<dir>` (the page cache holds
  it: the machine's RAM is larger than the data).

Each: LMCache's RemoteBackend over a LocalCPUBackend (as in api/python/tests/test_lmcache.py);
`batched_submit_put_task` of BATCH chunks at a time until all are held, then
`batched_get_blocking` of BATCH chunks at a time, twice, every byte compared. GB/s of chunk bytes.

    ~/.cache/ctxpod-venv/bin/python bench/lmcache_bench.py --ctxpod-bin ~/.cache/ctxpod-target/debug/ctxpod
"""

from __future__ import annotations

import argparse
import asyncio
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import threading
import time

os.environ.setdefault("LMCACHE_TRACK_USAGE", "false")
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import torch  # noqa: E402
from benchnode import free_port, start_node  # noqa: E402
from lmcache.utils import CacheEngineKey  # noqa: E402
from lmcache.v1.config import LMCacheEngineConfig  # noqa: E402
from lmcache.v1.metadata import LMCacheMetadata  # noqa: E402
from lmcache.v1.storage_backend.local_cpu_backend import LocalCPUBackend  # noqa: E402
from lmcache.v1.storage_backend.remote_backend import RemoteBackend  # noqa: E402

CHUNK_TOKENS = 256
NO_CHUNK_META = False


def wait_port(port: int, proc: subprocess.Popen, what: str) -> None:
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise SystemExit(f"{what} exited")
        try:
            socket.create_connection(("127.0.0.1", port), timeout=1).close()
            return
        except OSError:
            time.sleep(0.1)
    raise SystemExit(f"{what} did not listen within 60 s")


def run(name: str, cfg: dict, kv_shape: tuple, n: int, batch: int, plugin: str | None) -> dict:
    base = dict(chunk_size=CHUNK_TOKENS, local_cpu=True, max_local_cpu_size=2.0, remote_serde="naive",
                lmcache_instance_id=f"bench-{name}")
    base.update(cfg)
    if NO_CHUNK_META:
        base.setdefault("extra_config", {})["save_chunk_meta"] = False
    config = LMCacheEngineConfig.from_dict(base)
    md = LMCacheMetadata(model_name="bench/model", world_size=1, local_world_size=1, worker_id=0,
                         local_worker_id=0, kv_dtype=torch.bfloat16, kv_shape=kv_shape)
    loop = asyncio.new_event_loop()
    t = threading.Thread(target=loop.run_forever, daemon=True)
    t.start()
    local = LocalCPUBackend(config, md, dst_device="cpu")
    remote = RemoteBackend(config, md, loop, local, dst_device="cpu", plugin_name=plugin)
    assert remote.connection is not None, f"{name}: LMCache built no connector"
    keys = [CacheEngineKey("bench/model", 1, 0, 0x10000 + i, torch.bfloat16) for i in range(n)]
    want = []
    g = torch.Generator().manual_seed(7)
    put_s = 0.0
    for at in range(0, n, batch):
        objs = []
        for _ in keys[at:at + batch]:
            o = local.allocate(md.get_shapes(), md.get_dtypes())
            o.raw_tensor.copy_(torch.randint(0, 256, (o.get_size(),), dtype=torch.uint8, generator=g))
            want.append(bytes(o.byte_array))
            objs.append(o)
        ks = keys[at:at + batch]
        t0 = time.perf_counter()
        remote.batched_submit_put_task(ks, objs)
        while remote.batched_contains(ks) < len(ks):
            time.sleep(0.0005)
        put_s += time.perf_counter() - t0
    # Two passes of gets: the first right after the puts (ctxpod reads flash: a put does not
    # fill the node's DRAM tier), the second once the remote has read everything once.
    get_s, bad = [0.0, 0.0], 0
    for p in range(2):
        for at in range(0, n, batch):
            ks = keys[at:at + batch]
            t0 = time.perf_counter()
            got = remote.batched_get_blocking(ks)
            get_s[p] += time.perf_counter() - t0
            for j, o in enumerate(got):
                if o is None or bytes(o.byte_array) != want[at + j]:
                    bad += 1
                if o is not None:
                    o.ref_count_down()
    remote.close()
    local.close()
    loop.call_soon_threadsafe(loop.stop)
    nbytes = sum(len(w) for w in want)
    return {"remote": name, "chunks": n, "chunk_bytes": len(want[0]), "batch": batch,
            "put_gbps": nbytes / put_s / 1e9, "get1_gbps": nbytes / get_s[0] / 1e9,
            "get2_gbps": nbytes / get_s[1] / 1e9, "mismatches": bad}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--ctxpod-bin", required=True)
    p.add_argument("--chunks", type=int, default=128)
    p.add_argument("--batch", type=int, default=8)
    p.add_argument("--layers", type=int, default=8, help="KV shape (layers, 2, 256, 4, 64), bf16: 2 MiB chunks at 8")
    p.add_argument("--only", default="ctxpod,lm,fs")
    p.add_argument("--no-chunk-meta", action="store_true",
                   help="extra_config save_chunk_meta: false (chunks without LMCache's header)")
    a = p.parse_args()
    global NO_CHUNK_META
    NO_CHUNK_META = a.no_chunk_meta
    kv_shape = (a.layers, 2, CHUNK_TOKENS, 4, 64)
    tmp = tempfile.mkdtemp(prefix="lmcache-bench-")
    procs = []
    rows = []
    try:
        for which in a.only.split(","):
            if which == "ctxpod":
                node, url = start_node(a.ctxpod_bin, f"{tmp}/node")
                procs.append(node)
                cfg = {"remote_storage_plugins": ["ctxpod"], "extra_config": {
                    "remote_storage_plugin.ctxpod.module_path": "ctxpod.integrations.lmcache",
                    "remote_storage_plugin.ctxpod.class_name": "CtxpodConnectorAdapter",
                    "remote_storage_plugin.ctxpod.url": url}}
                rows.append(run("ctxpod", cfg, kv_shape, a.chunks, a.batch, "ctxpod"))
            elif which == "lm":
                port = free_port()
                srv = subprocess.Popen([sys.executable, "-m", "lmcache.v1.server", "127.0.0.1", str(port), "cpu"],
                                       stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
                procs.append(srv)
                wait_port(port, srv, "lmcache.v1.server")
                rows.append(run("lm", {"remote_url": f"lm://127.0.0.1:{port}"}, kv_shape, a.chunks, a.batch, None))
            elif which == "fs":
                os.makedirs(f"{tmp}/fs", exist_ok=True)
                rows.append(run("fs", {"remote_url": f"fs://127.0.0.1:1{tmp}/fs/"}, kv_shape, a.chunks, a.batch, None))
    finally:
        for pr in procs:
            pr.terminate()
            pr.wait(timeout=20)
        shutil.rmtree(tmp, ignore_errors=True)
    print("| remote | chunks | chunk bytes | batch | put GB/s | get GB/s, first pass | get GB/s, second pass | mismatches |")
    print("|---|---:|---:|---:|---:|---:|---:|---:|")
    for r in rows:
        print(f"| {r['remote']} | {r['chunks']} | {r['chunk_bytes']} | {r['batch']} | {r['put_gbps']:.3f} | "
              f"{r['get1_gbps']:.3f} | {r['get2_gbps']:.3f} | {r['mismatches']} |")


if __name__ == "__main__":
    main()
