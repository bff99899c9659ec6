"""The S3 door keeps the promises of every other door (issue #32), tried with real clients
(boto3, botocore's own signers) and raw requests as an attacker would send them:

- every checksum S3 defines is checked (header or aws-chunked trailer), right and wrong;
  a checksum the door does not check is refused, never ignored;
- CreateBucket on an existing bucket keeps its settings (BucketAlreadyOwnedByYou);
- a browser form POST is refused at its headers: 16 unauthenticated 8.6 MiB forms leave
  the node's memory as it was;
- ctxpod's own routes take SigV4 only, presigned for at most 7 days;
- DeleteObjects needs its Content-MD5 (or checksum), and a request from a web page changes
  nothing, even on a door without authentication.
"""

from __future__ import annotations

import base64
import hashlib
import http.client
import socket
import subprocess
import threading
import uuid
import zlib

import numpy as np
import pytest
from conftest import BIN, Node, engine

boto3 = engine("boto3")
from botocore.auth import HmacV1Auth, HmacV1QueryAuth, S3SigV4Auth, S3SigV4QueryAuth, SigV4Auth  # noqa: E402
from botocore.awsrequest import AWSRequest  # noqa: E402
from botocore.config import Config  # noqa: E402
from botocore.credentials import Credentials  # noqa: E402
from botocore.exceptions import ClientError  # noqa: E402


def token(tokens_dir, tid: str, role: str, tenant: str) -> tuple[str, str, str]:
    """(bearer token, access key id, secret access key) of `ctxpod token create --s3`."""
    out = subprocess.run(
        [BIN, "token", "create", "--s3", "--id", tid, "--role", role, "--dir", str(tokens_dir), "--tenant", tenant],
        check=True, capture_output=True, text=True,
    ).stdout
    kv = dict(line.split(" = ", 1) for line in out.splitlines() if " = " in line)
    bearer = next(line for line in out.splitlines() if line and " = " not in line)
    return bearer, kv["aws_access_key_id"], kv["aws_secret_access_key"]


@pytest.fixture(scope="module")
def door(root):
    """A node with authentication on and its S3 door; tenant acme's credentials."""
    tokens = root / "promise-tokens"
    creds = token(tokens, "acme-p", "tenant-rw", "acme")
    n = Node(root, "s3-promises", extra=f'[auth]\ntokens_dir = "{tokens}"\n')
    n.bearer, n.ak, n.sk = creds
    yield n
    n.stop()


def s3_client(node, ak: str = "any", sk: str = "any"):
    return boto3.client(
        "s3", endpoint_url=node.s3, aws_access_key_id=ak, aws_secret_access_key=sk, region_name="us-east-1",
        config=Config(s3={"addressing_style": "path"}, retries={"max_attempts": 1}),
    )


def blob(n: int, seed: int) -> bytes:
    return np.random.default_rng(seed).integers(0, 256, n, dtype=np.uint8).tobytes()


def code(e: ClientError) -> str:
    return e.response["Error"]["Code"]


def b64(b: bytes) -> str:
    return base64.b64encode(b).decode()


