"""The Pythonic layer over the native module: argument checking, keys, buffers,
exceptions, asyncio. The I/O itself runs in Rust with the GIL released."""

from __future__ import annotations

import asyncio
from collections.abc import Iterable, Iterator, Mapping, Sequence
from os import PathLike
from typing import Any, NamedTuple, Union

from . import _ctxpod
from .errors import InvalidRequest, from_status

#: What a key may be: raw bytes (1..=128), a ``str`` (its UTF-8 bytes), or an ``int``
#: in 0..2**64 (its 8 bytes, big-endian: a Dynamo sequence hash as ``dynamo_key`` spells
#: it).
Key = Union[bytes, bytearray, memoryview, str, int]

#: Per-entry code of a prefetch entry or a ``*_into`` read: bytes landed (>= 0), or a
#: negative status: -404 not found, -413 larger than its room, -422 corrupt, -499
#: cancelled, -503 busy, -504 past the deadline; ``LOST`` when the connection closed
#: before the node answered for it; ``None`` while pending.
LOST = -1

DEFAULT_LEASE_MS = 10_000
POLICIES = ("best_effort", "wait_complete", "timeout")


def expert_key(layer: int, expert: int, shard: str) -> bytes:
    """The key of one shard of one expert in a ``weights`` namespace:
    ``b"<layer>/<expert>/<shard>"`` (e.g. ``b"3/17/down_proj"``)."""
    if layer < 0 or expert < 0 or not shard or "/" in shard:
        raise InvalidRequest(f"expert_key({layer}, {expert}, {shard!r}): non-negative ids and a shard name without '/'")
    return f"{layer}/{expert}/{shard}".encode()


def _key(k: Key) -> bytes:
    if isinstance(k, bytes):
        b = k
    elif isinstance(k, (bytearray, memoryview)):
        b = bytes(k)
    elif isinstance(k, str):
        b = k.encode()
    elif isinstance(k, int) and not isinstance(k, bool):
        if not 0 <= k < 1 << 64:
            raise InvalidRequest(f"an int key is in 0..2**64, not {k}")
        b = k.to_bytes(8, "big")
    else:
        raise TypeError(f"a key is bytes, str or int, not {type(k).__name__}")
    if not 1 <= len(b) <= _ctxpod.KEY_BYTES_MAX:
        raise InvalidRequest(f"a key is 1..={_ctxpod.KEY_BYTES_MAX} bytes, not {len(b)}")
    return b


def _prefix(p: bytes | bytearray | memoryview | str) -> bytes:
    """A listing's prefix: bytes (empty for all keys), or a str as UTF-8."""
    if isinstance(p, str):
        p = p.encode()
    if not isinstance(p, (bytes, bytearray, memoryview)):
        raise TypeError(f"a prefix is bytes or str, not {type(p).__name__}")
    p = bytes(p)
    if len(p) > _ctxpod.KEY_BYTES_MAX:
        raise InvalidRequest(f"a prefix is at most {_ctxpod.KEY_BYTES_MAX} bytes, not {len(p)}")
    return p


def _keys(keys: Sequence[Key]) -> list[bytes]:
    if isinstance(keys, (bytes, bytearray, memoryview, str, int)):
        raise TypeError("give a sequence of keys (a list), not one key")
    return [_key(k) for k in keys]


def _ints(xs: Sequence[int], what: str) -> list[int]:
    out = []
    for x in xs:
        if isinstance(x, bool) or not isinstance(x, int):
            raise TypeError(f"{what} are ints, not {type(x).__name__}")
        if x < 0:
            raise InvalidRequest(f"{what} are >= 0, not {x}")
        out.append(x)
    return out


def _is_tensor(obj: Any) -> bool:
    """Whether ``obj`` is a torch tensor (duck-typed: no import of torch)."""
    return hasattr(obj, "data_ptr") and hasattr(obj, "untyped_storage") and hasattr(obj, "device")


def _tensor_check(t: Any, whole: tuple[int, int] | None) -> Any:
    """The check of memory a torch tensor's storage owns: ``check()`` is ``None`` while it
    is where it was registered, else what changed. torch can move a tensor's bytes under
    any reference to it (``resize_`` reallocates the storage in place and frees the old
    bytes, ``set_`` swaps the storage, ``share_memory_`` moves it), so every use checks.
    The check holds the storage, so that the old bytes of a tensor ``set_`` elsewhere stay
    allocated while the SDK may still name them. ``whole``: (address, bytes) of the tensor
    itself, when the tensor is what was registered."""
    storage = t.untyped_storage()
    sptr, sbytes, sid = int(storage.data_ptr()), int(storage.nbytes()), getattr(storage, "_cdata", None)

    def check() -> str | None:
        p, n = int(storage.data_ptr()), int(storage.nbytes())
        if (p, n) != (sptr, sbytes):
            return (
                f"its storage was moved or resized ({sbytes} bytes at {sptr:#x}, now {n} bytes at "
                f"{p:#x}: resize_ past its size, or share_memory_)"
            )
        if whole is not None:
            if getattr(t.untyped_storage(), "_cdata", None) != sid:
                return "its storage was replaced (set_)"
            p, n = int(t.data_ptr()), int(t.numel() * t.element_size())
            if (p, n) != whole or not t.is_contiguous():
                return f"it is now {n} bytes at {p:#x}{'' if t.is_contiguous() else ', not contiguous'} (resize_ or set_)"
        return None

    return check


