"""What every engine connector shares: a pod connection from the engine's own configuration
(plain mappings of strings, as engines pass their extra-config dicts), and namespaces named
after what must never share a block (the model, its dtype and parallel layout, the tenant's
cache salt), created on first use."""

from __future__ import annotations

import hashlib
import re
import threading
from collections.abc import Mapping
from typing import Any

from .. import errors
from .._store import Store

#: Longest namespace name (``[a-z0-9][a-z0-9._-]{0,62}``).
NAMESPACE_CHARS_MAX = 63

#: The settings a connector reads, and what each is.
SETTINGS = {
    "url": "node URL(s) of the pod, comma-separated: http://host:7400 or https://host:7400",
    "token": "a bearer token (`ctxpod token create`)",
    "token_file": "a file holding the token (its first line), instead of `token`",
    "ca_file": "the CA bundle that signed the nodes' certificates (https URLs)",
    "cert_file": "a client certificate (mTLS)",
    "key_file": "the client certificate's key (mTLS)",
    "namespace_prefix": "the first part of every namespace the connector uses",
    "replication": "copies of each block in namespaces the connector creates (default: the pod's)",
    "connect_timeout": "seconds to open a connection to a member (default 2)",
    "request_timeout": "seconds one request may take before its member counts as unreachable (default 10)",
    "down_for": "seconds a member that missed a deadline is asked last (default 10)",
}

#: The settings that are deadlines, in seconds (:meth:`ctxpod.Store.connect`).
DEADLINES = ("connect_timeout", "request_timeout", "down_for")


def seconds(v: Any, name: str, who: str) -> float:
    """A deadline setting: a number of seconds above 0, at most an hour (engines pass
    numbers or strings)."""
    try:
        s = float(v)
    except (TypeError, ValueError):
        raise errors.InvalidRequest(f"{who}: `{name}` is a number of seconds, not {v!r}") from None
    if isinstance(v, bool) or not 0 < s <= 3600:
        raise errors.InvalidRequest(f"{who}: `{name}` must be above 0 and at most 3600 seconds; got {v!r}")
    return s


def check_known(settings: Mapping[str, Any], known: Mapping[str, str], who: str,
                engine_keys: frozenset[str] = frozenset()) -> None:
    """Refuses a setting the connector does not know (a typo would otherwise be ignored).
    ``engine_keys``: the engine's own keys in the same mapping, which are not the
    connector's settings but are not errors either."""
    unknown = sorted(set(settings) - set(known) - engine_keys)
    if unknown:
        raise errors.InvalidRequest(f"{who}: unknown setting(s) {unknown} (known: {', '.join(sorted(known))})")


def setting(settings: Mapping[str, Any], name: str, default: Any = None) -> Any:
    """A setting's value, ``default`` when absent or empty."""
    v = settings.get(name)
    return default if v is None or v == "" else v


def flag(v: Any, name: str) -> bool:
    """A true/false setting (engines pass JSON booleans, numbers or strings)."""
    if isinstance(v, bool):
        return v
    if isinstance(v, (int, str)) and str(v).lower() in ("true", "1", "yes", "false", "0", "no"):
        return str(v).lower() in ("true", "1", "yes")
    raise errors.InvalidRequest(f"{name}: true or false, not {v!r}")


def connect(settings: Mapping[str, Any], *, who: str) -> Store:
    """A :class:`Store` from a connector's settings (see :data:`SETTINGS`). ``who`` names
    the connector in errors: a missing or malformed setting is an ``InvalidRequest`` that
    says which, before anything is sent."""
    url = setting(settings, "url")
    if not isinstance(url, str):
        raise errors.InvalidRequest(f"{who}: set `url` to the pod's node URL(s), e.g. http://10.0.0.5:7400")
    seeds = [u.strip() for u in url.split(",") if u.strip()]
    token = setting(settings, "token")
    token_file = setting(settings, "token_file")
    if token is not None and token_file is not None:
        raise errors.InvalidRequest(f"{who}: set `token` or `token_file`, not both")
    if token_file is not None:
        try:
            with open(token_file, encoding="utf-8") as f:
                token = f.readline().strip()
        except OSError as e:
            raise errors.InvalidRequest(f"{who}: token_file {token_file!r}: {e}") from None
        if not token:
            raise errors.InvalidRequest(f"{who}: token_file {token_file!r} is empty")
    if token is not None and not isinstance(token, str):
        raise errors.InvalidRequest(f"{who}: `token` is a string")
    deadlines = {n: seconds(setting(settings, n), n, who) for n in DEADLINES if setting(settings, n) is not None}
    try:
        return Store.connect(
            seeds,
            token=token,
            ca_file=setting(settings, "ca_file"),
            cert_file=setting(settings, "cert_file"),
            key_file=setting(settings, "key_file"),
            **deadlines,
        )
    except errors.ProtocolError as e:
        # Something answered at `url`, but not as a ctxpod node (another HTTP service, the
        # S3 door's port): a bad setting, named.
        raise errors.InvalidRequest(f"{who}: url {url!r}: {e}") from e


def value_limit(store: Store) -> int:
    """The largest value the pod stores (the least ``value_bytes_max`` of its members),
    which every value a connector sends must fit: asked when the connector is built."""
    return store.value_bytes_max


def over_limit(value: int, limit: int) -> str:
    """How a connector says its engine's values are over the pod's limit, and what to do."""
    return (
        f"over the pod's value limit of {limit} bytes (the least value_bytes_max of its nodes; "
        f"raise it there, up to {VALUE_BYTES_MAX_SETTING} bytes) by {value - limit} bytes: every value "
        f"would be refused and every lookup would miss."
    )


# The highest value_bytes_max a node may be set to (1 GiB).
VALUE_BYTES_MAX_SETTING = 1 << 30

_SLUG = re.compile(r"[^a-z0-9]+")


def namespace_name(prefix: str, *identity: Any) -> str:
    """A namespace for one identity (model, dtype, layout, salt, ...): the prefix, a readable
    slug of the first part, and 16 hex digits of SHA-256 over every part, so two identities
    share a namespace only if every part is equal."""
    if not isinstance(prefix, str) or not re.fullmatch(r"[a-z0-9][a-z0-9-]{0,15}", prefix):
        raise errors.InvalidRequest(f"namespace_prefix {prefix!r}: [a-z0-9][a-z0-9-]{{0,15}}")
    digest = hashlib.sha256("\x00".join(repr(p) for p in identity).encode()).hexdigest()[:16]
    slug = _SLUG.sub("-", str(identity[0]).lower()).strip("-") if identity else ""
    room = NAMESPACE_CHARS_MAX - len(prefix) - len(digest) - 2
    slug = slug[:room].strip("-")
    return f"{prefix}-{slug}-{digest}" if slug else f"{prefix}-{digest}"


class Namespaces:
    """Stores by namespace over one connection, each namespace created the first time it is
    used (with ``replication`` copies, if set): thread-safe."""

    def __init__(self, store: Store, replication: int | None = None) -> None:
        self.store = store
        self.replication = replication
        self._ready: dict[str, Store] = {}
        self._lock = threading.Lock()

    def get(self, namespace: str) -> Store:
        s = self._ready.get(namespace)
        if s is not None:
            return s
        with self._lock:
            s = self._ready.get(namespace)
            if s is None:
                s = self.store.with_namespace(namespace)
                try:
                    s.namespace_info()
                except errors.NotFound:
                    s.create_namespace(replication=self.replication)
                self._ready[namespace] = s
            return s
