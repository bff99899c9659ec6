"""Exceptions of the ctxpod SDK.

Every failure of a whole call raises a subclass of :class:`CtxpodError`, with
``status`` set to the node's HTTP-like status when the node refused the call
(``None`` for failures on the client side: a bad argument, a connection that
could not be made). Each class also derives from the built-in exception a
Python caller would expect (``ValueError`` for bad input, ``ConnectionError``
when no node can be reached, ``TimeoutError`` past a deadline, ...).

Batch calls do not raise for one entry: they return a code per entry (see
``docs/PYTHON.md``, "Per-entry codes").
"""

from __future__ import annotations


class CtxpodError(Exception):
    """Base class of every ctxpod exception."""

    #: The node's status (400, 401, 403, 404, 409, 413, 422, 429, 503, 504, 507, ...),
    #: or ``None`` when the failure is on the client's side.
    status: int | None

    def __init__(self, message: str, status: int | None = None) -> None:
        super().__init__(message)
        self.status = status

    def __reduce__(self):  # picklable, for multiprocessing workers
        return (type(self), (str(self), self.status))


class InvalidRequest(CtxpodError, ValueError):
    """Bad input: a malformed key or namespace, a buffer that cannot be used, mismatched
    list lengths, a pointer outside every registered buffer (400)."""


class Unauthorized(CtxpodError, PermissionError):
    """No valid credentials: the node requires a token (or the token was refused) (401)."""


class Forbidden(CtxpodError, PermissionError):
    """The credentials do not allow this call (a read-only token writing, another
    tenant's namespace) (403)."""


class NotFound(CtxpodError, LookupError):
    """No such block, namespace or ticket (404)."""


class Conflict(CtxpodError):
    """The call conflicts with the node's state (409)."""


class TooLarge(CtxpodError, ValueError):
    """A block over the node's limit, a frame over the connection's, or a buffer too
    small for the block (413)."""


class Corrupt(CtxpodError):
    """A block failed its CRC32C check (422): nothing was stored, or the copy read was
    not used."""


class RateLimited(CtxpodError):
    """The tenant's request rate is spent: retry later (429)."""


class Cancelled(CtxpodError):
    """The prefetch was cancelled (499)."""


class Busy(CtxpodError):
    """Back-pressure: the node stayed busy through the client's retries; retry later (503)."""


class DeadlineExceeded(CtxpodError, TimeoutError):
    """Past the call's deadline (504)."""


class NoSpace(CtxpodError):
    """The node (or the tenant's quota) is out of space (507)."""


class Unavailable(CtxpodError, ConnectionError):
    """No node could be reached, or the connection closed (TLS failures included)."""


class ProtocolError(CtxpodError):
    """A node answered something the SDK does not understand (a version mismatch), or
    something that is not a ctxpod node answered at a seed URL (the message names it)."""


class Ended(CtxpodError):
    """An event stream ended (its namespace was deleted, or every connection closed)."""


_BY_STATUS: dict[int, type[CtxpodError]] = {
    400: InvalidRequest,
    401: Unauthorized,
    403: Forbidden,
    404: NotFound,
    409: Conflict,
    413: TooLarge,
    422: Corrupt,
    429: RateLimited,
    499: Cancelled,
    503: Busy,
    504: DeadlineExceeded,
    507: NoSpace,
}


def from_status(status: int, message: str | None = None) -> CtxpodError:
    """The exception for a node's status (a per-entry code's absolute value)."""
    cls = _BY_STATUS.get(status, CtxpodError)
    return cls(message or f"the node answered {status}", status)


__all__ = [
    "CtxpodError",
    "InvalidRequest",
    "Unauthorized",
    "Forbidden",
    "NotFound",
    "Conflict",
    "TooLarge",
    "Corrupt",
    "RateLimited",
    "Cancelled",
    "Busy",
    "DeadlineExceeded",
    "NoSpace",
    "Unavailable",
    "ProtocolError",
    "Ended",
    "from_status",
]
