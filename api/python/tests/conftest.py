"""Real nodes for the SDK's suites: the `ctxpod` binary ($CTXPOD_BIN, default the
debug build in $CARGO_TARGET_DIR) on free loopback ports with temporary data, one node
with authentication on, and a 3-node pod over a real etcd (Debian's etcd-server).
Everything started here is stopped at the end of its fixture's scope."""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import tempfile
import time
import urllib.request
from pathlib import Path

import pytest

TARGET = Path(os.environ.get("CARGO_TARGET_DIR", Path.home() / ".cache/ctxpod-target"))
BIN = os.environ.get("CTXPOD_BIN", str(TARGET / "debug/ctxpod"))
WAIT_S = 60


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class NodeExited(Exception):
    """A node's process ended while it was awaited: waiting longer cannot help."""


class PortTaken(NodeExited):
    """A node exited at start because one of its ports was taken meanwhile."""


def wait_for(what: str, ok, timeout: float = WAIT_S) -> None:
    deadline = time.monotonic() + timeout
    last = None
    while time.monotonic() < deadline:
        try:
            if ok():
                return
        except NodeExited:
            raise
        except Exception as e:  # noqa: BLE001 (not up yet)
            last = e
        time.sleep(0.1)
    raise AssertionError(f"{what} not ready within {timeout} s (last: {last})")


def engine(module: str):
    """An upstream engine package for a connector suite: skipped where it is not installed,
    except under the README's test command (CTXPOD_REQUIRE_ENGINES=1), which installs it and
    where a suite that cannot import its engine fails."""
    if os.environ.get("CTXPOD_REQUIRE_ENGINES") == "1":
        import importlib

        return importlib.import_module(module)
    return pytest.importorskip(module, reason=f"the connector suites need {module} (scripts/test.sh installs it)")


DOCS = Path(__file__).resolve().parents[3] / "docs"


def doc_snippet(name: str, doc: str = "INTEGRATIONS.md") -> str:
    """The fenced block that follows ``<!-- snippet: name -->`` in docs/``doc``: a
    connector's configuration as the docs give it, used as it is by its test."""
    text = (DOCS / doc).read_text()
    mark = f"<!-- snippet: {name} -->"
    at = text.index(mark) + len(mark)
    start = text.index("```", at)
    start = text.index("\n", start) + 1
    return text[start:text.index("```", start)]


def token(tokens_dir: Path, tid: str, role: str, tenant: str | None = None) -> str:
    args = [BIN, "token", "create", "--id", tid, "--role", role, "--dir", str(tokens_dir)]
    if tenant:
        args += ["--tenant", tenant]
    out = subprocess.run(args, check=True, capture_output=True, text=True).stdout
    return out.strip().splitlines()[-1].strip()


def s3_token(tokens_dir: Path, tid: str, role: str, tenant: str | None = None) -> tuple[str, str]:
    """(access key id, secret access key) of a token made with `ctxpod token create --s3`."""
    args = [BIN, "token", "create", "--s3", "--id", tid, "--role", role, "--dir", str(tokens_dir)]
    if tenant:
        args += ["--tenant", tenant]
    out = subprocess.run(args, check=True, capture_output=True, text=True).stdout
    kv = dict(line.split(" = ", 1) for line in out.splitlines() if " = " in line)
    return kv["aws_access_key_id"], kv["aws_secret_access_key"]


class Node:
    """One `ctxpod serve` process."""

    def __init__(self, root: Path, name: str, extra: str = "", pod: str = "", scheme: str = "http",
                 ca: Path | None = None, client: tuple[Path, Path] | None = None,
                 capacity: str = "256MiB") -> None:
        self.dir = root / name
        self._capacity = capacity
        self.dir.mkdir(parents=True, exist_ok=True)
        self._scheme, self._extra, self._pod_lines = scheme, extra, pod
        self.ssl = None
        if ca is not None:
            import ssl

            self.ssl = ssl.create_default_context(cafile=str(ca))
            if client is not None:
                self.ssl.load_cert_chain(str(client[0]), str(client[1]))
        self.config = self.dir / "node.toml"
        self.proc: subprocess.Popen | None = None
        # A port free when picked may be taken before the node binds it (another test's
        # connection got it as its source port): then the node exits saying so, and starts
        # again on other ports. A restart (`start`) keeps its ports.
        for attempt in range(5):
            self._pick_ports()
            try:
                self.start()
                return
            except PortTaken:
                if attempt == 4:
                    raise

    def _pick_ports(self) -> None:
        self.port, self.tport, self.s3port = free_port(), free_port(), free_port()
        self.http = f"{self._scheme}://127.0.0.1:{self.port}"
        #: The node's S3 door (every test node serves one).
        self.s3 = f"{self._scheme}://127.0.0.1:{self.s3port}"
        self.transfer = f"127.0.0.1:{self.tport}"
        self.config.write_text(
            f'data_dir = "{self.dir}/data"\nlisten = "127.0.0.1:{self.port}"\n'
            f'transfer_listen = "127.0.0.1:{self.tport}"\ns3_listen = "127.0.0.1:{self.s3port}"\n'
            f'capacity = "{self._capacity}"\n'
            f'dram = "32MiB"\nlog = "warn"\n{self._extra}\n{self._pod_lines}'
        )

    def start(self) -> None:
        self.log = open(self.dir / "node.log", "a")
        log_from = self.log.tell()
        env = dict(os.environ, CTXPOD_ZERO_FILL="false")
        self.proc = subprocess.Popen(
            [BIN, "serve", "--config", str(self.config)], stdout=subprocess.DEVNULL, stderr=self.log, env=env
        )

        def ready() -> bool:
            if self.proc.poll() is not None:
                self.log.close()
                said = (self.dir / "node.log").read_text()[log_from:]
                self.proc = None
                if "Address already in use" in said:
                    raise PortTaken(said)
                raise NodeExited(f"node {self.dir.name} exited at start:\n{said[-2000:]}")
            return urllib.request.urlopen(self.http + "/readyz", timeout=2, context=self.ssl).status == 200

        wait_for(f"node {self.dir.name}", ready)

    def stop(self) -> None:
        if self.proc is None:
            return
        self.proc.send_signal(signal.SIGTERM)
        try:
            self.proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        self.proc = None
        self.log.close()

    def kill(self) -> None:
        if self.proc is not None:
            self.proc.kill()
            self.proc.wait()
            self.proc = None
            self.log.close()


