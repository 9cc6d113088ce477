"""The one status table: every code of every wire maps to a named class, and the wires agree where they can.

As httpx tests its exception map, every foreign code is enumerated from its own source of truth (the
binding's ``TRITONSERVER_Error_Code``, ``grpc.StatusCode``, ``http.HTTPStatus``), so a code added there and
forgotten here fails. What the real server sends for each failure is checked end to end by the contract
suite (``test_contract.py``); here, the table itself.
"""

from __future__ import annotations

import http

import grpc
import pytest

from monai_triton_ops import errors, exits
from monai_triton_ops.bindings.enums import TRITONSERVER_Error_Code
from monai_triton_ops.client import status
from monai_triton_ops.client.status import Status

NAMED = {
    value
    for name, value in vars(errors).items()
    if isinstance(value, type) and issubclass(value, errors.MonaiTritonError) and not name.startswith("_")
}
#: What a dead Python-backend stub says on Triton 2.51 (python_backend src/python_be.cc), seen on all three wires.
STUB_DOWN = "Stub process 'crashing_0_0' is not healthy."
#: Codes Triton's HTTP frontend sends as 400 (information the HTTP wire loses).
HTTP_FOLDED = {"UNKNOWN", "ALREADY_EXISTS", "CANCELLED"}


def _named(cls: type[BaseException]) -> bool:
    return cls in NAMED and cls is not errors.MonaiTritonError


def test_every_status_has_a_named_class_of_the_tree() -> None:
    assert set(status.ERROR_CLASSES) == set(Status)
    for cls in status.ERROR_CLASSES.values():
        assert _named(cls), cls


@pytest.mark.parametrize("code", list(TRITONSERVER_Error_Code), ids=lambda c: c.name)
def test_every_triton_error_code_maps_to_a_named_class(code: TRITONSERVER_Error_Code) -> None:
    assert code.name in status.TRITON, f"TRITONSERVER_ERROR_{code.name} is not in the table"
    assert code.name in status.TRITON_WIRE, f"how Triton sends TRITONSERVER_ERROR_{code.name} is not recorded"
    error = status.from_triton_code(code, "text")
    assert error.status is status.TRITON[code.name]
    assert _named(type(status.to_public(error, model="m", url=status.IN_PROCESS)))


@pytest.mark.parametrize("code", [c for c in grpc.StatusCode if c is not grpc.StatusCode.OK], ids=lambda c: c.name)
def test_every_grpc_status_maps_to_a_named_class(code: grpc.StatusCode) -> None:
    error = status.from_grpc_status(str(code), "text")  # tritonclient's form: "StatusCode.UNAVAILABLE"
    assert error.status is status.GRPC.get(code.name, Status.INTERNAL)
    assert status.from_grpc_status(code.name, "text").status is error.status
    assert _named(type(status.to_public(error, model="m", url="grpc://h:1")))


@pytest.mark.parametrize("code", [c for c in http.HTTPStatus if c >= 400], ids=lambda c: str(c.value))
def test_every_http_error_status_maps_to_a_named_class(code: http.HTTPStatus) -> None:
    """A listed status reads as its row; an unlisted client error (4xx) is the request's fault (exit 2), an unlisted
    server error (5xx) the server's (exit 4)."""
    error = status.from_http_status(str(code.value), "text")  # tritonclient's form: "404"
    unlisted = Status.INVALID_ARGUMENT if code < 500 else Status.INTERNAL
    assert error.status is status.HTTP.get(code.value, unlisted)
    public = status.to_public(error, model="m", url="http://h:1")
    assert _named(type(public))
    if code.value not in status.HTTP:
        assert exits.exit_code(public) == (exits.USAGE if code < 500 else exits.SERVER_FAILED)


def test_the_table_knows_only_real_codes() -> None:
    assert set(status.TRITON) == {c.name for c in TRITONSERVER_Error_Code}
    assert set(status.GRPC) <= {c.name for c in grpc.StatusCode}
    assert set(status.HTTP) <= {c.value for c in http.HTTPStatus}


