"""The one status table of the Triton backends: a failure is called the same whichever wire carried it.

The in-process ``triton`` backend (Triton's error codes through the binding), ``grpc://`` (gRPC status
codes) and ``http://`` (HTTP statuses) talk to the same server, so the same failure must raise the same
class of ``errors.py`` on each. Every foreign code is first read into one :class:`Status`, by code (never by
message text, with the one exception below), and :func:`to_public` makes the error the caller sees. The
table lives in the client layer, below the backends that use it, and imports neither the binding nor ``tritonclient``:
callers pass the code as they got it (a Triton code's name, a gRPC status name, an HTTP status number).
Each transport reads its wire's codes through it in one context manager (``client/transports/``).

    Status            Triton code          gRPC status                    HTTP          -> raised as
    UNAVAILABLE       UNAVAILABLE          UNAVAILABLE                    429 502 503   -> ServerUnavailableError
    MODEL_DOWN        INTERNAL, the Python backend's "stub not healthy" (below)       -> ServerUnavailableError
    DEADLINE          -                    DEADLINE_EXCEEDED              408 504       -> InferenceTimeoutError
    NOT_FOUND         NOT_FOUND            NOT_FOUND                      404           -> ModelNotFoundError
    INVALID_ARGUMENT  INVALID_ARG          INVALID_ARGUMENT, OUT_OF_RANGE,
                                           FAILED_PRECONDITION            400, any      -> InputValidationError
                                                                          other 4xx
    UNSUPPORTED       UNSUPPORTED          UNIMPLEMENTED                  501           -> ConfigError
    PERMISSION        -                    UNAUTHENTICATED,
                                           PERMISSION_DENIED              401 403       -> ConfigError
    TOO_LARGE         -                    RESOURCE_EXHAUSTED             413           -> InferenceError
    ALREADY_EXISTS    ALREADY_EXISTS       ALREADY_EXISTS                 409           -> InferenceError
    CANCELLED         CANCELLED            CANCELLED                      -             -> InferenceError
    INTERNAL          INTERNAL, UNKNOWN    every other code               every other   -> ServerInternalError
                                                                          5xx

An HTTP client error the table has no row for (MLServer answers a body it cannot read with 422 "Field
required"; a proxy may answer 405 or 411) is the request's fault, not the server's: ``INVALID_ARGUMENT``, so the
CLI exits 2 (bad input), not 4 (the server failed). Only a status of 500 and up is the server's own failure.

Triton's HTTP frontend folds ``UNKNOWN``, ``ALREADY_EXISTS`` and ``CANCELLED`` into 400 (``HttpCodeFromError``
in the server's ``http_server.cc``), so over HTTP those three read as ``INVALID_ARGUMENT``; :data:`TRITON_WIRE`
records how the server sends each Triton code, and a test holds the table to it.

The two readings of message text. Triton 2.51 reports a Python-backend stub that died (``os._exit``, a
segfault, the OOM killer) as ``INTERNAL`` "Stub process '<instance>' is not healthy." and gives no other
sign; the model stays READY and is not restarted. That is the model's server side being gone,
not the model failing on this input, so it is :attr:`Status.MODEL_DOWN`: a ``ServerUnavailableError`` on
every backend. The pattern is pinned by tests that kill a real stub on all three backends. And Triton 2.51
refuses a gRPC call of a restricted protocol (``--grpc-restricted-protocol``) whose key header is missing or
wrong with ``UNAVAILABLE`` "This protocol is restricted, expecting header '...'" (over HTTP it is a 403): a
refusal, not a server that is away, so it is :attr:`Status.PERMISSION` and never retried or waited out
(pinned by ``tests/backends/remote/test_auth.py`` against a real server).
"""

from __future__ import annotations

import enum
import re
import socket
from collections.abc import Mapping
from types import MappingProxyType

from ..errors import (
    ConfigError,
    InferenceError,
    InferenceTimeoutError,
    InputValidationError,
    ModelNotFoundError,
    MonaiTritonError,
    ServerInternalError,
    ServerUnavailableError,
)


class Status(enum.Enum):
    UNAVAILABLE = "unavailable"
    MODEL_DOWN = "model backend down"
    DEADLINE = "deadline exceeded"
    NOT_FOUND = "not found"
    INVALID_ARGUMENT = "invalid argument"
    UNSUPPORTED = "unsupported"
    PERMISSION = "permission denied"
    TOO_LARGE = "message too large"
    ALREADY_EXISTS = "already exists"
    CANCELLED = "cancelled"
    INTERNAL = "internal"


