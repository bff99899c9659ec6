"""A `ctxpod serve` for the Python benchmarks: free loopback ports, a data dir of the
caller's, ready when /readyz answers 200."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import time
import urllib.request


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start_node(
    binary: str, data_dir: str, capacity: str = "4GiB", dram: str = "2GiB", log=None,
    config: str | None = None,
) -> tuple[subprocess.Popen, str]:
    """The node process and its HTTP URL (its output to `log`, an open file, or nowhere;
    `config`: TOML text for `--config`, e.g. `[[tiers]]`); raises SystemExit if it is not
    ready within 60 s."""
    port, tport = free_port(), free_port()
    extra = []
    if config is not None:
        os.makedirs(data_dir, exist_ok=True)
        path = os.path.join(data_dir, "bench.toml")
        with open(path, "w") as f:
            f.write(config)
        extra = ["--config", path]
    node = subprocess.Popen(
        [binary, "serve", "--data-dir", data_dir, "--listen", f"127.0.0.1:{port}",
         "--transfer-listen", f"127.0.0.1:{tport}", "--capacity", capacity, "--dram", dram,
         *extra],
        stdout=log or subprocess.DEVNULL, stderr=log or subprocess.DEVNULL,
        env=dict(os.environ, CTXPOD_ZERO_FILL="false"))
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 60
    while True:
        try:
            if urllib.request.urlopen(url + "/readyz", timeout=2).status == 200:
                return node, url
        except OSError:
            pass
        if time.monotonic() > deadline or node.poll() is not None:
            node.kill()
            node.wait()
            raise SystemExit(f"the node ({binary}) did not start within 60 s")
        time.sleep(0.1)


def stop_node(node: subprocess.Popen, timeout: float = 30) -> None:
    """SIGTERM (the node flushes and exits), then SIGKILL past `timeout` seconds."""
    if node.poll() is not None:
        return
    node.send_signal(signal.SIGTERM)
    try:
        node.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        node.kill()
        node.wait()