def _tensor_span(obj: Any) -> tuple[int, int, Any] | None:
    """(address, bytes, check) of a CPU torch tensor."""
    if not _is_tensor(obj):
        return None
    if getattr(obj.device, "type", None) != "cpu":
        raise InvalidRequest(
            f"a tensor on {obj.device} cannot be registered yet: only host memory (a CPU tensor, "
            "pinned or not)"
        )
    if not obj.is_contiguous():
        raise InvalidRequest("the tensor is not contiguous: register tensor.contiguous()")
    span = int(obj.data_ptr()), int(obj.numel() * obj.element_size())
    return span[0], span[1], _tensor_check(obj, span)


def _tensor_beneath(obj: Any) -> Any:
    """The torch tensor whose memory a numpy array views (``tensor.numpy()``, and views of
    it), found through ``.base``; ``None`` if there is none."""
    seen = 0
    if isinstance(obj, memoryview):
        obj = obj.obj
        if _is_tensor(obj):
            return obj
    base = getattr(obj, "base", None)
    while base is not None and seen < 64:
        if _is_tensor(base):
            return base
        base = getattr(base, "base", None)
        seen += 1
    return None


class Buffer:
    """Memory registered with a :class:`Store`: prefetches push straight into it.

    ``ptr`` and ``size`` say where it is. Who keeps the memory alive: for an object (a
    bytearray, a numpy array, a torch tensor) the SDK does, holding the object (and its
    buffer export, or the tensor's storage) until the buffer is unregistered and every
    ticket into it is done; for a raw ``(ptr, size)`` (``obj`` is ``None``) the caller keeps
    the memory valid, unmoved, for as long. ``guarded``: the memory's owner can move it
    anyway (a torch tensor), so blocks land in the SDK's memory first and are copied in by
    the call that reports them landed, after checking the tensor is where it was.
    """

    __slots__ = ("_b", "obj")

    def __init__(self, native: Any, obj: Any) -> None:
        self._b = native
        #: The object the memory belongs to (``None`` for a bare pointer).
        self.obj = obj

    @property
    def ptr(self) -> int:
        return self._b.ptr

    @property
    def size(self) -> int:
        return self._b.size

    @property
    def id(self) -> int:
        return self._b.id

    @property
    def guarded(self) -> bool:
        return self._b.guarded

    def __repr__(self) -> str:
        return f"<ctxpod.Buffer {self.id}: {self.size} bytes at {self.ptr:#x}>"


class Ticket:
    """A prefetch in flight. Blocks land in the caller's registered memory; per entry the
    code says how it went (see ``LOST`` for the codes). Dropping the ticket cancels what
    the nodes have not pushed yet and ends its lease. Into a guarded buffer (a torch
    tensor) the calls that report entries landed (``wait``, ``wait_for``, ``poll``,
    ``ready``, ``progress``, ``await``) copy them in, after checking the tensor is where it
    was registered; if it moved they raise ``InvalidRequest`` and write nothing into it.

    ``await ticket`` waits from asyncio without blocking the event loop, and gives
    :meth:`poll`'s codes.
    """

    __slots__ = ("_t", "keys")

    def __init__(self, native: Any, keys: list[bytes]) -> None:
        self._t = native
        #: The keys, in entry order.
        self.keys = keys

    def __len__(self) -> int:
        return len(self._t)

    def wait(self, timeout: float | None = None) -> list[int | None]:
        """Waits until every entry landed or missed (or ``timeout`` seconds): the codes."""
        return self._t.wait(timeout)

    def wait_for(self, i: int, timeout: float | None = None) -> int | None:
        """Waits for entry ``i`` alone (decode can start on the first blocks while the rest
        arrive); its code, ``None`` if still pending at ``timeout`` seconds."""
        return self._t.wait_for(i, timeout)

    def poll(self) -> list[int | None]:
        """The codes now, without waiting."""
        return self._t.poll()

    def ready(self) -> bool:
        """Whether the nodes have finished (every entry landed or missed)."""
        return self._t.ready()

    def progress(self) -> tuple[int, int, bool]:
        """(landed, missed, done)."""
        return self._t.progress()

    def cancel(self) -> None:
        """Asks the nodes to stop: entries not pushed yet miss with -499."""
        self._t.cancel()

    def add_done_callback(self, fn: Any) -> None:
        """Calls ``fn()`` once the ticket is done, from the SDK's I/O thread (keep it short;
        with asyncio use ``await ticket``). Into a guarded buffer (a torch tensor), the
        blocks are copied in by the call that reports them landed: call :meth:`poll` (or
        :meth:`wait`) before reading them."""
        self._t.on_done(fn)

    def __await__(self):
        loop = asyncio.get_running_loop()
        fut = loop.create_future()

        def resolve() -> None:
            if not fut.done():
                fut.set_result(None)

        def done() -> None:
            try:
                loop.call_soon_threadsafe(resolve)
            except RuntimeError:  # the loop closed meanwhile
                pass

        self._t.on_done(done)
        yield from fut.__await__()
        return self._t.poll()

    def __repr__(self) -> str:
        landed, missed, done = self.progress()
        return f"<ctxpod.Ticket {len(self)} entries: {landed} landed, {missed} missed, done={done}>"