#: Where the in-process backend's errors say the model ran (the remote ones name the server's URL).
IN_PROCESS = "the in-process Triton server"

#: What the caller sees for each status. Every status has a class, and every class is a named one of errors.py.
ERROR_CLASSES: Mapping[Status, type[MonaiTritonError]] = MappingProxyType(
    {
        Status.UNAVAILABLE: ServerUnavailableError,
        Status.MODEL_DOWN: ServerUnavailableError,
        Status.DEADLINE: InferenceTimeoutError,
        Status.NOT_FOUND: ModelNotFoundError,
        Status.INVALID_ARGUMENT: InputValidationError,
        Status.UNSUPPORTED: ConfigError,
        Status.PERMISSION: ConfigError,
        Status.TOO_LARGE: InferenceError,
        Status.ALREADY_EXISTS: InferenceError,
        Status.CANCELLED: InferenceError,
        Status.INTERNAL: ServerInternalError,
    }
)

#: Statuses worth another attempt on the same server: it (or the path to it) may be fine a moment later.
#: ``MODEL_DOWN`` is not: Triton 2.51 never restarts a dead stub (another server may still serve the model).
TRANSIENT = frozenset({Status.UNAVAILABLE})

#: ``TRITONSERVER_Error_Code`` names (``bindings.TRITONSERVER_Error_Code``) -> status.
TRITON: Mapping[str, Status] = MappingProxyType(
    {
        "UNKNOWN": Status.INTERNAL,
        "INTERNAL": Status.INTERNAL,
        "NOT_FOUND": Status.NOT_FOUND,
        "INVALID_ARG": Status.INVALID_ARGUMENT,
        "UNAVAILABLE": Status.UNAVAILABLE,
        "UNSUPPORTED": Status.UNSUPPORTED,
        "ALREADY_EXISTS": Status.ALREADY_EXISTS,
        "CANCELLED": Status.CANCELLED,
    }
)
#: gRPC status names (``grpc.StatusCode``) -> status; any other name is ``INTERNAL``.
GRPC: Mapping[str, Status] = MappingProxyType(
    {
        "UNAVAILABLE": Status.UNAVAILABLE,
        "DEADLINE_EXCEEDED": Status.DEADLINE,
        "NOT_FOUND": Status.NOT_FOUND,
        "INVALID_ARGUMENT": Status.INVALID_ARGUMENT,
        "OUT_OF_RANGE": Status.INVALID_ARGUMENT,
        "FAILED_PRECONDITION": Status.INVALID_ARGUMENT,
        "UNIMPLEMENTED": Status.UNSUPPORTED,
        "UNAUTHENTICATED": Status.PERMISSION,
        "PERMISSION_DENIED": Status.PERMISSION,
        "RESOURCE_EXHAUSTED": Status.TOO_LARGE,
        "ALREADY_EXISTS": Status.ALREADY_EXISTS,
        "CANCELLED": Status.CANCELLED,
    }
)
#: HTTP statuses -> status; any other 4xx is ``INVALID_ARGUMENT`` (the request's fault), any other status
#: ``INTERNAL`` (a server-side failure).
HTTP: Mapping[int, Status] = MappingProxyType(
    {
        400: Status.INVALID_ARGUMENT,
        401: Status.PERMISSION,
        403: Status.PERMISSION,
        404: Status.NOT_FOUND,
        408: Status.DEADLINE,
        409: Status.ALREADY_EXISTS,
        413: Status.TOO_LARGE,
        429: Status.UNAVAILABLE,
        501: Status.UNSUPPORTED,
        502: Status.UNAVAILABLE,
        503: Status.UNAVAILABLE,
        504: Status.DEADLINE,
    }
)
#: How Triton's own frontends send each of its codes (server ``grpc/grpc_utils.cc``, ``http_server.cc``).
TRITON_WIRE: Mapping[str, tuple[str, int]] = MappingProxyType(
    {
        "UNKNOWN": ("UNKNOWN", 400),
        "INTERNAL": ("INTERNAL", 500),
        "NOT_FOUND": ("NOT_FOUND", 404),
        "INVALID_ARG": ("INVALID_ARGUMENT", 400),
        "UNAVAILABLE": ("UNAVAILABLE", 503),
        "UNSUPPORTED": ("UNIMPLEMENTED", 501),
        "ALREADY_EXISTS": ("ALREADY_EXISTS", 400),
        "CANCELLED": ("CANCELLED", 400),
    }
)

