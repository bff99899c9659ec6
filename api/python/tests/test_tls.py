"""The SDK over TLS and mTLS against a real node: certificates made here with openssl (a
CA, the node's certificate for 127.0.0.1, a client certificate), on both listeners."""

from __future__ import annotations

import subprocess
import uuid
from pathlib import Path

import pytest

import ctxpod
from ctxpod import errors
from conftest import Node, s3_token, token


def openssl(*args: str, cwd: Path) -> None:
    subprocess.run(["openssl", *args], cwd=cwd, check=True, capture_output=True)


@pytest.fixture(scope="module")
def pki(root):
    d = root / "pki"
    d.mkdir(exist_ok=True)
    openssl("req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:P-256", "-nodes",
            "-keyout", "ca.key", "-out", "ca.pem", "-days", "2", "-subj", "/CN=sdk test CA", cwd=d)
    (d / "node.ext").write_text("subjectAltName=IP:127.0.0.1\nextendedKeyUsage=serverAuth\n")
    (d / "client.ext").write_text("extendedKeyUsage=clientAuth\n")
    for name in ("node", "client"):
        openssl("req", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:P-256", "-nodes",
                "-keyout", f"{name}.key", "-out", f"{name}.csr", "-subj", f"/CN=sdk {name}", cwd=d)
        openssl("x509", "-req", "-in", f"{name}.csr", "-CA", "ca.pem", "-CAkey", "ca.key",
                "-CAcreateserial", "-out", f"{name}.pem", "-days", "2", "-extfile", f"{name}.ext", cwd=d)
    # Another CA, which signed nothing the node trusts.
    openssl("req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:P-256", "-nodes",
            "-keyout", "other.key", "-out", "other.pem", "-days", "2", "-subj", "/CN=other CA", cwd=d)
    return d


@pytest.fixture(scope="module")
def tls_node(root, pki):
    tokens = root / "tls-tokens"
    tok = token(tokens, "tls-rw", "tenant-rw", "acme")
    s3 = s3_token(tokens, "tls-s3", "tenant-rw", "acme")
    n = Node(root, "tls", extra=(
        f'[auth]\ntokens_dir = "{tokens}"\n'
        f'[tls]\ncert_file = "{pki}/node.pem"\nkey_file = "{pki}/node.key"\n'
    ), scheme="https", ca=pki / "ca.pem")
    n.token = tok
    n.s3creds = s3
    yield n
    n.stop()


@pytest.fixture(scope="module")
def mtls_node(root, pki):
    n = Node(root, "mtls", extra=(
        f'[tls]\ncert_file = "{pki}/node.pem"\nkey_file = "{pki}/node.key"\n'
        f'client_ca_file = "{pki}/ca.pem"\n'
    ), scheme="https", ca=pki / "ca.pem", client=(pki / "client.pem", pki / "client.key"))
    yield n
    n.stop()


def test_tls_with_a_token_stores_and_prefetches(tls_node, pki):
    s = ctxpod.Store.connect(tls_node.http, f"tls-{uuid.uuid4().hex[:8]}", token=tls_node.token,
                             ca_file=pki / "ca.pem")
    assert s.members()[0]["http"].startswith("https://")
    s.create_namespace()
    data = bytes(range(256)) * 256
    assert s.put(b"tls", data) == 201
    assert s.get(b"tls") == data
    assert s.direct_calls() == 0  # direct connections are plain TCP only: TLS reads share one
    mem = bytearray(len(data) + 16)
    buf = s.register_buffer(mem)
    assert s.prefetch([b"tls"], into=(buf, [8]), sizes=[len(data)]).wait() == [len(data)]
    assert bytes(mem[8:-8]) == data and mem[:8] == bytearray(8) and mem[-8:] == bytearray(8)


def test_tls_refuses_a_node_it_cannot_verify_and_a_missing_token(tls_node, pki):
    with pytest.raises(errors.Unavailable):
        ctxpod.Store.connect(tls_node.http, "x", token=tls_node.token, ca_file=pki / "other.pem")
    with pytest.raises(errors.InvalidRequest, match="ca_file"):
        ctxpod.Store.connect(tls_node.http, "x", token=tls_node.token)
    with pytest.raises(errors.Unauthorized):  # no token: the pod's membership is not shown
        ctxpod.Store.connect(tls_node.http, "x", ca_file=pki / "ca.pem")


def test_mtls_needs_the_client_certificate(mtls_node, pki):
    ca = pki / "ca.pem"
    s = ctxpod.Store.connect(mtls_node.http, f"m-{uuid.uuid4().hex[:8]}", ca_file=ca,
                             cert_file=pki / "client.pem", key_file=pki / "client.key")
    s.create_namespace()
    assert s.put(b"m", b"mtls") == 201 and s.get(b"m") == b"mtls"
    with pytest.raises(errors.Unavailable):
        ctxpod.Store.connect(mtls_node.http, "x", ca_file=ca)
    with pytest.raises(errors.InvalidRequest, match="go together"):
        ctxpod.Store.connect(mtls_node.http, "x", ca_file=ca, cert_file=pki / "client.pem")


def test_the_s3_door_over_tls(tls_node, pki):
    """boto3 over https (it sends UNSIGNED-PAYLOAD there) with the node's CA: a round trip;
    a client that does not trust the CA is refused at the handshake."""
    boto3 = pytest.importorskip("boto3")
    from botocore.config import Config
    from botocore.exceptions import SSLError

    ak, sk = tls_node.s3creds

    def s3(ca: Path):
        return boto3.client("s3", endpoint_url=tls_node.s3, aws_access_key_id=ak, aws_secret_access_key=sk,
                            region_name="us-east-1", verify=str(ca),
                            config=Config(s3={"addressing_style": "path"}, retries={"max_attempts": 1}))

    c = s3(pki / "ca.pem")
    bucket = f"tls-{uuid.uuid4().hex[:8]}"
    c.create_bucket(Bucket=bucket)
    data = bytes(range(256)) * 4096
    c.put_object(Bucket=bucket, Key="0123456789abcdef", Body=data)
    assert c.get_object(Bucket=bucket, Key="0123456789abcdef")["Body"].read() == data
    with pytest.raises(SSLError):
        s3(pki / "other.pem").list_buckets()