class Event(NamedTuple):
    """A KV event: ``kind`` is ``"stored"``, ``"evicted"`` or ``"deleted"``."""

    kind: str
    key: bytes


class Events:
    """KV events of a namespace from every member of the pod, as an iterator of
    :class:`Event`. ``lost`` counts events dropped because this reader fell behind (then
    resynchronise, e.g. with ``match_prefix``). Iteration ends when the stream ends."""

    def __init__(self, native: Any) -> None:
        self._e = native
        self._pending: list[Event] = []
        #: Events dropped before the ones read, in all.
        self.lost = 0

    def next(self, timeout: float | None = None) -> Event | None:
        """The next event, or ``None`` after ``timeout`` seconds without one."""
        if not self._pending:
            got = self._e.next(timeout)
            if got is None:
                return None
            lost, events = got
            self.lost += lost
            self._pending = [Event(k, key) for k, key in events]
            self._pending.reverse()
            if not self._pending:
                return None
        return self._pending.pop()

    def __iter__(self) -> Iterator[Event]:
        return self

    def __next__(self) -> Event:
        from .errors import Ended

        while True:
            try:
                e = self.next(1.0)
            except Ended:
                raise StopIteration from None
            if e is not None:
                return e

    def close(self) -> None:
        """Ends the subscription on every member."""
        self._e.close()

    def __enter__(self) -> Events:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()


def _ns(t: tuple) -> dict[str, Any]:
    name, quota, replication, used, blocks, klass, compression, compressed, stored = t
    return {
        "name": name,
        "quota_bytes": quota,
        "replication": replication,
        "used_bytes": used,
        "block_count": blocks,
        "class": klass,
        "compression": compression,
        "compressed_bytes": compressed,
        "compressed_stored_bytes": stored,
    }


def _ok(status: int) -> bool:
    return status in (200, 201)


