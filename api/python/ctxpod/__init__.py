"""ctxpod: the Python SDK of a pod-level context-memory tier for LLM inference.

Store KV-cache blocks, find the longest cached prefix of a request, prefetch blocks
straight into the engine's own (registered) memory, and follow KV events, against one
node or a whole pod::

    import ctxpod
    store = ctxpod.Store.connect("http://127.0.0.1:7400", namespace="llama-8b")
    store.put(b"block-0", kv_bytes)
    n = store.match_prefix(chain)                 # leading blocks cached
    buf = store.register_buffer(host_pages)       # numpy array / CPU tensor / (ptr, size)
    t = store.prefetch(chain[:n], into=(buf, offsets))
    codes = t.wait()                              # bytes landed per entry, or -status

See docs/PYTHON.md for every call, the buffer lifetime rules and the mapping from
Mooncake Store's calls.
"""

from . import errors, hashing
from ._ctxpod import (
    BLOCK_BYTES_MAX,
    CONNECT_TIMEOUT_S,
    DIRECT_CONNECTIONS,
    DIRECT_CONNECTIONS_MAX,
    DOWN_FOR_S,
    KEY_BYTES_MAX,
    LEASE_MS_MAX,
    LIST_KEYS_MAX,
    MATCH_KEYS_MAX,
    PREFETCH_LEASE_MS_MAX,
    REQUEST_TIMEOUT_S,
    VERSION,
    dynamo_block_hashes,
)
from ._store import LOST, POLICIES, Buffer, Event, Events, Key, Store, Ticket, expert_key
from .errors import *  # noqa: F401,F403 (the exception classes, listed in errors.__all__)

__version__ = VERSION


def dynamo_key(sequence_hash: int) -> bytes:
    """A Dynamo sequence hash as a ctxpod key: its 8 bytes, big-endian (what
    ``ctxpod hash`` prints, and what an ``int`` key becomes)."""
    if not 0 <= sequence_hash < 1 << 64:
        raise InvalidRequest(f"a sequence hash is in 0..2**64, not {sequence_hash}")
    return sequence_hash.to_bytes(8, "big")


__all__ = [
    "Store",
    "Ticket",
    "Buffer",
    "Events",
    "Event",
    "Key",
    "LOST",
    "POLICIES",
    "errors",
    "hashing",
    "dynamo_block_hashes",
    "dynamo_key",
    "expert_key",
    "BLOCK_BYTES_MAX",
    "CONNECT_TIMEOUT_S",
    "DIRECT_CONNECTIONS",
    "DIRECT_CONNECTIONS_MAX",
    "DOWN_FOR_S",
    "KEY_BYTES_MAX",
    "LEASE_MS_MAX",
    "LIST_KEYS_MAX",
    "MATCH_KEYS_MAX",
    "PREFETCH_LEASE_MS_MAX",
    "REQUEST_TIMEOUT_S",
]
__all__ += [e for e in errors.__all__ if e != "from_status"]
