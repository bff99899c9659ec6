#!/usr/bin/env python3
"""ctxpod through its Python SDK, in the harness of ../shared/bench-peers (benchlib.py:
the same configs, timing, byte-for-byte verification, JSON lines and table as
mooncake_bench.py and redis_bench.py).

It starts a node itself on loopback (hot: node DRAM larger than the working set, and an
untimed read pass after the puts so the timed gets are DRAM hits), then drives it with
``ctxpod.Store``:

  zerocopy  Mooncake's zero-copy shape: one buffer registered with register_buffer(),
            put_from / batch_put_from from it, get_into / batch_get_into into it
            (keys, ptrs, sizes). A read into registered memory is a prefetch: the node
            pushes each block straight from the socket into the buffer.
  bytes     put(bytes) / batch_put, get() / batch_get returning bytes objects.

  python3 bench/sdk_bench.py --ctxpod-bin ~/.cache/ctxpod-target/debug/ctxpod \\
      --api zerocopy --sizes 64K,1M,4M --batches 1,16,32 --jsonl out.jsonl

Every loop is bounded (benchlib: --bytes-per-config, --max-seconds-per-phase,
--deadline-s); the node is stopped at the end (SIGTERM, then SIGKILL after 20 s).
"""

from __future__ import annotations

import argparse
import ctypes
import hashlib
import mmap
import os
import shutil
import sys
import tempfile
import time

here = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.environ.get("PEERS", os.path.join(here, "..", "..", "shared", "bench-peers")))
import benchlib  # noqa: E402
from benchnode import start_node, stop_node  # noqa: E402

import ctxpod  # noqa: E402


def key_of(k: str) -> bytes:
    # The shape of a chained token-block hash, as ctxpod_bench.py keys its blocks.
    return hashlib.blake2b(k.encode(), digest_size=32).digest()


class SdkAdapter(benchlib.Adapter):
    system = "ctxpod"

    def __init__(self, a):
        self.a = a
        self.variant = a.variant or f"sdk {a.api}"
        self.node = None
        self.store = None
        self.buf = None
        self.addr = 0
        self.slot = 0
        self.last: list = []

    def setup(self, max_size, max_batch):
        self.dir = tempfile.mkdtemp(prefix="ctxpod-sdk-bench-", dir=self.a.data_root)
        self.log = open(self.a.server_log or os.devnull, "w")
        try:
            self.node, url = start_node(self.a.ctxpod_bin, self.dir, self.a.capacity, self.a.dram, log=self.log)
        except SystemExit:
            raise SystemExit("the node did not start (see --server-log)")
        self.store = ctxpod.Store.connect(url, namespace="default", direct_connections=self.a.direct_connections)
        if self.a.api == "zerocopy":
            self.slot = max_size
            nbytes = max_size * max_batch
            self.buf = mmap.mmap(-1, nbytes)
            self.buf[:] = b"\x01" * nbytes  # pre-fault, as mooncake_bench.py does
            self.addr = ctypes.addressof(ctypes.c_char.from_buffer(self.buf))
            self.store.register_buffer(self.addr, nbytes)

    def prepare_put(self, keys, values):
        if self.a.api == "zerocopy":
            for j, v in enumerate(values):
                off = j * self.slot
                self.buf[off: off + len(v)] = v

    def put(self, keys, values):
        ks = [key_of(k) for k in keys]
        if self.a.api == "zerocopy":
            ptrs = [self.addr + j * self.slot for j in range(len(ks))]
            rcs = self.store.batch_put_from(ks, ptrs, [len(v) for v in values])
            return [None if r == 0 else f"put {r}" for r in rcs]
        sts = self.store.batch_put(ks, values)
        return [None if s in (200, 201) else f"put {s}" for s in sts]

    def get(self, keys, size):
        ks = [key_of(k) for k in keys]
        if self.a.api == "zerocopy":
            ptrs = [self.addr + j * self.slot for j in range(len(ks))]
            rcs = self.store.batch_get_into(ks, ptrs, [size] * len(ks))
            return [None if r == size else f"get_into {r}" for r in rcs]
        self.last = self.store.batch_get(ks)
        return [None if b is not None and len(b) == size else "get missing" for b in self.last]

    def fetch_result(self, j, size):
        if self.a.api == "zerocopy":
            off = j * self.slot
            return self.buf[off: off + size]
        return self.last[j]

    def between_put_and_get(self, keys, size, batch):
        # Untimed: every block into node DRAM, so the timed gets are hot.
        t0 = time.perf_counter()
        ks = [key_of(k) for k in keys]
        for i in range(0, len(ks), 32):
            self.store.batch_get(ks[i: i + 32])
        return {"prewarm_s": round(time.perf_counter() - t0, 2)}

    def remove(self, keys):
        ks = [key_of(k) for k in keys]
        fails = 0
        for i in range(0, len(ks), 256):
            fails += sum(1 for r in self.store.batch_remove(ks[i: i + 256]) if r is not True)
        return fails

    def exists(self, keys):
        ks = [key_of(k) for k in keys]
        return sum(self.store.batch_exists(ks[i: i + 256]).count(True) for i in range(0, len(ks), 256))

    def info(self):
        if self.store is None:
            return {"sdk": ctxpod.__version__}
        return {
            "busy_retries": self.store.busy_retries(),
            "direct_calls": self.store.direct_calls(),
            "direct_connections": self.a.direct_connections,
            "sdk": ctxpod.__version__,
        }

    def close(self):
        if self.store is not None:
            self.store.close()
            self.store = None
        if self.node is not None:
            stop_node(self.node, timeout=20)
            self.node = None
            shutil.rmtree(self.dir, ignore_errors=True)


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    benchlib.common_args(p)
    p.add_argument("--api", choices=["zerocopy", "bytes"], default="zerocopy")
    p.add_argument("--variant", default="")
    p.add_argument("--ctxpod-bin", required=True)
    p.add_argument("--capacity", default="4GiB")
    p.add_argument("--dram", default="3GiB")
    p.add_argument("--data-root", default=None, help="where the node's temporary data dir goes")
    p.add_argument("--server-log", default="")
    p.add_argument(
        "--direct-connections",
        type=int,
        default=None,
        help="Store.connect(direct_connections=N): 0 sends every call over the shared connection",
    )
    a = p.parse_args()
    ad = SdkAdapter(a)
    try:
        benchlib.run(ad, a)
    finally:
        ad.close()


if __name__ == "__main__":
    main()