class Store:
    """A ctxpod pod (or one node), through one namespace.

    Connect with :meth:`connect`. Data travels over CXP1 straight to the member that
    holds each block (placement computed here, R copies, read fall-back); membership and
    deletes go over HTTP. Every call releases the GIL while it waits. A store is safe to
    share between threads.
    """

    def __init__(self, native: Any, namespace: str) -> None:
        if not isinstance(namespace, str) or not namespace:
            raise InvalidRequest("the namespace is a non-empty str")
        self._s = native
        #: The namespace this store reads and writes.
        self.namespace = namespace
        self._objs: dict[int, Buffer] = {}

    # -- connecting ---------------------------------------------------------------

    @classmethod
    def connect(
        cls,
        seeds: str | Sequence[str],
        namespace: str = "default",
        *,
        token: str | None = None,
        ca_file: str | PathLike | None = None,
        cert_file: str | PathLike | None = None,
        key_file: str | PathLike | None = None,
        connect_timeout: float | None = None,
        request_timeout: float | None = None,
        down_for: float | None = None,
        direct_connections: int | None = None,
    ) -> Store:
        """Connects to a pod through any of ``seeds`` (node URLs such as
        ``"http://10.0.0.5:7400"``, or one URL; ``https://`` with ``ca_file``). Every seed
        is asked at once and the first pod view that comes back wins; the members' CXP1
        connections open on first use.

        ``token``: a bearer token (``ctxpod token create``). ``ca_file``: the CA bundle
        that signed the nodes' certificates (TLS). ``cert_file`` / ``key_file``: a client
        certificate (mTLS).

        Deadlines, in seconds (above 0, at most 3600): ``connect_timeout`` (default
        :data:`ctxpod.CONNECT_TIMEOUT_S`) to open a connection to a member, ``request_timeout``
        (default :data:`ctxpod.REQUEST_TIMEOUT_S`) for one request's whole answer. A member that
        misses one (frozen, overloaded, unreachable) costs that call one deadline and is
        asked last for ``down_for`` seconds (default :data:`ctxpod.DOWN_FOR_S`): later calls go to
        the other copies at once.

        ``direct_connections`` (default :data:`ctxpod.DIRECT_CONNECTIONS`, at most
        :data:`ctxpod.DIRECT_CONNECTIONS_MAX`; 0 turns them off): extra connections per
        member over which a GET is answered on the calling thread itself, which then reads
        its answer from the socket (one thread wake-up instead of two: what makes small
        reads fast). Each carries one call at a time; calls from more threads at once, and
        every call over TLS, take the member's shared connection. ``direct_calls()`` counts
        the calls answered so.
        """
        if isinstance(seeds, str):
            seeds = [seeds]
        seeds = list(seeds)
        if not seeds or not all(isinstance(s, str) for s in seeds):
            raise InvalidRequest("seeds: one node URL or a list of them")
        for s in seeds:
            if not s.startswith(("http://", "https://")):
                raise InvalidRequest(f"seed {s!r}: a node's HTTP URL, http://host:port or https://host:port")
        if any(s.startswith("https://") for s in seeds) and ca_file is None:
            raise InvalidRequest("https seeds need ca_file (the CA that signed the nodes' certificates)")
        if token is not None and not isinstance(token, str):
            raise TypeError("token is a str")
        if direct_connections is not None and (
            isinstance(direct_connections, bool)
            or not isinstance(direct_connections, int)
            or not 0 <= direct_connections <= _ctxpod.DIRECT_CONNECTIONS_MAX
        ):
            raise InvalidRequest(
                f"direct_connections: a whole number from 0 to {_ctxpod.DIRECT_CONNECTIONS_MAX}; got {direct_connections!r}"
            )
        deadlines = {"connect_timeout": connect_timeout, "request_timeout": request_timeout, "down_for": down_for}
        for name, v in deadlines.items():
            if v is None:
                continue
            if isinstance(v, bool) or not isinstance(v, (int, float)):
                raise InvalidRequest(f"{name}: a number of seconds, not {v!r}")
            if not 0 < v <= 3600:
                raise InvalidRequest(f"{name}: above 0 and at most 3600 seconds; got {v}")
        native = _ctxpod._Store.connect(
            seeds,
            token,
            None if ca_file is None else str(ca_file),
            None if cert_file is None else str(cert_file),
            None if key_file is None else str(key_file),
            None if connect_timeout is None else float(connect_timeout),
            None if request_timeout is None else float(request_timeout),
            None if down_for is None else float(down_for),
            direct_connections,
        )
        return cls(native, namespace)

    def with_namespace(self, namespace: str) -> Store:
        """The same connections, through another namespace."""
        s = Store(self._s, namespace)
        s._objs = self._objs
        return s

    def members(self) -> list[dict[str, Any]]:
        """The pod's members as last seen: id, http, transfer (CXP1), state."""
        return [
            {"id": i, "http": h, "transfer": t, "state": st} for i, h, t, st in self._s.members()
        ]

    @property
    def value_bytes_max(self) -> int:
        """The largest value (in bytes) every reachable member of the pod stores: the
        least of their ``value_bytes_max`` settings (256 MiB unless configured, at most
        1 GiB). A value of up to 8 MiB (``BLOCK_BYTES_MAX``) is one record; a larger one is
        stored and sent in 4 MiB pieces, transparently. Connectors check an engine's chunk
        size against it when they are built."""
        return self._s.value_bytes_max()

    def replication(self) -> int:
        """Copies the pod keeps of each block of this namespace (R)."""
        return self._s.replication(self.namespace)

    def create_namespace(
        self,
        *,
        quota_bytes: int | None = None,
        replication: int | None = None,
        namespace_class: str | None = None,
        compression: str | None = None,
    ) -> dict[str, Any]:
        """Creates this store's namespace in the pod (or sets these settings on it, if it
        exists): ``quota_bytes`` caps its live bytes, ``replication`` its copies of each
        block (default: the pod's). ``compression`` (``"lz4"`` or ``"zstd"``; default
        ``None``, off) compresses its blocks as they move to a node's dense tier, when that
        saves at least the node's ``compression_min_saving`` (reads decompress them; each
        setting call sets it anew, ``None`` turning it off for later moves); an unknown
        codec raises ``ValueError``. ``namespace_class`` is what a namespace created here
        holds: ``"kv"`` (the default; KV-cache blocks, evicted when the pod needs room) or
        ``"weights"`` (model weights such as MoE expert shards: never evicted; a node full
        of them refuses new writes instead). The class is fixed at creation: on an existing
        namespace ``None`` keeps it and another class raises ``Conflict``; an unknown class
        raises ``ValueError`` before anything is sent. Returns :meth:`namespace_info`.
        Namespaces are the caller's tenant's."""
        return _ns(
            self._s.create_namespace(self.namespace, quota_bytes, replication, namespace_class, compression)
        )

    def namespace_info(self) -> dict[str, Any]:
        """This namespace's name, quota_bytes, replication, used_bytes, block_count,
        class (``"kv"`` or ``"weights"``), compression (``"lz4"``, ``"zstd"`` or ``None``),
        compressed_bytes (of used_bytes, those held compressed on the member asked) and
        compressed_stored_bytes (the device bytes they take there: compressed_bytes over it
        is the ratio achieved); raises ``NotFound`` if it does not exist."""
        return _ns(self._s.namespace_info(self.namespace))

    def namespaces(self) -> list[dict[str, Any]]:
        """Every namespace of the caller's tenant (as :meth:`namespace_info` gives each)."""
        return [_ns(i) for i in self._s.namespaces()]

    def delete_namespace(self) -> None:
        """Deletes this namespace and every block in it, in the whole pod."""
        self._s.delete_namespace(self.namespace)

    def refresh(self) -> None:
        """Reads the pod's membership again (done by itself when a member is unreachable)."""
        self._s.refresh()

    def close(self) -> None:
        """Unregisters every buffer (the connections close when the store is collected)."""
        for b in list(self._objs.values()):
            self.unregister_buffer(b)

    def __enter__(self) -> Store:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    # -- one block ----------------------------------------------------------------

    def put(self, key: Key, value: Any, *, durable: bool = True) -> int:
        """Stores ``value`` (any buffer: bytes, bytearray, memoryview, a numpy array) under
        ``key``; 201 stored, 200 already stored with these bytes. ``durable=False``: the
        answer comes before the block is flushed to flash (faster; a crash may lose it).
        Raises the exception of the node's refusal (``TooLarge``, ``NoSpace``, ...)."""
        (s,) = self.batch_put([key], [value], durable=durable)
        if not _ok(s):
            raise from_status(s, f"put of {key!r}: the node answered {s}")
        return s

    def get(self, key: Key) -> bytes | None:
        """The block's bytes (CRC32C checked), or ``None`` if no member holds it."""
        (s, b) = self._s.get(self.namespace, [_key(key)])[0]
        if s == 200:
            return b
        if s == 404:
            return None
        raise from_status(s, f"get of {key!r}: the node answered {s}")

    def get_into(self, key: Key, buffer: Any, size: int | None = None) -> int | None:
        """Reads the block into ``buffer`` (a writable buffer, or with ``size`` an address
        inside a registered buffer, as Mooncake's ``get_into(key, ptr, size)``): the bytes
        written, or ``None`` for a miss. Raises ``TooLarge`` when the block does not fit
        (nothing is written)."""
        if size is None:
            (n,) = self.batch_get_into([key], [buffer])
        else:
            (n,) = self.batch_get_into([key], [buffer], [size])
        if n >= 0:
            return n
        if n == -404:
            return None
        raise from_status(-n, f"get_into of {key!r}: {n}")

    def remove(self, key: Key) -> bool:
        """Deletes the block from the pod (every copy; it does not come back). True if a
        member held it."""
        return self.batch_remove([key])[0]

    def exists(self, key: Key) -> bool:
        """Whether a member holds the block."""
        return self.batch_exists([key])[0]

    # -- listing ------------------------------------------------------------------

    def list_keys(
        self, prefix: bytes | str = b"", *, after: Key | None = None, limit: int = _ctxpod.LIST_KEYS_MAX
    ) -> tuple[list[bytes], bytes | None]:
        """One page of this namespace's keys across the pod, in byte order: those that start
        with ``prefix``, after ``after``, at most ``limit`` (1..=``LIST_KEYS_MAX``). Returns
        the keys and the ``after`` of the next page, or ``None`` when the listing is done.
        Every acknowledged put is listed. Raises ``Unavailable`` when a member cannot be
        reached (a page without its keys would look complete)."""
        prefix = _prefix(prefix)
        if isinstance(limit, bool) or not isinstance(limit, int):
            raise TypeError(f"limit is an int, not {type(limit).__name__}")
        if not 1 <= limit <= _ctxpod.LIST_KEYS_MAX:
            raise InvalidRequest(f"limit is 1..={_ctxpod.LIST_KEYS_MAX}, not {limit}")
        return self._s.list_keys(self.namespace, prefix, None if after is None else _key(after), limit)

    def keys(self, prefix: bytes | str = b"", *, page_size: int = _ctxpod.LIST_KEYS_MAX) -> Iterator[bytes]:
        """Every key of this namespace that starts with ``prefix``, in byte order, read a
        page (``page_size`` keys) at a time as the iterator is consumed. Keys stored while
        it runs are listed if they sort after the page being read."""
        after: bytes | None = None
        while True:
            page, after = self.list_keys(prefix, after=after, limit=page_size)
            yield from page
            if after is None:
                return

    # -- batches ------------------------------------------------------------------

    def batch_put(self, keys: Sequence[Key], values: Sequence[Any], *, durable: bool = True) -> list[int]:
        """Stores each value under its key, each member's share in one request: per entry,
        its status (201, 200; or 409, 413, 422, 503, 507, ... for that entry alone)."""
        keys = _keys(keys)
        values = list(values)
        if len(keys) != len(values):
            raise InvalidRequest(f"{len(keys)} keys but {len(values)} values")
        return self._s.put(self.namespace, keys, values, durable)

    def batch_get(self, keys: Sequence[Key]) -> list[bytes | None]:
        """Each block's bytes, or ``None`` for a miss; raises for the first entry a node
        refused (use :meth:`batch_get_into` for per-entry codes)."""
        out = []
        for k, (s, b) in zip(keys, self._s.get(self.namespace, _keys(keys))):
            if s == 200:
                out.append(b)
            elif s == 404:
                out.append(None)
            else:
                raise from_status(s, f"get of {k!r}: the node answered {s}")
        return out

    def batch_get_into(
        self, keys: Sequence[Key], buffers: Sequence[Any], sizes: Sequence[int] | None = None
    ) -> list[int]:
        """Reads each block into its buffer. ``buffers`` are writable buffers, or, with
        ``sizes``, addresses (ints) inside registered buffers (Mooncake's
        ``batch_get_into(keys, ptrs, sizes)``): each ``(ptr, size)`` must lie inside one
        registered buffer (else ``InvalidRequest``, nothing sent); a registered torch
        tensor is checked first and raises ``InvalidRequest`` if it moved since (see
        :meth:`register_buffer`); memory registered as a raw ``(ptr, size)`` is the
        caller's to keep valid. Per entry: the bytes written, or a negative status (-404 a
        miss, -413 the block is larger than its buffer: nothing written)."""
        keys = _keys(keys)
        if sizes is None:
            bufs = list(buffers)
            if len(bufs) != len(keys):
                raise InvalidRequest(f"{len(keys)} keys but {len(bufs)} buffers")
            return self._s.get_into(self.namespace, keys, bufs)
        ptrs, sizes = _ints(buffers, "pointers"), _ints(sizes, "sizes")
        return self._s.get_into_ptrs(self.namespace, keys, ptrs, sizes)

    def batch_remove(self, keys: Sequence[Key]) -> list[bool]:
        """Deletes each block from the pod: per key, whether a member held it."""
        return self._s.remove(self.namespace, _keys(keys))

    def batch_exists(self, keys: Sequence[Key]) -> list[bool]:
        """Whether each block is held (a member a read would try holds it)."""
        return self._s.exists(self.namespace, _keys(keys))

    def match_prefix(self, keys: Sequence[Key]) -> int:
        """How many leading keys of a chain of block hashes the pod holds: the prefix an
        engine can fetch instead of recompute."""
        keys = _keys(keys)
        if len(keys) > _ctxpod.MATCH_KEYS_MAX:
            raise InvalidRequest(f"a chain is at most {_ctxpod.MATCH_KEYS_MAX} keys, not {len(keys)}")
        return self._s.match_prefix(self.namespace, keys)

    def pin(self, keys: Sequence[Key], ttl: float) -> int:
        """Keeps the present blocks from eviction for ``ttl`` seconds (at most an hour), on
        each of their copies; how many were pinned."""
        if not isinstance(ttl, (int, float)) or isinstance(ttl, bool) or not 0 < ttl <= _ctxpod.LEASE_MS_MAX / 1000:
            raise InvalidRequest(f"ttl is a number of seconds in (0, {_ctxpod.LEASE_MS_MAX // 1000}]")
        return self._s.pin(self.namespace, _keys(keys), int(ttl * 1000))

    def unpin(self, keys: Sequence[Key]) -> int:
        """Ends the pins (and prefetch leases) of the blocks; how many were pinned."""
        return self._s.unpin(self.namespace, _keys(keys))

    def promote(self, keys: Sequence[Key]) -> dict[str, int]:
        """Moves the blocks to the fast tier (SLC) of every member holding them, ahead of
        use, as far as each member's move budget (``tier_move_bytes_per_s``) and its fast
        tier's room allow; returns ``{"promoted": moved now, "fast": in the fast tier
        now}``. A read meanwhile finds each block in one tier or the other, never misses.
        On members of one tier every present block counts as ``fast``. Pinned and
        prefetched blocks (and blocks read twice) are promoted without asking, when the
        member is idle. A large value (over 8 MiB) moves extent by extent: it counts as
        promoted once all of its extents are in the fast tier; until then (over the move
        budget) it counts in neither number, reads whole from both tiers, and the next
        call moves on."""
        promoted, fast = self._s.promote(self.namespace, _keys(keys))
        return {"promoted": promoted, "fast": fast}

    # -- caller memory --------------------------------------------------------------

    def register_buffer(self, obj: Any, size: int | None = None) -> Buffer:
        """Makes caller memory a region that prefetches push into. Who keeps it alive:

        - a writable buffer-protocol object (``bytearray``, a numpy array, ``memoryview``),
          C-contiguous: the SDK holds it and its buffer export until the buffer is
          unregistered and every ticket into it is done, so it cannot be resized or freed
          meanwhile (a bytearray's resize raises ``BufferError``). Blocks are pushed
          straight into it, no copy;
        - a CPU torch tensor (contiguous; pinned or not), or a numpy view of one
          (``tensor.numpy()``): the SDK holds the tensor and its storage, but torch can
          move a tensor's bytes under any reference (``resize_``, ``set_``,
          ``share_memory_``), so the buffer is *guarded*: blocks land in the SDK's memory
          and are copied into the tensor by the call that reports them landed (``wait``,
          ``wait_for``, ``poll``, ``ready``, ``progress``, ``await``, ``batch_get_into``),
          each use first checking that the tensor is where it was registered. A moved
          tensor raises ``InvalidRequest`` (naming the buffer and what changed), with
          nothing sent or written;
        - ``register_buffer(ptr, size)`` or ``register_buffer((ptr, size))``: raw memory
          the SDK cannot check; the caller keeps it valid and unmoved until
          :meth:`unregister_buffer` and the end of every ticket into it (Mooncake's
          ``register_buffer``). Blocks are pushed straight into it.

        Buffers may not overlap. Returns the :class:`Buffer`.
        """
        if isinstance(obj, tuple) and size is None and len(obj) == 2:
            obj, size = obj
        if isinstance(obj, int) and not isinstance(obj, bool):
            if size is None:
                raise InvalidRequest("register_buffer(ptr, size): give the size")
            ptr, size = _ints([obj, size], "pointer and size")
            if ptr == 0:
                raise InvalidRequest("a null pointer cannot be registered")
            native = self._s.register(None, ptr, size)
            b = Buffer(native, None)
        else:
            if size is not None:
                raise InvalidRequest("size goes with a pointer, not with an object")
            span = _tensor_span(obj)
            if span is not None:
                ptr, size, check = span
                native = self._s.register((obj, obj.untyped_storage()), ptr, size, ("a torch tensor", check))
            else:
                beneath = _tensor_beneath(obj)
                guard = None if beneath is None else ("a view of a torch tensor", _tensor_check(beneath, None))
                native = self._s.register(obj, None, None, guard)
            b = Buffer(native, obj)
        self._objs[b.id] = b
        return b

    def unregister_buffer(self, buffer: Buffer | int | Any) -> bool:
        """Stops using a buffer (the :class:`Buffer`, its object, or its address): no new
        call may name it; prefetches in flight still land, and the memory is let go once
        they are done. False if it was not registered."""
        b = self._find(buffer)
        if b is None:
            return False
        self._objs.pop(b.id, None)
        return self._s.unregister(b._b)

    def _find(self, buffer: Any) -> Buffer | None:
        if isinstance(buffer, Buffer):
            return buffer if buffer.id in self._objs else None
        for b in self._objs.values():
            if (isinstance(buffer, int) and b.ptr == buffer) or (b.obj is not None and b.obj is buffer):
                return b
        return None

    # -- prefetch and events ------------------------------------------------------

    def prefetch(
        self,
        keys: Sequence[Key],
        into: tuple[Any, Sequence[int]] | tuple[Sequence[int], Sequence[int]],
        *,
        sizes: Sequence[int] | None = None,
        policy: str = "wait_complete",
        deadline_ms: int | None = None,
        lease_ms: int = DEFAULT_LEASE_MS,
    ) -> Ticket:
        """Asks the pod to push blocks straight into registered memory, every member its
        own blocks at once; returns a :class:`Ticket` at once.

        ``into`` is ``(buffer, offsets)``: entry ``i`` lands at ``offsets[i]`` of a
        registered buffer (the :class:`Buffer` or its object), with room up to the next
        offset (or the buffer's end) unless ``sizes`` says otherwise; or ``(ptrs, sizes)``:
        addresses inside registered buffers (several buffers may be named).

        ``policy``: ``"wait_complete"`` (every block that exists, however long),
        ``"best_effort"`` (what is cheap now; the rest miss at once), ``"timeout"``
        (``deadline_ms`` required: blocks not pushed by then miss with -504).
        ``lease_ms``: how long the blocks stay leased on the nodes after the ticket ends
        (at most 60 s), so that decode finds them.
        """
        keys = _keys(keys)
        if not isinstance(into, tuple) or len(into) != 2:
            raise TypeError("into is (buffer, offsets) or (ptrs, sizes)")
        first, second = into
        buf = self._find(first)
        if buf is not None:
            offsets = _ints(second, "offsets")
            if sizes is None:
                # Room up to the next offset, or the buffer's end.
                ends = sorted(set(offsets)) + [buf.size]
                sizes = [max(min(e for e in ends if e > o) - o, 0) if o < buf.size else 0 for o in offsets]
            else:
                sizes = _ints(sizes, "sizes")
            ptrs = [buf.ptr + o for o in offsets]
        elif isinstance(first, (list, tuple)):
            ptrs = _ints(first, "pointers")
            sizes = _ints(second if sizes is None else sizes, "sizes")
        else:
            raise InvalidRequest(
                "prefetch into=(buffer, offsets) names a buffer that is not registered "
                "(register_buffer first; an unregistered buffer is no longer usable)"
            )
        if not (len(keys) == len(ptrs) == len(sizes)):
            raise InvalidRequest(f"{len(keys)} keys, {len(ptrs)} places and {len(sizes)} sizes")
        if policy not in POLICIES:
            raise InvalidRequest(f"policy {policy!r}: one of {', '.join(POLICIES)}")
        if deadline_ms is not None:
            (deadline_ms,) = _ints([deadline_ms], "deadline_ms")
        (lease_ms,) = _ints([lease_ms], "lease_ms")
        native = self._s.prefetch(self.namespace, keys, ptrs, sizes, policy, deadline_ms, lease_ms)
        return Ticket(native, keys)

    def prefetch_experts(
        self,
        layer_experts: Mapping[int, Iterable[int]],
        into: Mapping[int, Mapping[str, Any]],
        *,
        policy: str = "wait_complete",
        deadline_ms: int | None = None,
        lease_ms: int = DEFAULT_LEASE_MS,
    ) -> Ticket:
        """Stages the weights of the experts a router chose into registered engine memory,
        ahead of use: one :meth:`prefetch` for every shard of every expert named, from
        every member at once; returns its :class:`Ticket` at once.

        ``layer_experts`` maps a layer to the expert ids its router picked (top-k, for the
        next step or steps). ``into[layer]`` maps a shard name (``"gate_up_proj"``,
        ``"down_proj"``, …) to a registered buffer's object laid out expert-major, as fused
        MoE weights are (transformers' ``gate_up_proj``/``down_proj``, vLLM's ``w13``/``w2``):
        ``shape[0]`` experts of equal size, expert ``e``'s shard at byte ``e * nbytes //
        shape[0]``. Each shard is the value of key :func:`expert_key` ``(layer, e, shard)``
        in this store's namespace (a ``weights`` namespace: never evicted). The ticket's
        entries are the shards in that order (layers and experts as given, shards as
        ``into[layer]`` lists them); a shard the pod does not hold is ``-404`` in
        ``wait()``. ``policy``, ``deadline_ms`` and ``lease_ms`` are :meth:`prefetch`'s.
        """
        keys: list[bytes] = []
        ptrs: list[int] = []
        sizes: list[int] = []
        for layer, experts in layer_experts.items():
            regions = into.get(layer)
            if not regions:
                raise InvalidRequest(f"prefetch_experts: no regions given for layer {layer}")
            for e in experts:
                for shard, obj in regions.items():
                    buf = self._find(obj)
                    shape = getattr(obj, "shape", None)
                    if buf is None or not shape:
                        raise InvalidRequest(
                            f"prefetch_experts: layer {layer}'s {shard!r} is not a registered "
                            "tensor or array (register_buffer it first)"
                        )
                    if not 0 <= int(e) < shape[0]:
                        raise InvalidRequest(f"prefetch_experts: expert {e} of layer {layer}: it has {shape[0]}")
                    each = buf.size // shape[0]
                    keys.append(expert_key(layer, int(e), shard))
                    ptrs.append(buf.ptr + int(e) * each)
                    sizes.append(each)
        if not keys:
            raise InvalidRequest("prefetch_experts: no experts named")
        return self.prefetch(keys, (ptrs, sizes), policy=policy, deadline_ms=deadline_ms, lease_ms=lease_ms)

    def events(self, namespace: str | None = None) -> Events:
        """KV events (stored, evicted, deleted keys) of a namespace (this one by default)
        from every member, from now on."""
        return Events(self._s.subscribe(namespace or self.namespace))

    def busy_retries(self) -> int:
        """Requests sent again because a node answered BUSY."""
        return self._s.busy_retries()

    def direct_calls(self) -> int:
        """Calls answered on the calling thread over a direct connection (see
        ``direct_connections`` in :meth:`connect`)."""
        return self._s.direct_calls()

    # -- Mooncake Store's names -----------------------------------------------------

    def put_from(self, key: Key, ptr: int, size: int) -> int:
        """Mooncake's ``put_from``: stores ``size`` bytes at ``ptr`` (inside a registered
        buffer); 0, or a negative status."""
        return self.batch_put_from([key], [ptr], [size])[0]

    def batch_put_from(
        self, keys: Sequence[Key], ptrs: Sequence[int], sizes: Sequence[int], *, durable: bool = True
    ) -> list[int]:
        """Mooncake's ``batch_put_from``: per entry 0 (stored, or already stored), or a
        negative status. ``durable=False``: acknowledged before the device flush."""
        keys = _keys(keys)
        ptrs, sizes = _ints(ptrs, "pointers"), _ints(sizes, "sizes")
        sts = self._s.put_from(self.namespace, keys, ptrs, sizes, bool(durable))
        return [0 if _ok(s) else -s for s in sts]

    def is_exist(self, key: Key) -> int:
        """Mooncake's ``is_exist``: 1 held, 0 not."""
        return int(self.exists(key))

    def batch_is_exist(self, keys: Sequence[Key]) -> list[int]:
        """Mooncake's ``batch_is_exist``: per key 1 held, 0 not."""
        return [int(x) for x in self.batch_exists(keys)]

    def __repr__(self) -> str:
        return f"<ctxpod.Store namespace={self.namespace!r} members={len(self.members())}>"

