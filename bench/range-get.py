#!/usr/bin/env python3
"""Range GETs of blocks, cold: what each reads from flash and how long it takes.

Starts `ctxpod serve` (the binary given) on a scratch folder, stores BLOCKS blocks of
BLOCK_BYTES over HTTP, then asks GETS ranges of RANGE_BYTES at random offsets of random
blocks (`Range: bytes=a-b`, one connection, one request at a time), then WHOLE whole GETs,
and prints, per kind: requests, bytes returned and bytes read from flash per request (the
node's `ctxpod_device_read_bytes_total`), and latency p50 / p99 / max. The DRAM tier is
small beside the blocks, so reads are cold (a whole GET may leave its block in DRAM; a
range read does not fill it).

    python3 bench/range-get.py --bin $CARGO_TARGET_DIR/debug/ctxpod --dir /work/bench/range

Each run is seeded (--seed): two binaries asked the same ranges read the same blocks.
"""
import argparse
import http.client
import os
import random
import re
import shutil
import signal
import socket
import subprocess
import time
from pathlib import Path


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def size(s: str) -> int:
    units = {"KiB": 1 << 10, "MiB": 1 << 20, "GiB": 1 << 30}
    for u, m in units.items():
        if s.endswith(u):
            return int(s[: -len(u)]) * m
    return int(s)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--bin", required=True)
    ap.add_argument("--dir", required=True, help="scratch folder (emptied)")
    ap.add_argument("--blocks", type=int, default=64)
    ap.add_argument("--block-bytes", type=size, default=8 << 20)
    ap.add_argument("--range-bytes", type=size, default=64 << 10)
    ap.add_argument("--gets", type=int, default=512)
    ap.add_argument("--whole", type=int, default=64)
    ap.add_argument("--seed", type=int, default=1)
    a = ap.parse_args()
    root = Path(a.dir)
    shutil.rmtree(root, ignore_errors=True)
    root.mkdir(parents=True)
    port = free_port()
    capacity = max(1 << 30, 2 * a.blocks * a.block_bytes)
    (root / "node.toml").write_text(
        f'data_dir = "{root}/data"\nlisten = "127.0.0.1:{port}"\n'
        f'transfer_listen = "127.0.0.1:{free_port()}"\ncapacity = "{capacity}"\n'
        f'dram = "16MiB"\nlog = "warn"\n'
    )
    log = open(root / "node.log", "w")
    env = dict(os.environ, CTXPOD_ZERO_FILL="false")
    proc = subprocess.Popen([a.bin, "serve", "--config", str(root / "node.toml")],
                            stdout=subprocess.DEVNULL, stderr=log, env=env)
    try:
        deadline = time.monotonic() + 120
        while True:
            try:
                c = http.client.HTTPConnection("127.0.0.1", port, timeout=60)
                c.request("GET", "/readyz")
                r = c.getresponse()
                r.read()
                if r.status == 200:
                    break
            except OSError:
                pass
            if time.monotonic() > deadline or proc.poll() is not None:
                raise SystemExit("the node did not start: see " + str(root / "node.log"))
            time.sleep(0.2)
        run(a, c)
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()


def read_bytes(c: http.client.HTTPConnection) -> int:
    c.request("GET", "/metrics")
    text = c.getresponse().read().decode()  # read whole: the connection is reused
    return int(re.search(r"^ctxpod_device_read_bytes_total (\d+)", text, re.M).group(1))


def run(a, c: http.client.HTTPConnection) -> None:
    rng = random.Random(a.seed)
    path = lambda i: f"/v1/namespaces/default/blocks/{f'blk{i:05}'.encode().hex()}"  # noqa: E731
    blocks = []
    for i in range(a.blocks):
        body = rng.randbytes(a.block_bytes)
        c.request("PUT", path(i), body=body, headers={"x-ctxpod-durability": "durable"})
        r = c.getresponse()
        r.read()
        assert r.status in (200, 201), r.status
        blocks.append(body)

    def measure(kind: str, n: int, ranged: bool) -> None:
        lat, returned = [], 0
        before = read_bytes(c)
        for _ in range(n):
            i = rng.randrange(a.blocks)
            headers = {}
            if ranged:
                lo = rng.randrange(a.block_bytes - a.range_bytes + 1)
                hi = lo + a.range_bytes
                headers["Range"] = f"bytes={lo}-{hi - 1}"
            else:
                lo, hi = 0, a.block_bytes
            t = time.perf_counter()
            c.request("GET", path(i), headers=headers)
            r = c.getresponse()
            got = r.read()
            lat.append(time.perf_counter() - t)
            assert r.status == (206 if ranged else 200), r.status
            assert got == blocks[i][lo:hi], f"{kind}: wrong bytes of block {i}"
            returned += len(got)
        flash = read_bytes(c) - before
        lat.sort()
        ms = lambda q: 1000 * lat[min(len(lat) - 1, int(q * len(lat)))]  # noqa: E731
        print(f"{kind:>6}: {n} GETs, {returned / n / 1024:.0f} KiB returned and "
              f"{flash / n / 1024:.0f} KiB read from flash per GET; latency p50 {ms(0.5):.2f} ms, "
              f"p99 {ms(0.99):.2f} ms, max {1000 * lat[-1]:.2f} ms")

    print(f"{a.blocks} blocks of {a.block_bytes >> 10} KiB; ranges of {a.range_bytes >> 10} KiB "
          f"at random offsets; one request at a time over HTTP")
    measure("range", a.gets, True)
    measure("whole", a.whole, False)


if __name__ == "__main__":
    main()
