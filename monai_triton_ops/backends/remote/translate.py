"""Foreign errors -> one status -> our error tree, for the remote transports: the table is ``backends/status.py``.

Transports turn whatever ``tritonclient`` raises (gRPC status codes, HTTP status codes, socket errors, gevent
timeouts) into a :class:`CallError` carrying a :class:`Status`; the backend decides on the status alone
(retry, fall back, give up) and :func:`to_public` makes the error the caller sees. The mapping itself is
shared with the in-process backend, so one table names every failure the same on every Triton backend;
these names stay importable from here.
"""

from __future__ import annotations

from typing import Any

from ..status import TRANSIENT as TRANSIENT
from ..status import CallError as CallError
from ..status import Status as Status
from ..status import from_grpc_status as from_grpc_status
from ..status import from_http_status as from_http_status
from ..status import from_os_error as from_os_error
from ..status import to_public as to_public


def describe(exc: Any) -> str:
    """A short text for logs of any exception."""
    return f"{type(exc).__name__}: {exc}"
