"""Inference through the binding alone: data in and out exactly, buffer lifetimes, allocators, callbacks."""

from __future__ import annotations

import concurrent.futures
import contextlib
import ctypes
import gc
import json
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

from monai_triton_ops import bindings as b
from monai_triton_ops.bindings import allocator as allocator_module

from .. import triton_models
from .harness import Outcome, Started, infer, make_request, submit

pytestmark = pytest.mark.triton
MIXED = ("TYPE_FP32", "TYPE_INT64", "TYPE_UINT8", "TYPE_BOOL")


@pytest.fixture(scope="module")
def started(make_server: Callable[..., Started], tmp_path_factory: pytest.TempPathFactory) -> Started:
    repo = tmp_path_factory.mktemp("inference") / "repo"
    triton_models.passthrough(repo)
    triton_models.identity(repo, "mixed", dtypes=MIXED, dims=(-1, -1))
    triton_models.empty_output(repo)
    triton_models.dynamic_output(repo)
    triton_models.raising(repo)
    triton_models.guard_numpy(repo)
    triton_models.passthrough(repo, "slow", delay_s=0.3)
    triton_models.passthrough(repo, "labeled")
    config = repo / "labeled" / "config.pbtxt"
    config.write_text(config.read_text().replace('name: "OUTPUT__0"', 'name: "OUTPUT__0" label_filename: "labels.txt"'))
    (repo / "labeled" / "labels.txt").write_text("background\nforeground\n")
    parameters_echo(repo)
    models = (
        "passthrough",
        "mixed",
        "empty_output",
        "dynamic_output",
        "raising",
        "guard_numpy",
        "labeled",
        "slow",
        "parameters_echo",
    )
    return make_server(repo, models=models)


_PARAMETERS_ECHO = """
import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):  # PARAMETERS: the request's parameters as Triton hands them over (JSON bytes)
        responses = []
        for request in requests:
            text = np.frombuffer(request.parameters().encode(), dtype=np.uint8).copy()
            output = pb_utils.Tensor.from_dlpack("PARAMETERS", text)
            responses.append(pb_utils.InferenceResponse(output_tensors=[output]))
        return responses
"""


def parameters_echo(repo: Path) -> None:
    """A model (numpy through DLPack only) that returns its request's parameters."""
    (repo / "parameters_echo" / "1").mkdir(parents=True)
    (repo / "parameters_echo" / "config.pbtxt").write_text(
        'name: "parameters_echo"\nbackend: "python"\nmax_batch_size: 0\n'
        'input [ { name: "INPUT__0" data_type: TYPE_FP32 dims: [ -1 ] } ]\n'
        'output [ { name: "PARAMETERS" data_type: TYPE_UINT8 dims: [ -1 ] } ]\n'
    )
    (repo / "parameters_echo" / "1" / "model.py").write_text(_PARAMETERS_ECHO)


@pytest.fixture
def server(started: Started) -> Any:
    return started.server


@pytest.mark.checks(
    "TRITONSERVER_InferenceRequestAddInput",
    "TRITONSERVER_InferenceRequestAppendInputData",
    "TRITONSERVER_InferenceResponseOutputCount",
    "TRITONSERVER_InferenceResponseOutput",
    "TRITONSERVER_ResponseAllocatorNew",
)
def test_mixed_dtypes_round_trip_exactly(server: Any) -> None:
    rng = np.random.default_rng(0)
    arrays = {
        "INPUT__0": rng.standard_normal((3, 5)).astype(np.float32),
        "INPUT__1": rng.integers(-(2**40), 2**40, (2, 7)),
        "INPUT__2": rng.integers(0, 255, (4, 1)).astype(np.uint8),
        "INPUT__3": rng.standard_normal((2, 2)) > 0,
    }
    out = infer(server, "mixed", arrays)
    for i, array in enumerate(arrays.values()):
        assert out[f"OUTPUT__{i}"].dtype == array.dtype
        np.testing.assert_array_equal(out[f"OUTPUT__{i}"], array)


