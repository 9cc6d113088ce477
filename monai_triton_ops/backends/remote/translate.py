"""Foreign errors -> one status -> our error tree: translated once, by status code, never by message text.

Transports turn whatever ``tritonclient`` (gRPC status codes, HTTP status codes, socket errors, gevent
timeouts) raises into a :class:`CallError` carrying a :class:`Status`. The backend decides on the status
alone (retry, fall back, give up) and :func:`to_public` makes the error the caller sees::

    Status.UNAVAILABLE        gRPC UNAVAILABLE, HTTP 503/429, refused/reset  -> retried, then ServerUnavailableError
    Status.DEADLINE           gRPC DEADLINE_EXCEEDED, HTTP 504, gevent timeout -> InferenceTimeoutError
    Status.NOT_FOUND          gRPC NOT_FOUND, HTTP 404                      -> ModelNotFoundError
    Status.INVALID_ARGUMENT   gRPC INVALID_ARGUMENT/OUT_OF_RANGE, HTTP 400  -> InputValidationError
    Status.ALREADY_EXISTS     gRPC ALREADY_EXISTS, HTTP 409                 -> InferenceError (shm names)
    Status.PERMISSION         UNAUTHENTICATED/PERMISSION_DENIED, HTTP 401/403 -> ConfigError
    Status.TOO_LARGE          RESOURCE_EXHAUSTED, HTTP 413                  -> InferenceError with a hint
    Status.CANCELLED          CANCELLED                                     -> InferenceError
    Status.INTERNAL           INTERNAL/UNKNOWN/others, HTTP 500            -> InferenceError (never retried)
"""

from __future__ import annotations

import enum
import socket
from typing import Any

from ...errors import (
    ConfigError,
    InferenceError,
    InferenceTimeoutError,
    InputValidationError,
    ModelNotFoundError,
    MonaiTritonError,
    ServerUnavailableError,
)


class Status(enum.Enum):
    UNAVAILABLE = "unavailable"
    DEADLINE = "deadline exceeded"
    NOT_FOUND = "not found"
    INVALID_ARGUMENT = "invalid argument"
    ALREADY_EXISTS = "already exists"
    PERMISSION = "permission denied"
    TOO_LARGE = "message too large"
    CANCELLED = "cancelled"
    INTERNAL = "internal"


#: Statuses worth another attempt: the server (or the path to it) may be fine a moment later.
TRANSIENT = frozenset({Status.UNAVAILABLE})

_GRPC: dict[str, Status] = {
    "UNAVAILABLE": Status.UNAVAILABLE,
    "DEADLINE_EXCEEDED": Status.DEADLINE,
    "NOT_FOUND": Status.NOT_FOUND,
    "INVALID_ARGUMENT": Status.INVALID_ARGUMENT,
    "OUT_OF_RANGE": Status.INVALID_ARGUMENT,
    "FAILED_PRECONDITION": Status.INVALID_ARGUMENT,
    "ALREADY_EXISTS": Status.ALREADY_EXISTS,
    "UNAUTHENTICATED": Status.PERMISSION,
    "PERMISSION_DENIED": Status.PERMISSION,
    "RESOURCE_EXHAUSTED": Status.TOO_LARGE,
    "CANCELLED": Status.CANCELLED,
}
_HTTP: dict[int, Status] = {
    400: Status.INVALID_ARGUMENT,
    401: Status.PERMISSION,
    403: Status.PERMISSION,
    404: Status.NOT_FOUND,
    408: Status.DEADLINE,
    409: Status.ALREADY_EXISTS,
    413: Status.TOO_LARGE,
    429: Status.UNAVAILABLE,
    502: Status.UNAVAILABLE,
    503: Status.UNAVAILABLE,
    504: Status.DEADLINE,
}


class CallError(Exception):
    """One failed call, normalised: what went wrong (``status``) and the server's own words (``message``)."""

    def __init__(self, status: Status, message: str) -> None:
        super().__init__(f"[{status.value}] {message}")
        self.status = status
        self.message = message

    @property
    def transient(self) -> bool:
        return self.status in TRANSIENT


def from_grpc_status(code: str | None, message: str) -> CallError:
    """``code`` as tritonclient gives it (``"StatusCode.UNAVAILABLE"``)."""
    name = (code or "").rsplit(".", 1)[-1]
    return CallError(_GRPC.get(name, Status.INTERNAL), message)


def from_http_status(code: str | int | None, message: str) -> CallError:
    """``code`` as tritonclient gives it (``"404"``); anything not listed is a server-side failure."""
    try:
        number = int(code) if code is not None else 500
    except ValueError:
        number = 500
    return CallError(_HTTP.get(number, Status.INTERNAL), message)


def from_os_error(exc: OSError) -> CallError:
    """Socket-level failures: a timeout is a deadline, everything else (refused, reset, DNS) is unavailable."""
    if isinstance(exc, TimeoutError | socket.timeout):
        return CallError(Status.DEADLINE, str(exc) or "timed out")
    return CallError(Status.UNAVAILABLE, f"{type(exc).__name__}: {exc}")


def to_public(error: CallError, *, model: str, url: str, waited_s: float | None = None) -> MonaiTritonError:
    """The error the caller sees for ``error``, naming the model and the server."""
    where = f"model {model!r} on {url}"
    status = error.status
    if status is Status.UNAVAILABLE:
        return ServerUnavailableError(f"{where}: server unavailable: {error.message}")
    if status is Status.DEADLINE:
        waited = f" within {waited_s:.3g} s" if waited_s is not None else ""
        return InferenceTimeoutError(f"{where}: no answer{waited} (deadline exceeded): {error.message}")
    if status is Status.NOT_FOUND:
        return ModelNotFoundError(f"{where}: not found: {error.message}")
    if status is Status.INVALID_ARGUMENT:
        return InputValidationError(f"{where}: the server refused the request: {error.message}")
    if status is Status.PERMISSION:
        return ConfigError(f"{where}: the server refused access ({error.message}); check credentials and headers")
    if status is Status.TOO_LARGE:
        return InferenceError(
            f"{where}: message too large ({error.message}); use shared_memory=system on this host, or smaller batches"
        )
    if status is Status.CANCELLED:
        return InferenceError(f"{where}: the request was cancelled: {error.message}")
    return InferenceError(f"{where}: {status.value} error: {error.message}")


def describe(exc: Any) -> str:
    """A short text for logs of any exception."""
    return f"{type(exc).__name__}: {exc}"