# python_backend r24.10 src/python_be.cc: "Stub process '<model>_<group>_<index>' is not healthy." (also without
# the name), and "Failed to obtain the health mutex." when the stub died holding it.
_STUB_DOWN = re.compile(r"Stub process (?:'[^']*' )?is not healthy|Failed to obtain the health mutex")
# server r24.10 src/grpc/grpc_server.cc: "This protocol is restricted, expecting header '<prefix><key>'".
_RESTRICTED = re.compile(r"^This protocol is restricted, expecting header '")


class CallError(Exception):
    """One failed call, normalised: what went wrong (``status``) and the server's own words (``message``)."""

    def __init__(self, status: Status, message: str) -> None:
        super().__init__(f"[{status.value}] {message}")
        self.status = status
        self.message = message

    @property
    def transient(self) -> bool:
        return self.status in TRANSIENT


def from_triton_code(code: str | int, message: str) -> CallError:
    """``code`` as the binding gives it: a ``TRITONSERVER_Error_Code`` (its ``.name``) or that name."""
    name = code if isinstance(code, str) else getattr(code, "name", "")
    return _refined(TRITON.get(name, Status.INTERNAL), message)


def from_grpc_status(code: str | None, message: str) -> CallError:
    """``code`` as tritonclient gives it (``"StatusCode.UNAVAILABLE"``) or the bare name."""
    name = (code or "").rsplit(".", 1)[-1]
    return _refined(GRPC.get(name, Status.INTERNAL), message)


def from_http_status(code: str | int | None, message: str) -> CallError:
    """``code`` as tritonclient gives it (``"404"``); an unlisted 4xx is the caller's bad request, anything else
    unlisted a server-side failure."""
    try:
        number = int(code) if code is not None else 500
    except ValueError:
        number = 500
    unlisted = Status.INVALID_ARGUMENT if 400 <= number < 500 else Status.INTERNAL
    return _refined(HTTP.get(number, unlisted), message)


def from_os_error(exc: OSError) -> CallError:
    """Socket-level failures: a timeout is a deadline, everything else (refused, reset, DNS) is unavailable."""
    if isinstance(exc, TimeoutError | socket.timeout):
        return CallError(Status.DEADLINE, str(exc) or "timed out")
    return CallError(Status.UNAVAILABLE, f"{type(exc).__name__}: {exc}")


def _refined(status: Status, message: str) -> CallError:
    if status is Status.INTERNAL and _STUB_DOWN.search(message):
        return CallError(Status.MODEL_DOWN, message)
    if status is Status.UNAVAILABLE and _RESTRICTED.search(message):
        return CallError(Status.PERMISSION, message)
    return CallError(status, message)


def to_public(error: CallError, *, model: str, url: str, waited_s: float | None = None) -> MonaiTritonError:
    """The error the caller sees for ``error``: the table's class, naming the model and the server (``url``)."""
    return public_error(error, f"model {model!r} on {url}", waited_s=waited_s)


def public_error(error: CallError, where: str, *, waited_s: float | None = None) -> MonaiTritonError:
    """The table's class for ``error``, its message beginning with ``where`` (what was asked of which server)."""
    cls = ERROR_CLASSES[error.status]
    return cls(f"{where}: {_explained(error, waited_s)}")


def _explained(error: CallError, waited_s: float | None) -> str:
    status, message = error.status, error.message
    if status is Status.UNAVAILABLE:
        return f"server unavailable: {message}"
    if status is Status.MODEL_DOWN:
        return (
            f"the model's backend process is gone ({message}); Triton does not restart it: reload the model "
            "or restart the server"
        )
    if status is Status.DEADLINE:
        waited = f" within {waited_s:.3g} s" if waited_s is not None else ""
        return f"no answer{waited} (deadline exceeded): {message}"
    if status is Status.NOT_FOUND:
        return f"not found: {message}"
    if status is Status.INVALID_ARGUMENT:
        return f"the server refused the request: {message}"
    if status is Status.UNSUPPORTED:
        return f"the server does not support this request: {message}"
    if status is Status.PERMISSION:
        return (
            f"the server refused access ({message}); check the credentials this client sends: auth_token, "
            "restricted_keys (a Triton restricted protocol's key, missing or wrong), headers"
        )
    if status is Status.TOO_LARGE:
        return f"message too large ({message}); use shared_memory=system on this host, or smaller batches"
    if status is Status.CANCELLED:
        return f"the request was cancelled: {message}"
    if status is Status.INTERNAL:
        return f"the server failed on the request (its own or its model's internal error; its log says why): {message}"
    return f"{status.value} error: {message}"