def reflected_crc(poly: int, bits: int, data: bytes) -> bytes:
    """A reflected CRC of `bits` bits (all ones in and out), big-endian, as S3 spells its
    CRC checksums (botocore needs awscrt for CRC32C and CRC64NVME)."""
    ones = (1 << bits) - 1
    table = []
    for i in range(256):
        c = i
        for _ in range(8):
            c = (c >> 1) ^ poly if c & 1 else c >> 1
        table.append(c)
    crc = ones
    for b in data:
        crc = table[(crc ^ b) & 0xFF] ^ (crc >> 8)
    return (crc ^ ones).to_bytes(bits // 8, "big")


def crc64nvme(data: bytes) -> bytes:
    return reflected_crc(0x9A6C9329AC4BC9B5, 64, data)


def crc32c(data: bytes) -> bytes:
    return reflected_crc(0x82F63B78, 32, data)


#: Each checksum S3 defines: its header and how to compute its value.
CHECKSUMS = {
    "content-md5": lambda b: hashlib.md5(b).digest(),
    "x-amz-checksum-crc32": lambda b: zlib.crc32(b).to_bytes(4, "big"),
    "x-amz-checksum-crc32c": crc32c,
    "x-amz-checksum-crc64nvme": crc64nvme,
    "x-amz-checksum-sha1": lambda b: hashlib.sha1(b).digest(),
    "x-amz-checksum-sha256": lambda b: hashlib.sha256(b).digest(),
}


def test_the_reference_checksums_are_right():
    assert crc64nvme(b"123456789") == (0xAE8B14860A799888).to_bytes(8, "big")
    assert crc32c(b"123456789") == (0xE3069283).to_bytes(4, "big")


def signed(node, method: str, path: str, body: bytes = b"", headers: dict | None = None,
           creds: tuple[str, str] | None = None, signer: str = "v4"):
    """A request signed by botocore's own signer (SigV4, or SigV2 with signer="v2"; with
    signer="v4-as-is", SigV4 over the request's own `x-amz-content-sha256`, which S3's signer
    would replace), sent as it is; (status, body text)."""
    ak, sk = creds or (node.ak, node.sk)
    req = AWSRequest(method=method, url=node.s3 + path, data=body, headers=dict(headers or {}))
    if signer == "v4":
        S3SigV4Auth(Credentials(ak, sk), "s3", "us-east-1").add_auth(req)
    elif signer == "v4-as-is":
        SigV4Auth(Credentials(ak, sk), "s3", "us-east-1").add_auth(req)
    else:
        HmacV1Auth(Credentials(ak, sk)).add_auth(req)
    return send(req.prepare())


def send(p, body: bytes | None = None):
    """Sends prepared request `p` (with `body` instead of its own, when given)."""
    u = http.client.urlsplit(p.url)
    c = http.client.HTTPConnection(u.hostname, u.port, timeout=30)
    headers = dict(p.headers)
    if body is not None:
        headers["Content-Length"] = str(len(body))
    try:
        c.request(p.method, u.path + (f"?{u.query}" if u.query else ""), body=p.body if body is None else body,
                  headers=headers)
        r = c.getresponse()
        return r.status, r.read().decode(errors="replace")
    finally:
        c.close()


def held(s3, bucket: str, key: str) -> bool:
    try:
        s3.head_object(Bucket=bucket, Key=key)
        return True
    except ClientError as e:
        assert code(e) in ("404", "NoSuchKey"), e
        return False


def test_every_s3_checksum_is_checked_right_and_wrong_with_boto3(door):
    """boto3 with each algorithm: the right value stores the object, a wrong one is
    BadDigest and stores nothing (before: 17/17 wrong ones were stored)."""
    s3 = s3_client(door, door.ak, door.sk)
    bucket = f"sum-{uuid.uuid4().hex[:8]}"
    s3.create_bucket(Bucket=bucket)
    body = blob(1 << 20, 1)
    # boto3 computes these itself.
    for algo in ["CRC32", "SHA1", "SHA256"]:  # (CRC32C and CRC64NVME need awscrt)
        key = f"right-{algo}"
        s3.put_object(Bucket=bucket, Key=key, Body=body, ChecksumAlgorithm=algo)
        assert s3.get_object(Bucket=bucket, Key=key)["Body"].read() == body
    # Each value given by hand: right, then wrong (one bit off).
    params = {
        "content-md5": "ContentMD5",
        "x-amz-checksum-crc32": "ChecksumCRC32",
        "x-amz-checksum-crc32c": "ChecksumCRC32C",
        "x-amz-checksum-crc64nvme": "ChecksumCRC64NVME",
        "x-amz-checksum-sha1": "ChecksumSHA1",
        "x-amz-checksum-sha256": "ChecksumSHA256",
    }
    for header, digest in CHECKSUMS.items():
        right = digest(body)
        wrong = bytes([right[0] ^ 1]) + right[1:]
        key = f"given-{header}"
        s3.put_object(Bucket=bucket, Key=key, Body=body, **{params[header]: b64(right)})
        assert s3.get_object(Bucket=bucket, Key=key)["Body"].read() == body
        key = f"wrong-{header}"
        with pytest.raises(ClientError) as e:
            s3.put_object(Bucket=bucket, Key=key, Body=body, **{params[header]: b64(wrong)})
        assert code(e.value) in ("BadDigest", "InvalidDigest"), (header, e.value)
        assert not held(s3, bucket, key), header


def chunked_with_trailer(body: bytes, trailer: str, value: str) -> bytes:
    """An unsigned aws-chunked body (STREAMING-UNSIGNED-PAYLOAD-TRAILER) of 64 KiB chunks
    and a trailer."""
    out = bytearray()
    for i in range(0, len(body), 65536):
        c = body[i:i + 65536]
        out += f"{len(c):x}\r\n".encode() + c + b"\r\n"
    out += b"0\r\n" + f"{trailer}:{value}\r\n\r\n".encode()
    return bytes(out)


def test_every_trailer_checksum_is_checked_and_unknown_ones_refused(door):
    """Raw SigV4 puts with an aws-chunked body: each algorithm's trailer right and wrong;
    a checksum header or trailer of an algorithm the door does not check is refused (400,
    named), and nothing is stored."""
    s3 = s3_client(door, door.ak, door.sk)
    bucket = f"trl-{uuid.uuid4().hex[:8]}"
    s3.create_bucket(Bucket=bucket)
    body = blob(300_000, 2)
    for header, digest in CHECKSUMS.items():
        if header == "content-md5":
            continue
        for good in (True, False):
            value = digest(body) if good else digest(body + b"x")
            key = f"{header}-{good}"
            data = chunked_with_trailer(body, header, b64(value))
            status, text = signed(door, "PUT", f"/{bucket}/{key}", data, {
                "x-amz-content-sha256": "STREAMING-UNSIGNED-PAYLOAD-TRAILER",
                "content-encoding": "aws-chunked",
                "x-amz-decoded-content-length": str(len(body)),
                "x-amz-trailer": header,
                "content-length": str(len(data)),
            }, signer="v4-as-is")
            if good:
                assert status == 200, (header, status, text)
                assert s3.get_object(Bucket=bucket, Key=key)["Body"].read() == body
            else:
                assert status == 400 and "BadDigest" in text, (header, status, text)
                assert not held(s3, bucket, key), header
    for headers in ({"x-amz-checksum-xxhash3": "AAAAAAAAAAA="}, {"x-amz-trailer": "x-amz-checksum-md4"}):
        status, text = signed(door, "PUT", f"/{bucket}/unknown", body, headers)
        assert status == 400 and "InvalidRequest" in text and "not a checksum this door checks" in text, text
        assert not held(s3, bucket, "unknown")


def test_create_bucket_on_an_existing_bucket_keeps_its_settings(door):
    """A second CreateBucket answers BucketAlreadyOwnedByYou and keeps the bucket's quota:
    3 x 512 KiB do not fit in 1 MiB (before: the quota was wiped and all three fit)."""
    import ctxpod

    s3 = s3_client(door, door.ak, door.sk)
    bucket = f"quota-{uuid.uuid4().hex[:8]}"
    s3.create_bucket(Bucket=bucket)
    store = ctxpod.Store.connect([door.http], namespace=bucket, token=door.bearer)
    store.create_namespace(quota_bytes=1 << 20)
    with pytest.raises(ClientError) as e:
        s3.create_bucket(Bucket=bucket)
    assert code(e.value) == "BucketAlreadyOwnedByYou"
    assert e.value.response["ResponseMetadata"]["HTTPStatusCode"] == 409
    assert store.namespace_info()["quota_bytes"] == 1 << 20
    stored = 0
    for i in range(3):
        try:
            s3.put_object(Bucket=bucket, Key=f"half-{i}", Body=blob(512 << 10, 10 + i))
            stored += 1
        except ClientError:
            pass
    assert stored == 2
    store.close()


def rss_peak_kib(pid: int) -> int:
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmHWM:"):
                return int(line.split()[1])
    raise AssertionError("no VmHWM")


def test_unauthenticated_form_posts_are_refused_at_their_headers(root):
    """16 unsigned multipart/form-data POSTs of 8.6 MiB at once: each refused before its body
    is read, and the node's peak memory grows by less than 16 MiB (before: +272 MiB, every
    form read whole, then answered EntityTooLarge)."""
    tokens = root / "form-tokens"
    token(tokens, "acme-f", "tenant-rw", "acme")
    n = Node(root, "s3-forms", extra=f'[auth]\ntokens_dir = "{tokens}"\n')
    try:
        before = rss_peak_kib(n.proc.pid)
        size = int(8.6 * (1 << 20))
        boundary = "ctxpodform"
        # A form's fields come before its file, and are read whole: one large field.
        head = (f"--{boundary}\r\nContent-Disposition: form-data; name=\"key\"\r\n\r\nobj\r\n"
                f"--{boundary}\r\nContent-Disposition: form-data; name=\"x-amz-meta-pad\"\r\n\r\n").encode()
        tail = (f"\r\n--{boundary}\r\nContent-Disposition: form-data; name=\"file\"; filename=\"f\"\r\n\r\n"
                f"data\r\n--{boundary}--\r\n").encode()
        payload = head + b"a" * (size - len(head) - len(tail)) + tail
        answers: list[str] = []

        def post():
            s = socket.create_connection(("127.0.0.1", n.s3port), timeout=30)
            try:
                s.sendall((f"POST /acme-bucket HTTP/1.1\r\nHost: 127.0.0.1\r\n"
                           f"Content-Type: multipart/form-data; boundary={boundary}\r\n"
                           f"Content-Length: {len(payload)}\r\n\r\n").encode())
                try:
                    s.sendall(payload)
                except OSError:
                    pass  # answered and closed before the body: what is wanted
                got = b""
                try:
                    while b"\r\n" not in got:
                        chunk = s.recv(4096)
                        if not chunk:
                            break
                        got += chunk
                except OSError:
                    pass
                answers.append(got.split(b"\r\n", 1)[0].decode(errors="replace"))
            finally:
                s.close()

        threads = [threading.Thread(target=post) for _ in range(16)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(120)
        grown = rss_peak_kib(n.proc.pid) - before
        assert grown < 16 * 1024, f"peak RSS grew by {grown} KiB"
        assert len(answers) == 16
        for a in answers:
            # Refused at its headers (a reset before the status line is read also shows the
            # body was not taken).
            assert a == "" or a.split()[1] in ("403", "501"), answers
        assert any(a for a in answers), answers
    finally:
        n.stop()


def test_ctxpods_own_routes_take_sigv4_only_and_presigned_for_7_days_at_most(door):
    """`?x-ctxpod-match` signed with SigV2 (header or presigned) or presigned with SigV4 for
    8 days is refused; SigV4 is taken."""
    s3 = s3_client(door, door.ak, door.sk)
    bucket = f"sig-{uuid.uuid4().hex[:8]}"
    s3.create_bucket(Bucket=bucket)
    s3.put_object(Bucket=bucket, Key="k0", Body=b"x")
    body = b'{"keys": ["k0"]}'
    h = {"content-type": "application/json"}
    assert signed(door, "POST", f"/{bucket}?x-ctxpod-match", body, h) == (200, '{"matched":1}')
    status, text = signed(door, "POST", f"/{bucket}?x-ctxpod-match", body, h, signer="v2")
    assert status == 403 and "AWS4-HMAC-SHA256" in text, (status, text)
    creds = Credentials(door.ak, door.sk)
    req = AWSRequest(method="POST", url=f"{door.s3}/{bucket}?x-ctxpod-match", data=body, headers=h)
    HmacV1QueryAuth(creds, expires=3600).add_auth(req)
    status, text = send(req.prepare(), body)
    assert status == 403 and "SigV2" in text, (status, text)
    for days, ok in ((1, True), (8, False)):
        req = AWSRequest(method="POST", url=f"{door.s3}/{bucket}?x-ctxpod-match", data=body, headers=h)
        S3SigV4QueryAuth(creds, "s3", "us-east-1", expires=days * 86400).add_auth(req)
        # botocore's presigner moves a POST's body into its query (signed there, and
        # ignored by the node): the URL it signed is sent with the body.
        status, text = send(req.prepare(), body)
        if ok:
            assert status == 200, (status, text)
        else:
            assert status == 400 and "X-Amz-Expires" in text, (status, text)


def delete_xml(keys: list[str]) -> bytes:
    objs = "".join(f"<Object><Key>{k}</Key></Object>" for k in keys)
    return f'<?xml version="1.0" encoding="UTF-8"?><Delete>{objs}</Delete>'.encode()


def test_delete_objects_needs_its_checksum_and_a_web_page_deletes_nothing(node):
    """On a door without authentication (the loopback default): a cross-site text/plain
    `POST ?delete` (what a web page's form or fetch can send) deletes nothing, nor one
    without Content-MD5 or with a wrong one; boto3's DeleteObjects deletes them all
    (before: the cross-site request deleted 5/5)."""
    s3 = s3_client(node)
    bucket = f"csrf-{uuid.uuid4().hex[:8]}"
    s3.create_bucket(Bucket=bucket)
    keys = [f"victim-{i}" for i in range(5)]
    for k in keys:
        s3.put_object(Bucket=bucket, Key=k, Body=k.encode())
    xml = delete_xml(keys)

    def post(headers: dict) -> tuple[int, str]:
        c = http.client.HTTPConnection("127.0.0.1", node.s3port, timeout=30)
        try:
            c.request("POST", f"/{bucket}?delete", body=xml, headers=headers)
            r = c.getresponse()
            return r.status, r.read().decode()
        finally:
            c.close()

    page = {"Content-Type": "text/plain", "Origin": "https://evil.example", "Sec-Fetch-Site": "cross-site",
            "Sec-Fetch-Mode": "no-cors"}
    status, text = post(page)
    assert status == 403 and "web page" in text, (status, text)
    # Even with a right Content-MD5, a request from a page changes nothing.
    status, _ = post(dict(page, **{"Content-MD5": b64(hashlib.md5(xml).digest())}))
    assert status == 403
    status, text = post({"Content-Type": "application/xml"})
    assert status == 400 and "Content-MD5" in text, (status, text)
    status, text = post({"Content-Type": "application/xml", "Content-MD5": b64(hashlib.md5(b"other").digest())})
    assert status == 400 and "BadDigest" in text, (status, text)
    assert all(held(s3, bucket, k) for k in keys)
    # A real client sends its checksum, and deletes.
    out = s3.delete_objects(Bucket=bucket, Delete={"Objects": [{"Key": k} for k in keys]})
    assert sorted(d["Key"] for d in out["Deleted"]) == keys
    assert not any(held(s3, bucket, k) for k in keys)
