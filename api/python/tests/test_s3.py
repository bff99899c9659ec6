"""The S3 door (`s3_listen`) against real S3 clients from PyPI: boto3 and the AWS CLI
(`aws s3api`, `aws s3 cp`, `aws s3 ls`), path-style, with SigV4 credentials made by
`ctxpod token create --s3`, storing and reading blocks byte for byte."""

from __future__ import annotations

import os
import subprocess
import sys
import time
import uuid
from pathlib import Path

import numpy as np
import pytest
from conftest import Node, engine, s3_token, token

boto3 = engine("boto3")
from botocore.config import Config  # noqa: E402
from botocore.exceptions import ClientError  # noqa: E402


@pytest.fixture(scope="module")
def door(root):
    """A node with authentication on and the S3 door; S3 credentials of tenants acme and
    globex."""
    tokens = root / "s3-tokens"
    creds = {
        "acme": s3_token(tokens, "acme-s3", "tenant-rw", "acme"),
        "globex": s3_token(tokens, "globex-s3", "tenant-rw", "globex"),
    }
    n = Node(root, "s3", extra=f'[auth]\ntokens_dir = "{tokens}"\n')
    n.creds = creds
    yield n
    n.stop()


@pytest.fixture(scope="module")
def big_door(root):
    """A node of 1 GiB taking values up to 512 MiB, with authentication on and the S3 door:
    room for objects of the sizes engines store."""
    tokens = root / "s3-big-tokens"
    creds = {"acme": s3_token(tokens, "acme-big", "tenant-rw", "acme")}
    admin = token(tokens, "admin-big", "admin")
    n = Node(root, "s3-big", extra=f'value_bytes_max = "512MiB"\n[auth]\ntokens_dir = "{tokens}"\n',
             capacity="1GiB")
    n.creds = creds
    n.admin = admin
    yield n
    n.stop()


def client(door, who: str = "acme", secret: str | None = None, **config):
    ak, sk = door.creds[who]
    return boto3.client(
        "s3",
        endpoint_url=door.s3,
        aws_access_key_id=ak,
        aws_secret_access_key=secret or sk,
        region_name="us-east-1",
        config=Config(s3={"addressing_style": "path"}, retries={"max_attempts": 1}, **config),
    )


def blob(n: int, seed: int) -> bytes:
    return np.random.default_rng(seed).integers(0, 256, n, dtype=np.uint8).tobytes()


def code(e: ClientError) -> str:
    return e.response["Error"]["Code"]


