"""NIXL's OBJ backend (Dynamo KVBM's G4 client; the real ``nixl-cu12`` wheel from PyPI, whose
agent, DRAM registration and OBJ backend run on the CPU) moving KV blocks between host
memory and the S3 door: writes, reads, ranged reads and existence checks, byte for byte, with
the parameters docs/INTEGRATIONS.md gives for KVBM."""

from __future__ import annotations

import json
import time
import uuid

import numpy as np
import pytest
from conftest import Node, doc_snippet, engine, s3_token, token

nixl = engine("nixl_cu12")
boto3 = engine("boto3")
from botocore.config import Config  # noqa: E402
from nixl_cu12._api import nixl_agent, nixl_agent_config  # noqa: E402
from nixl_cu12._bindings import nixlBackendError  # noqa: E402

import ctxpod  # noqa: E402

AGENT = "kvbm-ctxpod-test"


@pytest.fixture(scope="module")
def door(root):
    """A node taking values up to 96 MiB, with authentication on and the S3 door; S3
    credentials of tenant acme."""
    tokens = root / "nixl-tokens"
    creds = s3_token(tokens, "kvbm-a", "tenant-rw", "acme")
    admin = token(tokens, "nixl-admin", "admin")
    n = Node(root, "nixl", extra=f'value_bytes_max = "96MiB"\n[auth]\ntokens_dir = "{tokens}"\n')
    n.creds = creds
    n.admin = admin
    yield n
    n.stop()


def s3(door):
    ak, sk = door.creds
    return boto3.client("s3", endpoint_url=door.s3, aws_access_key_id=ak, aws_secret_access_key=sk,
                        region_name="us-east-1", config=Config(s3={"addressing_style": "path"}))


def obj_backend(door, bucket: str):
    """A NIXL agent with the OBJ backend configured as docs/INTEGRATIONS.md says (the test
    door's URL, credentials and bucket in place of the doc's)."""
    params = json.loads(doc_snippet("nixl-obj-params"))
    ak, sk = door.creds
    params.update(endpoint_override=door.s3, access_key=ak, secret_key=sk, bucket=bucket)
    agent = nixl_agent(AGENT, nixl_agent_config(backends=[]))
    agent.create_backend("OBJ", params)
    return agent


def multipart_completions(door) -> int:
    """CompleteMultipartUpload requests the door answered OK so far (its metrics)."""
    import re
    import urllib.request

    req = urllib.request.Request(door.http + "/metrics", headers={"Authorization": "Bearer " + door.admin})
    text = urllib.request.urlopen(req, timeout=10).read().decode()
    m = re.search(r'^ctxpod_s3_requests_total\{(?=[^}]*op="CompleteMultipartUpload")(?=[^}]*code="OK")[^}]*\} (\d+)',
                  text, re.M)
    return int(m.group(1)) if m else 0


def run(agent, op: str, local: list[tuple[int, int, int]], remote: list[tuple[int, int, int]]) -> str:
    """One NIXL transfer between host memory and objects, to its end (30 s at most): "DONE",
    or "ERR" when NIXL reports the backend's failure (its state, or its backend error)."""
    h = agent.initialize_xfer(op, agent.get_xfer_descs(local, "DRAM"), agent.get_xfer_descs(remote, "OBJ"), AGENT)
    try:
        state = agent.transfer(h)
        deadline = time.monotonic() + 30
        while state not in ("DONE", "ERR"):
            assert time.monotonic() < deadline, f"{op} not done within 30 s"
            time.sleep(0.005)
            state = agent.check_xfer_state(h)
    except nixlBackendError:
        state = "ERR"
    h.release()
    return state


def test_nixl_obj_moves_kv_blocks_through_the_s3_door(door):
    """KVBM's G4 path: blocks of 64 KiB to 64 MiB (a 16-token block of Llama-3-70B is 5 MiB,
    a 32-token one 10 MiB; from 5 MiB on NIXL's CRT client sends them as multipart uploads)
    written from host memory as objects in one transfer, checked through boto3, read back
    into other memory, then a range of one read at an offset; existence queried through the
    backend. An object over the node's value limit ends the transfer in ERR, and nothing is
    stored under its key."""
    bucket = f"kvbm-{uuid.uuid4().hex[:8]}"
    s3(door).create_bucket(Bucket=bucket)
    agent = obj_backend(door, bucket)
    sizes = [64 << 10, 1 << 20, 5 << 20, 6 << 20, ctxpod.BLOCK_BYTES_MAX, 64 << 20]
    rng = np.random.default_rng(34)
    src = [rng.integers(0, 256, n, dtype=np.uint8) for n in sizes]
    dst = [np.zeros(n, dtype=np.uint8) for n in sizes]
    keys = [f"{0xb10c0000 + i:016x}" for i in range(len(sizes))]
    agent.register_memory([(a.ctypes.data, a.nbytes, 0, "") for a in src + dst], "DRAM")
    agent.register_memory([(0, n, i, k) for i, (n, k) in enumerate(zip(sizes, keys))], "OBJ")
    objs = [(0, n, i) for i, n in enumerate(sizes)]
    completed = multipart_completions(door)
    assert run(agent, "WRITE", [(a.ctypes.data, a.nbytes, 0) for a in src], objs) == "DONE"
    # Objects of 5 MiB and more go through NIXL's CRT client, which sends three of the four
    # here (6, 8 and 64 MiB) as multipart uploads.
    assert multipart_completions(door) - completed == 3
    for k, a in zip(keys, src):
        assert s3(door).get_object(Bucket=bucket, Key=k)["Body"].read() == a.tobytes()
    assert run(agent, "READ", [(a.ctypes.data, a.nbytes, 0) for a in dst], objs) == "DONE"
    assert all(np.array_equal(a, b) for a, b in zip(src, dst))
    # A ranged read: 1 MiB of the 5 MiB object from offset 3 MiB into the start of a buffer.
    part = np.zeros(1 << 20, dtype=np.uint8)
    agent.register_memory([(part.ctypes.data, part.nbytes, 0, "")], "DRAM")
    assert run(agent, "READ", [(part.ctypes.data, part.nbytes, 0)], [(3 << 20, 1 << 20, 2)]) == "DONE"
    assert np.array_equal(part, src[2][3 << 20:4 << 20])
    # Existence, as KVBM asks it: held keys answer, an absent one does not.
    absent = f"{0xdead0000:016x}"
    found = agent.query_memory([(0, 1, 0, keys[0]), (0, 1, 0, absent)], "OBJ", "OBJ")
    assert found[0] is not None and found[1] is None, found
    # Over the value limit: the transfer fails, nothing is stored.
    big = np.ones((96 << 20) + 4096, dtype=np.uint8)
    agent.register_memory([(big.ctypes.data, big.nbytes, 0, "")], "DRAM")
    agent.register_memory([(0, big.nbytes, 99, absent)], "OBJ")
    assert run(agent, "WRITE", [(big.ctypes.data, big.nbytes, 0)], [(0, big.nbytes, 99)]) == "ERR"
    with pytest.raises(s3(door).exceptions.NoSuchKey):
        s3(door).get_object(Bucket=bucket, Key=absent)