@pytest.mark.checks("TRITONSERVER_InferenceRequestAddRequestedOutput")
def test_requested_outputs_only(server: Any) -> None:
    arrays = {f"INPUT__{i}": np.ones((1, 1), dtype) for i, dtype in enumerate((np.float32, np.int64, np.uint8, bool))}
    assert set(infer(server, "mixed", arrays, ["OUTPUT__2"])) == {"OUTPUT__2"}


def test_outputs_are_the_allocators_fresh_arrays(server: Any) -> None:
    x = np.arange(6, dtype=np.float32)
    first = infer(server, "passthrough", {"INPUT__0": x})["OUTPUT__0"]
    second = infer(server, "passthrough", {"INPUT__0": x})["OUTPUT__0"]
    assert not np.shares_memory(first, second)
    assert first.base is not None
    assert first.base.dtype == np.uint8
    first[:] = -1  # the caller's to keep and change
    np.testing.assert_array_equal(second, x)


def test_outputs_go_into_the_buffers_the_caller_gives(server: Any) -> None:
    given: list[np.ndarray] = []

    def buffers(byte_size: int) -> np.ndarray:
        given.append(np.empty(byte_size + 16, dtype=np.uint8))  # bigger than asked is allowed
        return given[-1]

    allocator = b.ArrayAllocator(buffers=buffers)
    future, outcome = submit(server, "passthrough", {"INPUT__0": np.arange(6, dtype=np.float32)}, allocator=allocator)
    future.result(30)
    out = outcome.outputs["OUTPUT__0"]
    np.testing.assert_array_equal(out, np.arange(6, dtype=np.float32))
    assert np.shares_memory(out, given[0])  # written there by Triton, handed out without a copy

    with pytest.raises(ValueError, match="needs kind='numpy'"):
        b.ArrayAllocator("torch", buffers=buffers)
    bad = b.ArrayAllocator(buffers=lambda size: np.empty(size // 8, np.float64)[::2])
    future, _ = submit(server, "passthrough", {"INPUT__0": np.ones(64, np.float32)}, allocator=bad)
    with pytest.raises(ValueError, match="not a contiguous uint8 buffer"):  # the callback's own exception
        future.result(30)


def test_torch_allocator_hands_out_tensors_without_a_copy(server: Any) -> None:
    seen: list[Any] = []

    def on_response(response: Any, flags: int, _: Any) -> None:
        if response is not None:
            out = response.output(0)
            tensor = response.output_tensor(0)
            seen.append((tensor, out.base, out.memory_type))

    request = make_request(server, "passthrough", {"INPUT__0": np.arange(4, dtype=np.float32)})
    request.set_response_callback(b.ArrayAllocator("torch"), None, on_response)
    server.infer_async(request).result(30)
    tensor, base, memory_type = seen[0]
    assert tensor.data_ptr() == base
    assert memory_type is b.TRITONSERVER_MemoryType.CPU
    assert torch.equal(tensor, torch.arange(4, dtype=torch.float32))


def test_torch_inputs(server: Any) -> None:
    tensor = torch.arange(5, dtype=torch.float32)
    request = b.TRITONSERVER_InferenceRequest(server, "passthrough")
    request.add_input("INPUT__0", b.TRITONSERVER_DataType.FP32, tensor.shape)
    request.append_input_data("INPUT__0", tensor)
    outcome = Outcome()
    request.set_response_callback(
        b.ArrayAllocator(),
        None,
        lambda r, f, o: o.outputs.update({"OUTPUT__0": r.output_array(0)} if r else {}),
        outcome,
    )
    server.infer_async(request).result(30)
    np.testing.assert_array_equal(outcome.outputs["OUTPUT__0"], tensor.numpy())
    with pytest.raises(b.InvalidArgumentError, match="not contiguous"):
        request.append_input_data("INPUT__0", torch.ones(4, 4).t())


def test_zero_byte_output_beside_a_normal_one(server: Any) -> None:
    before = b.live_handles()
    allocator = b.ArrayAllocator()
    future, outcome = submit(server, "empty_output", {"INPUT__0": np.arange(5, dtype=np.float32)}, allocator=allocator)
    future.result(30)
    assert outcome.outputs["EMPTY"].shape == (0, 4)
    assert outcome.outputs["EMPTY"].dtype == np.float32
    np.testing.assert_array_equal(outcome.outputs["OUTPUT__0"], np.arange(5))
    assert allocator.buffers_in_use == 0  # every response was dropped: its buffers were released
    assert b.live_handles() == before


def test_output_size_known_only_after_inference(server: Any) -> None:
    for size in (3, 300):
        out = infer(server, "dynamic_output", {"SIZE": np.array([size], np.int64)})
        np.testing.assert_array_equal(out["OUTPUT__0"], np.arange(size, dtype=np.float32))


@pytest.mark.checks("TRITONSERVER_InferenceResponseError")
def test_a_model_error_raises_when_the_response_is_read(server: Any) -> None:
    with pytest.raises(b.TritonError, match="deliberate model error"):
        infer(server, "raising", {"INPUT__0": np.zeros(2, np.float32)})


def test_a_short_output_is_refused_not_returned_empty(server: Any) -> None:
    # numpy 2 in the stub: pb_utils.Tensor(name, ndarray) carries 0 bytes for a non-empty shape
    with pytest.raises(b.InternalError, match=r"OUTPUT__0.*do not hold shape \[3\]"):
        infer(server, "guard_numpy", {"INPUT__0": np.ones(3, np.float32)})


@pytest.mark.checks("TRITONSERVER_InferenceResponseOutputClassificationLabel")
def test_classification_label_from_the_label_file(server: Any) -> None:
    labels: list[str] = []

    def on_response(response: Any, flags: int, _: Any) -> None:
        if response is not None:
            labels.extend(response.output_classification_label(0, i) for i in range(2))

    request = make_request(server, "labeled", {"INPUT__0": np.ones(2, np.float32)})
    request.set_response_callback(b.ArrayAllocator(), None, on_response)
    server.infer_async(request).result(30)
    assert labels == ["background", "foreground"]


@pytest.mark.checks(
    "TRITONSERVER_InferenceResponseId",
    "TRITONSERVER_InferenceResponseModel",
    "TRITONSERVER_InferenceResponseParameterCount",
    "TRITONSERVER_InferenceResponseParameter",
)
def test_response_getters(server: Any) -> None:
    seen: dict[str, Any] = {}

    def on_response(response: Any, flags: int, _: Any) -> None:
        if response is None:
            return
        seen["model"], seen["id"], seen["count"] = response.model, response.id, response.parameter_count
        with pytest.raises(b.InvalidArgumentError):
            response.parameter(0)  # the 2.51 Python backend sends no response parameters
        response.delete()
        with pytest.raises(b.OwnershipError, match="deleted"):
            response.output(0)

    request = make_request(server, "passthrough", {"INPUT__0": np.ones(1, np.float32)})
    request.id = "request-7"
    request.set_response_callback(b.ArrayAllocator(), None, on_response)
    server.infer_async(request).result(30)
    assert seen == {"model": ("passthrough", 1), "id": "request-7", "count": 0}


# -- input buffers -----------------------------------------------------------------------------------
def test_non_contiguous_input_is_refused() -> None:
    from monai_triton_ops.bindings.buffers import buffer_address

    with pytest.raises(b.InvalidArgumentError, match=r"'INPUT__0'.*np.ascontiguousarray"):
        buffer_address(np.arange(12, dtype=np.float32).reshape(3, 4).T, "INPUT__0")
    assert buffer_address(b"", "x") == (0, 0)


def test_inputs_live_until_the_request_is_released(server: Any) -> None:
    expected = np.arange(4096, dtype=np.float32).reshape(64, 64).T.reshape(-1)
    request = b.TRITONSERVER_InferenceRequest(server, "passthrough")
    request.add_input("INPUT__0", b.TRITONSERVER_DataType.FP32, expected.shape)
    temporary = np.ascontiguousarray(np.arange(4096, dtype=np.float32).reshape(64, 64).T).reshape(-1)
    request.append_input_data("INPUT__0", temporary)
    del temporary
    gc.collect()
    garbage = np.full(25_000_000, 7, dtype=np.float32)  # 100 MB over whatever was freed
    outcome = Outcome()
    request.set_response_callback(b.ArrayAllocator(), None, _read_all, outcome)
    server.infer_async(request).result(30)
    del garbage
    np.testing.assert_array_equal(outcome.outputs["OUTPUT__0"], expected)


def _read_all(response: Any, flags: int, outcome: Outcome) -> None:
    if response is not None:
        for i in range(response.output_count):
            outcome.outputs[response.output(i).name] = response.output_array(i)


def test_outputs_outlive_response_and_allocator(server: Any) -> None:
    allocator = b.ArrayAllocator()
    future, outcome = submit(
        server, "passthrough", {"INPUT__0": np.arange(1000, dtype=np.float32)}, allocator=allocator
    )
    future.result(30)
    saved = outcome.outputs["OUTPUT__0"].copy()
    allocator.delete()
    del allocator
    gc.collect()
    garbage = np.full(50_000_000, 3, dtype=np.float32)  # 200 MB
    del garbage
    np.testing.assert_array_equal(outcome.outputs["OUTPUT__0"], saved)


@pytest.mark.checks(
    "TRITONSERVER_InferenceRequestSetId",
    "TRITONSERVER_InferenceRequestId",
    "TRITONSERVER_InferenceRequestSetFlags",
    "TRITONSERVER_InferenceRequestFlags",
    "TRITONSERVER_InferenceRequestSetCorrelationId",
    "TRITONSERVER_InferenceRequestCorrelationId",
    "TRITONSERVER_InferenceRequestSetCorrelationIdString",
    "TRITONSERVER_InferenceRequestCorrelationIdString",
    "TRITONSERVER_InferenceRequestSetPriority",
    "TRITONSERVER_InferenceRequestPriority",
    "TRITONSERVER_InferenceRequestSetPriorityUInt64",
    "TRITONSERVER_InferenceRequestPriorityUInt64",
    "TRITONSERVER_InferenceRequestSetTimeoutMicroseconds",
    "TRITONSERVER_InferenceRequestTimeoutMicroseconds",
)
def test_request_setters_round_trip(server: Any) -> None:
    request = b.TRITONSERVER_InferenceRequest(server, "passthrough", 1)
    request.id = "abc"
    request.flags = int(b.TRITONSERVER_RequestFlag.SEQUENCE_START)
    request.correlation_id = 2**40
    request.correlation_id_string = "corr"
    request.priority = 3
    request.priority_uint64 = 2**33
    request.timeout_microseconds = 5_000_000
    assert (request.id, request.flags, request.correlation_id_string) == ("abc", 1, "corr")
    with pytest.raises(b.InvalidArgumentError, match="not an unsigned int"):
        _ = request.correlation_id  # a string id replaced the integer one
    request.correlation_id = 2**40
    assert request.correlation_id == 2**40
    # the model has no priority levels: Triton keeps its default level whatever is asked
    assert (request.priority, request.priority_uint64, request.timeout_microseconds) == (0, 0, 5_000_000)
    with pytest.raises(b.InternalError, match="before calling TRITONSERVER_InferAsync"):
        _ = request.is_cancelled
    request.cancel()  # not in flight: nothing to cancel (Triton resets the flag at submission)
    request.delete()


@pytest.mark.checks(
    "TRITONSERVER_InferenceRequestSetStringParameter",
    "TRITONSERVER_InferenceRequestSetIntParameter",
    "TRITONSERVER_InferenceRequestSetBoolParameter",
    "TRITONSERVER_InferenceRequestSetDoubleParameter",
)
def test_request_parameters_reach_the_model(server: Any) -> None:
    request = make_request(server, "parameters_echo", {"INPUT__0": np.ones(1, np.float32)})
    request.set_string_parameter("s", "v")
    request.set_int_parameter("i", 2**40)
    request.set_bool_parameter("b", True)
    request.set_double_parameter("d", 0.25)
    outcome = Outcome()
    request.set_response_callback(b.ArrayAllocator(), None, _read_all, outcome)
    server.infer_async(request).result(30)
    assert json.loads(outcome.outputs["PARAMETERS"].tobytes()) == {"s": "v", "i": 2**40, "b": True, "d": 0.25}


@pytest.mark.parametrize(("function", "times"), [("InferenceRequestDelete", 10_000), ("InferenceTraceDelete", 50_000)])
def test_deleting_requests_and_traces_frees_them(
    server: Any, request: pytest.FixtureRequest, function: str, times: int
) -> None:
    """Without the deletes these loops would hold well over 4 MiB of Triton's objects (measured: 12 and 7 MiB)."""
    from .test_library import _grows

    make: dict[str, Callable[[], None]] = {
        "InferenceRequestDelete": lambda: b.TRITONSERVER_InferenceRequest(server, "passthrough").delete(),
        "InferenceTraceDelete": lambda: b.TRITONSERVER_InferenceTrace(
            b.TRITONSERVER_InferenceTraceLevel.TIMESTAMPS, 0, lambda *_: None, None
        ).delete(),
    }
    request.node.add_marker(pytest.mark.checks(f"TRITONSERVER_{function}"))
    assert _grows(make[function], times) < 4 << 20


@pytest.mark.checks("TRITONSERVER_InferenceRequestCancel", "TRITONSERVER_InferenceRequestIsCancelled")
def test_cancel_while_in_flight(server: Any) -> None:
    request = make_request(server, "slow", {"INPUT__0": np.ones(1, np.float32)})
    outcome = Outcome()
    request.set_response_callback(b.ArrayAllocator(), None, _read_all, outcome)
    future = server.infer_async(request)
    request.cancel()  # Triton owns it now: cancel and is_cancelled are the two calls allowed
    assert request.is_cancelled
    with contextlib.suppress(b.CancelledError):  # the 2.51 Python backend finishes the request anyway
        future.result(30)
    assert request.owner_state is b.State.OWNED


@pytest.mark.checks(
    "TRITONSERVER_InferenceRequestRemoveInput",
    "TRITONSERVER_InferenceRequestAppendInputDataWithHostPolicy",
    "TRITONSERVER_InferenceRequestRemoveAllInputData",
    "TRITONSERVER_InferenceRequestAppendInputDataWithBufferAttributes",
    "TRITONSERVER_InferenceRequestRemoveRequestedOutput",
    "TRITONSERVER_InferenceRequestRemoveAllRequestedOutputs",
    "TRITONSERVER_InferenceRequestRemoveAllInputs",
    "TRITONSERVER_InferenceRequestAddRawInput",
)
def test_inputs_and_outputs_can_be_removed_and_replaced(server: Any) -> None:
    request = b.TRITONSERVER_InferenceRequest(server, "passthrough")
    request.add_input("STALE", b.TRITONSERVER_DataType.FP32, (1,))
    request.remove_input("STALE")
    request.add_input("INPUT__0", b.TRITONSERVER_DataType.FP32, (2,))
    request.append_input_data("INPUT__0", np.zeros(2, np.float32))
    request.append_input_data_with_host_policy(
        "INPUT__0", np.ones(2, np.float32), b.TRITONSERVER_MemoryType.CPU, 0, "h"
    )
    request.remove_all_input_data("INPUT__0")
    request.append_input_data("INPUT__0", np.ones(1, np.float32))
    attributes = b.TRITONSERVER_BufferAttributes()
    attributes.byte_size = 4
    attributes.memory_type = b.TRITONSERVER_MemoryType.CPU
    request.append_input_data_with_buffer_attributes("INPUT__0", np.full(1, 2, np.float32), attributes)
    request.add_requested_output("NOPE")
    request.remove_requested_output("NOPE")
    request.add_requested_output("ALSO_NOPE")
    request.remove_all_requested_outputs()
    outcome = Outcome()
    request.set_response_callback(b.ArrayAllocator(), None, _read_all, outcome)
    server.infer_async(request).result(30)
    np.testing.assert_array_equal(outcome.outputs["OUTPUT__0"], [1, 2])
    request.remove_all_inputs()
    request.add_raw_input("INPUT__0")  # shape from the config and the byte size: [-1] -> [3]
    request.append_input_data("INPUT__0", np.arange(3, dtype=np.float32).tobytes())
    server.infer_async(request).result(30)
    np.testing.assert_array_equal(outcome.outputs["OUTPUT__0"], [0, 1, 2])


# -- callbacks: exceptions reach the caller ------------------------------------------------------------
class Boom(Exception):
    pass


def test_an_allocator_exception_reaches_the_caller(server: Any, capfd: pytest.CaptureFixture[str]) -> None:
    calls = {"n": 0}

    def alloc(allocator: Any, name: str, size: int, kind: Any, device: int, user: Any) -> tuple[int, Any, Any, int]:
        calls["n"] += 1
        if calls["n"] == 3:
            raise Boom("no memory for you")
        array = np.empty(max(size, 1), np.uint8)
        return int(array.ctypes.data), array, b.TRITONSERVER_MemoryType.CPU, 0

    allocator = b.TRITONSERVER_ResponseAllocator(alloc, lambda *args: None)
    for attempt in range(1, 5):
        future, outcome = submit(server, "passthrough", {"INPUT__0": np.ones(3, np.float32)}, allocator=allocator)
        if attempt == 3:
            with pytest.raises(Boom, match="no memory for you"):
                future.result(30)
        else:
            future.result(30)
            np.testing.assert_array_equal(outcome.outputs["OUTPUT__0"], [1, 1, 1])
    assert "Exception ignored" not in capfd.readouterr().err


def test_the_response_error_is_chained_to_the_allocator_exception(server: Any) -> None:
    errors: list[BaseException] = []

    def alloc(*args: Any) -> tuple[int, Any, Any, int]:
        raise Boom("allocator refused")

    def on_response(response: Any, flags: int, _: Any) -> None:
        if response is not None:
            try:
                response.output_count  # noqa: B018 - reading raises the response's error
            except b.TritonError as exc:
                errors.append(exc)

    request = make_request(server, "passthrough", {"INPUT__0": np.ones(1, np.float32)})
    request.set_response_callback(b.TRITONSERVER_ResponseAllocator(alloc, None), None, on_response)
    with pytest.raises(Boom):
        server.infer_async(request).result(30)
    assert "allocator refused" in str(errors[0])
    assert isinstance(errors[0].__cause__, Boom)


def test_a_response_callback_exception_reaches_the_caller(server: Any, capfd: pytest.CaptureFixture[str]) -> None:
    def on_response(response: Any, flags: int, _: Any) -> None:
        raise Boom("callback failed")

    request = make_request(server, "passthrough", {"INPUT__0": np.ones(1, np.float32)})
    request.set_response_callback(b.ArrayAllocator(), None, on_response)
    with pytest.raises(Boom, match="callback failed"):
        server.infer_async(request).result(30)
    assert "Exception ignored" not in capfd.readouterr().err
    np.testing.assert_array_equal(infer(server, "passthrough", {"INPUT__0": np.ones(1, np.float32)})["OUTPUT__0"], [1])


@pytest.mark.checks("TRITONSERVER_InferenceRequestSetReleaseCallback")
def test_release_callback_and_its_exception(server: Any) -> None:
    released: list[tuple[Any, int, Any]] = []

    def on_release(request: Any, flags: int, user: Any) -> None:
        released.append((request.owner_state, int(flags), user))
        raise Boom("release failed")

    request = make_request(server, "passthrough", {"INPUT__0": np.ones(1, np.float32)})
    request.set_release_callback(on_release, "mine")
    request.set_response_callback(b.ArrayAllocator(), None, lambda *_: None)
    with pytest.raises(Boom, match="release failed"):
        server.infer_async(request).result(30)
    assert released == [(b.State.OWNED, int(b.TRITONSERVER_RequestReleaseFlag.ALL), "mine")]


@pytest.mark.checks("TRITONSERVER_InferenceResponseDelete")
def test_a_release_fn_exception_reaches_its_own_inference_never_another(
    server: Any, caplog: pytest.LogCaptureFixture
) -> None:
    """A buffer's ``release_fn`` runs when its response is deleted: what it raises belongs to that response
    (its ``delete()``, or the future of its inference), never to another response deleted later."""

    def alloc(allocator: Any, name: str, size: int, kind: Any, device: int, tag: Any) -> tuple[int, Any, Any, int]:
        array = np.empty(max(size, 1), np.uint8)
        return int(array.ctypes.data), (tag, array), b.TRITONSERVER_MemoryType.CPU, 0

    def release(allocator: Any, address: int, buffer_user: Any, size: int, kind: Any, device: int) -> None:
        if buffer_user[0] == "failing":
            raise Boom(f"release_fn of a {buffer_user[0]} buffer")

    allocator = b.TRITONSERVER_ResponseAllocator(alloc, release)

    def run(tag: str, keep: bool) -> tuple[concurrent.futures.Future[None], list[Any]]:
        kept: list[Any] = []
        request = make_request(server, "passthrough", {"INPUT__0": np.ones(2, np.float32)})
        on_response = (lambda r, f, k: k.append(r) if r else None) if keep else (lambda *_: None)
        request.set_response_callback(allocator, tag, on_response, kept)
        return server.infer_async(request), kept

    # a response kept past its inference, then dropped here: nothing left to raise it to, so it is logged
    future, kept = run("failing", keep=True)
    future.result(30)
    with caplog.at_level("ERROR", logger="monai_triton_ops.bindings.allocator"):
        kept.clear()
    assert "release_fn of a failing buffer" in caplog.text
    # an unrelated response deleted afterwards on the same thread raises nothing
    future, kept = run("fine", keep=True)
    future.result(30)
    kept.pop().delete()
    # a response dropped by its callback: the exception fails that inference's future
    future, _ = run("failing", keep=False)
    with pytest.raises(Boom, match="release_fn of a failing buffer"):
        future.result(30)
    # a response deleted explicitly: its delete() raises it
    future, kept = run("failing", keep=True)
    future.result(30)
    with pytest.raises(Boom, match="release_fn of a failing buffer"):
        kept.pop().delete()
    assert allocator.buffers_in_use == 0


@pytest.mark.checks("TRITONSERVER_ResponseAllocatorSetBufferAttributesFunction")
def test_buffer_attributes_callback_follows_each_allocation(server: Any) -> None:
    calls: list[tuple[str, Any, Any]] = []

    def attributes(allocator: Any, name: str, view: Any, user: Any, buffer_user: Any) -> None:
        view.memory_type = b.TRITONSERVER_MemoryType.CPU
        calls.append((name, user, type(buffer_user)))

    allocator = b.ArrayAllocator()
    allocator.set_buffer_attributes_function(attributes)
    request = make_request(server, "passthrough", {"INPUT__0": np.ones(3, np.float32)})
    outcome = Outcome()
    request.set_response_callback(allocator, "per-request", _read_all, outcome)
    server.infer_async(request).result(30)
    assert calls == [("OUTPUT__0", "per-request", np.ndarray)]
    np.testing.assert_array_equal(outcome.outputs["OUTPUT__0"], [1, 1, 1])


# -- request trampolines driven directly, in both orders --------------------------------------------------
@pytest.mark.parametrize("order", ["release first", "final first"])
def test_callbacks_in_either_order(server: Any, order: str) -> None:
    import weakref

    from monai_triton_ops.bindings import request as request_module

    x = np.ones(4, np.float32)
    held = weakref.ref(x)
    request = make_request(server, "passthrough", {"INPUT__0": x})
    del x
    request.set_response_callback(b.ArrayAllocator(), None, lambda *_: None)
    flight = request._lend()  # what infer_async does before the C call
    handle = request._handle
    release = (None, int(b.TRITONSERVER_RequestReleaseFlag.ALL), handle)
    final = (None, int(b.TRITONSERVER_ResponseCompleteFlag.FINAL), handle)
    first, second = (request_module._RELEASE, request_module._RESPONSE)
    first_args, second_args = (release, final)
    if order == "final first":
        first, second, first_args, second_args = second, first, second_args, first_args
    del request
    first(*first_args)
    assert not flight.future.done()
    assert held() is not None  # the request (and its inputs) live until both have come
    second(*second_args)
    assert flight.future.done()
    assert flight.future.exception() is None
    assert held() is None  # nothing referenced the request any more: deleted with its inputs


# -- allocator trampolines driven directly ---------------------------------------------------------------
class _Context:
    """The Python side of an in-flight request, as an allocator callback finds it through its handle."""

    _flight = None  # not a real inference: nothing to deliver a release_fn exception to

    def __init__(self, allocator: Any) -> None:
        self.allocator, self.failures = allocator, []

    def _allocation(self) -> tuple[Any, Any]:
        return self.allocator, None

    def _callback_failed(self, exc: BaseException) -> None:
        self.failures.append(exc)


def test_query_with_null_name_and_size_answers_cpu(triton_library: Any) -> None:
    from monai_triton_ops.bindings._object import drop_handle, new_handle

    handle = new_handle(_Context(b.ArrayAllocator()))
    kind, device = ctypes.c_int(int(b.TRITONSERVER_MemoryType.CPU_PINNED)), ctypes.c_int64(0)
    try:
        error = allocator_module._QUERY(None, handle, None, None, ctypes.byref(kind), ctypes.byref(device))
    finally:
        drop_handle(handle)
    assert not error
    assert (kind.value, device.value) == (int(b.TRITONSERVER_MemoryType.CPU), 0)


def test_alloc_failure_is_an_error_never_null_with_success(triton_library: Any) -> None:
    from monai_triton_ops.bindings._library import read_error
    from monai_triton_ops.bindings._object import drop_handle, new_handle

    null_allocator = b.TRITONSERVER_ResponseAllocator(lambda *a: (0, None, b.TRITONSERVER_MemoryType.CPU, 0), None)
    context = _Context(null_allocator)
    handle = new_handle(context)
    buffer, userp, kind, device = ctypes.c_void_p(), ctypes.c_void_p(), ctypes.c_int(), ctypes.c_int64()
    out = (ctypes.byref(buffer), ctypes.byref(userp), ctypes.byref(kind), ctypes.byref(device))
    try:
        error = allocator_module._ALLOC(None, b"OUT", 16, 0, 0, handle, *out)
        assert error
        assert "no buffer for 16 bytes of output 'OUT'" in str(read_error(error, owned=True))
        assert isinstance(context.failures[0], MemoryError)
        assert not allocator_module._ALLOC(None, b"OUT", 0, 0, 0, handle, *out)  # zero bytes: NULL is right
        assert (buffer.value, userp.value) == (None, None)
    finally:
        drop_handle(handle)


# -- many requests, many threads --------------------------------------------------------------------------
def test_concurrent_requests_from_four_threads(server: Any) -> None:
    def run(worker: int) -> list[bool]:
        results = []
        for i in range(250):
            x = np.full(3, worker * 1000 + i, np.float32)
            results.append(bool(np.array_equal(infer(server, "passthrough", {"INPUT__0": x})["OUTPUT__0"], x)))
        return results

    with concurrent.futures.ThreadPoolExecutor(4) as pool:
        results = [r for rs in pool.map(run, range(4)) for r in rs]
    assert len(results) == 1000
    assert all(results)


def test_many_requests_in_flight_at_once(server: Any) -> None:
    before = b.live_handles()
    submitted = [submit(server, "passthrough", {"INPUT__0": np.full(2, i, np.float32)}) for i in range(200)]
    for i, (future, outcome) in enumerate(submitted):
        future.result(60)
        np.testing.assert_array_equal(outcome.outputs["OUTPUT__0"], [i, i])
    assert b.live_handles() == before
    assert threading.active_count() >= 1