def test_boto3_stores_and_reads_blocks_byte_for_byte(door, tmp_path):
    s3 = client(door)
    bucket = f"kv-{uuid.uuid4().hex[:8]}"
    s3.create_bucket(Bucket=bucket)
    s3.head_bucket(Bucket=bucket)
    # KVBM's layout: a block's sequence hash as 16 hex digits.
    data = {f"{0xfeed0000 + i:016x}": blob(n, i) for i, n in enumerate([1, 65536, 1 << 20, 4 << 20])}
    for k, v in data.items():
        put = s3.put_object(Bucket=bucket, Key=k, Body=v)
        got = s3.get_object(Bucket=bucket, Key=k)
        assert got["Body"].read() == v
        assert got["ETag"] == put["ETag"]
        head = s3.head_object(Bucket=bucket, Key=k)
        assert head["ContentLength"] == len(v)
    big = data[f"{0xfeed0003:016x}"]
    part = s3.get_object(Bucket=bucket, Key=f"{0xfeed0003:016x}", Range="bytes=1048576-2097151")
    assert part["Body"].read() == big[1 << 20:2 << 20]
    assert part["ContentRange"] == f"bytes 1048576-2097151/{len(big)}"
    with pytest.raises(ClientError) as e:
        s3.head_object(Bucket=bucket, Key="0000000000000000")
    assert e.value.response["ResponseMetadata"]["HTTPStatusCode"] == 404
    with pytest.raises(ClientError) as e:
        s3.get_object(Bucket=bucket, Key="0000000000000000")
    assert code(e.value) == "NoSuchKey"
    # s3transfer (upload_file / download_file), as tools use it.
    src = tmp_path / "up.bin"
    src.write_bytes(blob(3 << 20, 9))
    s3.upload_file(str(src), bucket, "up.bin")
    s3.download_file(bucket, "up.bin", str(tmp_path / "down.bin"))
    assert (tmp_path / "down.bin").read_bytes() == src.read_bytes()
    # Pages of a listing, each key once, sizes as stored.
    keys, token = [], None
    while True:
        kw = {"ContinuationToken": token} if token else {}
        page = s3.list_objects_v2(Bucket=bucket, MaxKeys=2, **kw)
        keys += [(o["Key"], o["Size"]) for o in page.get("Contents", [])]
        if not page["IsTruncated"]:
            break
        token = page["NextContinuationToken"]
    want = sorted([(k, len(v)) for k, v in data.items()] + [("up.bin", 3 << 20)])
    assert keys == want
    out = s3.delete_objects(Bucket=bucket, Delete={"Objects": [{"Key": k} for k, _ in want]})
    assert len(out["Deleted"]) == len(want) and not out.get("Errors")
    assert s3.list_objects_v2(Bucket=bucket)["KeyCount"] == 0
    s3.delete_bucket(Bucket=bucket)
    with pytest.raises(ClientError) as e:
        s3.head_bucket(Bucket=bucket)
    assert e.value.response["ResponseMetadata"]["HTTPStatusCode"] == 404


def test_boto3_is_refused_with_bad_credentials_and_across_tenants(door):
    s3, other = client(door), client(door, "globex")
    bucket = f"own-{uuid.uuid4().hex[:8]}"
    s3.create_bucket(Bucket=bucket)
    s3.put_object(Bucket=bucket, Key="k", Body=b"acme's bytes")
    with pytest.raises(ClientError) as e:
        client(door, secret="x" * 40).get_object(Bucket=bucket, Key="k")
    assert code(e.value) == "SignatureDoesNotMatch"
    with pytest.raises(ClientError) as e:
        other.get_object(Bucket=bucket, Key="k")
    assert code(e.value) == "NoSuchBucket"
    assert bucket not in [b["Name"] for b in other.list_buckets()["Buckets"]]
    assert bucket in [b["Name"] for b in s3.list_buckets()["Buckets"]]
    # A bad checksum stores nothing; the node serves on.
    with pytest.raises(ClientError) as e:
        s3.put_object(Bucket=bucket, Key="bad", Body=b"x" * 1000, ChecksumCRC32C="AAAAAA==")
    assert code(e.value) == "BadDigest"
    assert [o["Key"] for o in s3.list_objects_v2(Bucket=bucket)["Contents"]] == ["k"]
    # Presigned URLs (SigV4): good until they expire. boto3 presigns with SigV2 unless told
    # otherwise, and SigV2 is refused.
    import urllib.error
    import urllib.request

    with pytest.raises(urllib.error.HTTPError) as e:
        urllib.request.urlopen(s3.generate_presigned_url("get_object", Params={"Bucket": bucket, "Key": "k"}))
    assert e.value.code == 403
    s3 = client(door, signature_version="s3v4")
    url = s3.generate_presigned_url("get_object", Params={"Bucket": bucket, "Key": "k"}, ExpiresIn=60)
    assert urllib.request.urlopen(url, timeout=10).read() == b"acme's bytes"
    short = s3.generate_presigned_url("get_object", Params={"Bucket": bucket, "Key": "k"}, ExpiresIn=1)
    time.sleep(2.5)
    with pytest.raises(urllib.error.HTTPError) as e:
        urllib.request.urlopen(short, timeout=10)
    assert e.value.code == 403