@pytest.mark.parametrize("code", list(TRITONSERVER_Error_Code), ids=lambda c: c.name)
def test_a_triton_error_is_the_same_class_in_process_and_over_grpc_and_http(code: TRITONSERVER_Error_Code) -> None:
    """The server turns its code into a gRPC status and an HTTP status; each wire must land on the same class."""
    grpc_name, http_status = status.TRITON_WIRE[code.name]
    in_process = status.to_public(status.from_triton_code(code, "x"), model="m", url=status.IN_PROCESS)
    over_grpc = status.to_public(status.from_grpc_status(grpc_name, "x"), model="m", url="grpc://h:1")
    over_http = status.to_public(status.from_http_status(http_status, "x"), model="m", url="http://h:1")
    assert type(over_grpc) is type(in_process)
    if code.name in HTTP_FOLDED:  # Triton's HTTP frontend sends these as 400: all HTTP can say is "bad request"
        assert http_status == 400
        assert isinstance(over_http, errors.InputValidationError)
    else:
        assert type(over_http) is type(in_process)


def test_a_dead_stub_is_server_unavailable_on_every_wire_and_not_retried() -> None:
    for error in (
        status.from_triton_code(TRITONSERVER_Error_Code.INTERNAL, STUB_DOWN),
        status.from_grpc_status("StatusCode.INTERNAL", STUB_DOWN),
        status.from_http_status("500", STUB_DOWN),
        status.from_grpc_status("StatusCode.INTERNAL", "Failed to obtain the health mutex."),
    ):
        assert error.status is Status.MODEL_DOWN
        assert not error.transient  # 2.51 never restarts the stub: resending to this server cannot help
        public = status.to_public(error, model="crashing", url="grpc://h:1")
        assert isinstance(public, errors.ServerUnavailableError)
        assert isinstance(public, ConnectionError)
        assert STUB_DOWN in str(public) or "health mutex" in str(public)
        assert exits.exit_code(public) == exits.UNAVAILABLE


def test_the_stub_text_refines_only_an_internal_error() -> None:
    """By code first: the same words under another code (a model echoing them, a bad request) keep that code."""
    assert status.from_triton_code("INVALID_ARG", STUB_DOWN).status is Status.INVALID_ARGUMENT
    assert status.from_http_status(404, STUB_DOWN).status is Status.NOT_FOUND
    assert status.from_grpc_status("StatusCode.INTERNAL", "deliberate model error").status is Status.INTERNAL


def test_unknown_codes_are_a_server_side_failure() -> None:
    assert status.from_triton_code(99, "x").status is Status.INTERNAL
    assert status.from_grpc_status(None, "x").status is Status.INTERNAL
    assert status.from_http_status("teapot", "x").status is Status.INTERNAL
    assert status.from_http_status(None, "x").status is Status.INTERNAL


def test_socket_failures() -> None:
    assert status.from_os_error(TimeoutError("timed out")).status is Status.DEADLINE
    assert status.from_os_error(ConnectionRefusedError(111, "refused")).status is Status.UNAVAILABLE
    assert status.from_os_error(ConnectionRefusedError(111, "refused")).transient


@pytest.mark.parametrize(
    ("state", "cls", "words"),
    [
        (Status.UNAVAILABLE, errors.ServerUnavailableError, "server unavailable: why"),
        (Status.DEADLINE, errors.InferenceTimeoutError, "no answer within 1.5 s (deadline exceeded): why"),
        (Status.NOT_FOUND, errors.ModelNotFoundError, "not found: why"),
        (Status.INVALID_ARGUMENT, errors.InputValidationError, "the server refused the request: why"),
        (Status.UNSUPPORTED, errors.ConfigError, "the server does not support this request: why"),
        (Status.PERMISSION, errors.ConfigError, "the server refused access (why)"),
        (Status.TOO_LARGE, errors.InferenceError, "message too large (why)"),
        (Status.CANCELLED, errors.InferenceError, "the request was cancelled: why"),
        (Status.ALREADY_EXISTS, errors.InferenceError, "already exists error: why"),
        (Status.INTERNAL, errors.ServerInternalError, "the server failed on the request (its own or its model's"),
    ],
    ids=lambda v: v.name if isinstance(v, Status) else "",
)
def test_the_public_error_names_model_and_server(state: Status, cls: type[Exception], words: str) -> None:
    error = status.to_public(status.CallError(state, "why"), model="seg", url="grpc://h:1", waited_s=1.5)
    assert type(error) is cls
    assert str(error).startswith(f"model 'seg' on grpc://h:1: {words}")