class OtherHttpService:
    """A plain HTTP service on loopback that is not a ctxpod node (Python's own
    ``http.server``): every GET answers ``status`` with an HTML page, as a web server, a
    proxy's error page or another service's 404 would."""

    def __init__(self, status: int = 404) -> None:
        import http.server
        import threading

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_GET(self) -> None:  # noqa: N802 (http.server's name)
                body = f"<html><body><h1>{status}</h1>not here</body></html>".encode()
                self.send_response(status)
                self.send_header("Content-Type", "text/html")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *args) -> None:
                pass

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_port}"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    def stop(self) -> None:
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture(params=[404, 200], ids=["answers-404", "answers-200-html"])
def other_http_service(request):
    """An HTTP service that is not a ctxpod node, answering 404 (or 200 with HTML) to
    everything."""
    s = OtherHttpService(request.param)
    yield s
    s.stop()


@pytest.fixture(scope="session")
def root():
    d = Path(tempfile.mkdtemp(prefix="ctxpod-sdk-"))
    yield d
    shutil.rmtree(d, ignore_errors=True)


@pytest.fixture(scope="session")
def node(root):
    """A node without authentication (the embedded loopback default)."""
    n = Node(root, "plain")
    yield n
    n.stop()


@pytest.fixture(scope="session")
def limited_node(root):
    """A node that stores values of at most 16 MiB (``value_bytes_max``): connectors built
    against it refuse engines whose values are larger."""
    n = Node(root, "limit-16mib", extra='value_bytes_max = "16MiB"')
    yield n
    n.stop()


@pytest.fixture(scope="session")
def auth_node(root):
    """A node with authentication on, and its tokens: admin, a tenant's read-write and
    read-only tokens (tenant acme), another tenant's (globex)."""
    tokens = root / "tokens"
    toks = {
        "admin": token(tokens, "admin", "admin"),
        "rw": token(tokens, "acme-rw", "tenant-rw", "acme"),
        "ro": token(tokens, "acme-ro", "tenant-ro", "acme"),
        "other": token(tokens, "globex-rw", "tenant-rw", "globex"),
    }
    n = Node(root, "auth", extra=f'[auth]\ntokens_dir = "{tokens}"\n')
    n.tokens = toks
    yield n
    n.stop()


class Etcd:
    def __init__(self, root: Path) -> None:
        if shutil.which("etcd") is None:
            raise AssertionError("etcd is not installed (scripts/setup-deps.sh installs etcd-server)")
        self.port, self.peer = free_port(), free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        peer = f"http://127.0.0.1:{self.peer}"
        self.log = open(root / "etcd.log", "w")
        self.proc = subprocess.Popen(
            ["etcd", "--name", "sdk", "--data-dir", str(root / "etcd"), "--listen-client-urls", self.url,
             "--advertise-client-urls", self.url, "--listen-peer-urls", peer,
             "--initial-advertise-peer-urls", peer, "--initial-cluster", f"sdk={peer}"],
            stdout=subprocess.DEVNULL, stderr=self.log,
        )
        wait_for("etcd", lambda: b"true" in urllib.request.urlopen(self.url + "/health", timeout=2).read())

    def stop(self) -> None:
        self.proc.terminate()
        try:
            self.proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            self.proc.kill()
        self.log.close()


@pytest.fixture(scope="session")
def pod(root):
    """Three nodes over a real etcd, two copies of each block (R = 2)."""
    etcd = Etcd(root)
    lines = f'[pod]\nname = "sdk"\netcd_endpoints = ["{etcd.url}"]\nreplication = 2\nlease_ttl_s = 5\n'
    nodes = [Node(root, f"pod{i}", pod=lines) for i in range(3)]

    def three() -> bool:
        import json

        c = json.load(urllib.request.urlopen(nodes[0].http + "/v1/cluster", timeout=2))
        return len(c["members"]) == 3

    wait_for("a pod of three", three)
    yield nodes
    for n in nodes:
        n.stop()
    etcd.stop()