def aws(door, *args: str, cwd: Path) -> str:
    """The AWS CLI (awscli from PyPI) against the door, path-style, with acme's keys."""
    ak, sk = door.creds["acme"]
    cfg = cwd / "aws-config"
    cfg.write_text("[default]\nregion = us-east-1\ns3 =\n    addressing_style = path\n")
    env = dict(
        os.environ,
        AWS_ACCESS_KEY_ID=ak,
        AWS_SECRET_ACCESS_KEY=sk,
        AWS_CONFIG_FILE=str(cfg),
        AWS_SHARED_CREDENTIALS_FILE=str(cwd / "none"),
    )
    exe = Path(sys.executable).parent / "aws"
    r = subprocess.run([str(exe), "--endpoint-url", door.s3, *args], env=env, cwd=cwd,
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, f"aws {' '.join(args)}: {r.stderr}"
    return r.stdout


def test_the_aws_cli_s3api_and_s3_cp(door, tmp_path):
    bucket = f"cli-{uuid.uuid4().hex[:8]}"
    aws(door, "s3api", "create-bucket", "--bucket", bucket, cwd=tmp_path)
    src = tmp_path / "block.bin"
    src.write_bytes(blob(1 << 20, 3))
    aws(door, "s3api", "put-object", "--bucket", bucket, "--key", "00000000deadbeef", "--body", str(src),
        cwd=tmp_path)
    aws(door, "s3api", "get-object", "--bucket", bucket, "--key", "00000000deadbeef", "--range",
        "bytes=0-4095", str(tmp_path / "part.bin"), cwd=tmp_path)
    assert (tmp_path / "part.bin").read_bytes() == src.read_bytes()[:4096]
    head = aws(door, "s3api", "head-object", "--bucket", bucket, "--key", "00000000deadbeef", cwd=tmp_path)
    assert '"ContentLength": 1048576' in head
    big = tmp_path / "big.bin"
    big.write_bytes(blob(6 << 20, 4))
    aws(door, "s3", "cp", str(big), f"s3://{bucket}/big.bin", cwd=tmp_path)
    aws(door, "s3", "cp", f"s3://{bucket}/big.bin", str(tmp_path / "big.out"), cwd=tmp_path)
    assert (tmp_path / "big.out").read_bytes() == big.read_bytes()
    listing = aws(door, "s3", "ls", f"s3://{bucket}/", cwd=tmp_path)
    assert "big.bin" in listing and "00000000deadbeef" in listing


def signed_post(door, path: str, body: dict, who: str = "acme"):
    """A POST signed with SigV4 by botocore, as any S3 SDK can send one."""
    import json
    import urllib.error
    import urllib.request

    from botocore.auth import S3SigV4Auth
    from botocore.awsrequest import AWSRequest
    from botocore.credentials import Credentials

    ak, sk = door.creds[who]
    req = AWSRequest(method="POST", url=door.s3 + path, data=json.dumps(body).encode(),
                     headers={"content-type": "application/json"})
    S3SigV4Auth(Credentials(ak, sk), "s3", "us-east-1").add_auth(req)
    p = req.prepare()
    r = urllib.request.Request(p.url, data=p.body, headers=dict(p.headers), method="POST")
    try:
        with urllib.request.urlopen(r, timeout=10) as resp:
            return resp.status, json.load(resp)
    except urllib.error.HTTPError as e:
        return e.code, e.read().decode()


def test_kv_extras_match_and_pin_a_chain_with_s3_credentials(door):
    """MATCH and PIN through the S3 door, signed with the S3 credentials."""
    s3 = client(door)
    bucket = f"chain-{uuid.uuid4().hex[:8]}"
    s3.create_bucket(Bucket=bucket)
    chain = [f"{0xc0de0000 + i:016x}" for i in range(6)]
    for k in chain[:4]:
        s3.put_object(Bucket=bucket, Key=k, Body=k.encode())
    assert signed_post(door, f"/{bucket}?x-ctxpod-match", {"keys": chain}) == (200, {"matched": 4})
    status, got = signed_post(door, f"/{bucket}?x-ctxpod-pin", {"keys": chain, "ttl_ms": 30000})
    assert status == 200 and got["pinned"] == 4
    # Another tenant's credentials see nothing of it; bad input is an S3 error.
    status, text = signed_post(door, f"/{bucket}?x-ctxpod-match", {"keys": chain}, who="globex")
    assert status == 404 and "NoSuchBucket" in text
    status, text = signed_post(door, f"/{bucket}?x-ctxpod-match", {"chain": chain})
    assert status == 400 and "InvalidArgument" in text
    status, text = signed_post(door, f"/{bucket}?x-ctxpod-pin", {"keys": chain})
    assert status == 400 and "ttl_ms" in text


def sha256_of(path: Path) -> str:
    import hashlib

    h = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(8 << 20):
            h.update(chunk)
    return h.hexdigest()


def test_multipart_uploads_of_engine_sized_objects(big_door, tmp_path):
    """boto3's upload_file and download_file of a 300 MiB object (s3transfer: multipart
    uploads of 8 MiB parts, ten at once, and ranged GETs down), the AWS CLI's `s3 cp` of a
    40 MiB one both ways, and the multipart calls one by one: parts out of order and
    written again, ListParts, ListMultipartUploads, a bad part list refused with the upload
    kept, AbortMultipartUpload."""
    s3 = client(big_door)
    bucket = f"mp-{uuid.uuid4().hex[:8]}"
    s3.create_bucket(Bucket=bucket)
    src = tmp_path / "big.bin"
    rng = np.random.default_rng(7)
    with open(src, "wb") as f:
        for _ in range(300 // 20):
            f.write(rng.integers(0, 256, 20 << 20, dtype=np.uint8).tobytes())
    s3.upload_file(str(src), bucket, "kv/llama-70b.bin")
    assert s3.head_object(Bucket=bucket, Key="kv/llama-70b.bin")["ContentLength"] == 300 << 20
    s3.download_file(bucket, "kv/llama-70b.bin", str(tmp_path / "big.out"))
    assert sha256_of(tmp_path / "big.out") == sha256_of(src)
    (tmp_path / "big.out").unlink()
    # The AWS CLI: multipart over its 8 MiB threshold.
    mid = tmp_path / "mid.bin"
    mid.write_bytes(blob(40 << 20, 8))
    aws(big_door, "s3", "cp", str(mid), f"s3://{bucket}/mid.bin", cwd=tmp_path)
    aws(big_door, "s3", "cp", f"s3://{bucket}/mid.bin", str(tmp_path / "mid.out"), cwd=tmp_path)
    assert (tmp_path / "mid.out").read_bytes() == mid.read_bytes()
    # One call at a time.
    parts = [blob(5 << 20, 20), blob(6 << 20, 21), blob(1000, 22)]
    up = s3.create_multipart_upload(Bucket=bucket, Key="by-hand")["UploadId"]
    etags = {}
    first_etag2 = None
    for n in (3, 1, 2):
        first = s3.upload_part(Bucket=bucket, Key="by-hand", UploadId=up, PartNumber=n, Body=b"x" * 10)
        if n == 2:
            first_etag2 = first["ETag"]
        etags[n] = s3.upload_part(Bucket=bucket, Key="by-hand", UploadId=up, PartNumber=n,
                                  Body=parts[n - 1])["ETag"]
    listed = s3.list_parts(Bucket=bucket, Key="by-hand", UploadId=up)["Parts"]
    assert [(p["PartNumber"], p["Size"]) for p in listed] == [(1, 5 << 20), (2, 6 << 20), (3, 1000)]
    uploads = s3.list_multipart_uploads(Bucket=bucket)["Uploads"]
    assert [(u["Key"], u["UploadId"]) for u in uploads] == [("by-hand", up)]
    with pytest.raises(ClientError) as e:
        s3.complete_multipart_upload(Bucket=bucket, Key="by-hand", UploadId=up, MultipartUpload={
            "Parts": [{"PartNumber": 1, "ETag": etags[1]}, {"PartNumber": 4, "ETag": etags[1]}]})
    assert code(e.value) == "InvalidPart"
    with pytest.raises(ClientError) as e:  # the ETag of part 2's first bytes, since rewritten
        s3.complete_multipart_upload(Bucket=bucket, Key="by-hand", UploadId=up, MultipartUpload={
            "Parts": [{"PartNumber": n, "ETag": etags[n] if n != 2 else first_etag2} for n in (1, 2, 3)]})
    assert code(e.value) == "InvalidPart"
    done = s3.complete_multipart_upload(Bucket=bucket, Key="by-hand", UploadId=up, MultipartUpload={
        "Parts": [{"PartNumber": n, "ETag": etags[n]} for n in (1, 2, 3)]})
    whole = b"".join(parts)
    got = s3.get_object(Bucket=bucket, Key="by-hand")
    assert got["Body"].read() == whole and got["ETag"] == done["ETag"]
    span = s3.get_object(Bucket=bucket, Key="by-hand", Range=f"bytes={(5 << 20) - 3}-{(5 << 20) + 2}")
    assert span["Body"].read() == whole[(5 << 20) - 3:(5 << 20) + 3]
    gone = s3.create_multipart_upload(Bucket=bucket, Key="gone")["UploadId"]
    s3.upload_part(Bucket=bucket, Key="gone", UploadId=gone, PartNumber=1, Body=parts[0])
    s3.abort_multipart_upload(Bucket=bucket, Key="gone", UploadId=gone)
    with pytest.raises(ClientError) as e:
        s3.list_parts(Bucket=bucket, Key="gone", UploadId=gone)
    assert code(e.value) == "NoSuchUpload"
    keys = sorted(o["Key"] for o in s3.list_objects_v2(Bucket=bucket)["Contents"])
    assert keys == ["by-hand", "kv/llama-70b.bin", "mid.bin"]
    assert not s3.list_multipart_uploads(Bucket=bucket).get("Uploads")


def device_read_bytes(door) -> int:
    """Bytes the node has read from its device so far (its metrics)."""
    import re
    import urllib.request

    req = urllib.request.Request(door.http + "/metrics", headers={"Authorization": "Bearer " + door.admin})
    text = urllib.request.urlopen(req, timeout=10).read().decode()
    return int(re.search(r"^ctxpod_device_read_bytes_total (\d+)", text, re.M).group(1))


def test_a_ranged_get_reads_only_the_segments_that_hold_it(big_door):
    """A ranged GetObject of a 40 MiB object (a large value: 4 MiB extents, each sealed and
    checksummed in 64 KiB segments) reads from flash only the segments that hold the range,
    with their record's first 4 KiB (header and segment table), not the object nor the
    extent; the whole object's GET reads all of it."""
    s3 = client(big_door)
    bucket = f"rg-{uuid.uuid4().hex[:8]}"
    s3.create_bucket(Bucket=bucket)
    body = blob(40 << 20, 31)
    s3.put_object(Bucket=bucket, Key="layer-kv", Body=body)
    before = device_read_bytes(big_door)
    lo, hi = (9 << 20) + 5, (11 << 20) - 1  # inside the third extent (8..12 MiB)
    got = s3.get_object(Bucket=bucket, Key="layer-kv", Range=f"bytes={lo}-{hi}")
    assert got["Body"].read() == body[lo:hi + 1]
    assert got["ContentRange"] == f"bytes {lo}-{hi}/{len(body)}"
    # Segments 16..48 of that extent (1 MiB + 5 .. 3 MiB within it) and its first 4 KiB.
    assert device_read_bytes(big_door) - before == 4096 + 32 * (64 << 10)
    before = device_read_bytes(big_door)
    assert s3.get_object(Bucket=bucket, Key="layer-kv")["Body"].read() == body
    # The ten extents (a range read leaves the DRAM tier as it is).
    assert device_read_bytes(big_door) - before >= 10 * (4 << 20)
