"""``TRITONSERVER_InferenceTrace``: activity callbacks with timestamps, tensors, release, and failed submissions."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import numpy as np
import pytest

from monai_triton_ops import bindings as b

from .. import triton_models
from .harness import Started, make_request

pytestmark = pytest.mark.triton
Activity = b.TRITONSERVER_InferenceTraceActivity


@pytest.fixture(scope="module")
def started(make_server: Callable[..., Started], tmp_path_factory: pytest.TempPathFactory) -> Started:
    repo = tmp_path_factory.mktemp("trace") / "repo"
    triton_models.passthrough(repo)
    return make_server(repo, models=("passthrough",))


@pytest.fixture
def server(started: Started) -> Any:
    return started.server


class Recorder:
    def __init__(self) -> None:
        self.activities: list[tuple[Activity, int]] = []
        self.seen: dict[str, Any] = {}
        self.tensors: list[tuple[Activity, str, bytes, tuple[int, ...]]] = []
        self.released: list[Any] = []

    def activity(self, trace: Any, activity: Activity, timestamp_ns: int, user: Any) -> None:
        assert user is self
        self.activities.append((activity, timestamp_ns))
        self.seen.update(model=trace.model_name, version=trace.model_version, request=trace.request_id, id=trace.id)

    def tensor(
        self, trace: Any, activity: Activity, name: str, datatype: Any, data: bytes, shape: Any, *rest: Any
    ) -> None:
        self.tensors.append((activity, name, data, shape))

    def release(self, trace: Any, user: Any) -> None:
        self.released.append(trace.owner_state)


def _run(server: Any, trace: Any, x: np.ndarray) -> None:
    request = make_request(server, "passthrough", {"INPUT__0": x})
    request.id = "traced"
    request.set_response_callback(b.ArrayAllocator(), None, lambda *_: None)
    server.infer_async(request, trace).result(30)


def _wait(condition: Callable[[], bool]) -> None:
    deadline = time.monotonic() + 10
    while not condition():
        assert time.monotonic() < deadline, "trace not released"
        time.sleep(0.01)


@pytest.mark.checks(
    "TRITONSERVER_InferenceTraceNew",
    "TRITONSERVER_InferenceTraceId",
    "TRITONSERVER_InferenceTraceModelName",
    "TRITONSERVER_InferenceTraceModelVersion",
    "TRITONSERVER_InferenceTraceRequestId",
    "TRITONSERVER_InferenceTraceParentId",
)
def test_activities_arrive_in_order_with_timestamps(server: Any) -> None:
    recorder = Recorder()
    trace = b.TRITONSERVER_InferenceTrace(
        b.TRITONSERVER_InferenceTraceLevel.TIMESTAMPS, 0, recorder.activity, recorder.release, recorder
    )
    trace_id = trace.id
    _run(server, trace, np.ones(4, np.float32))
    _wait(lambda: bool(recorder.released))
    kinds = [activity for activity, _ in recorder.activities]
    for expected in (Activity.REQUEST_START, Activity.QUEUE_START, Activity.COMPUTE_START, Activity.COMPUTE_END):
        assert expected in kinds
    assert kinds[0] is Activity.REQUEST_START
    assert kinds[-1] is Activity.REQUEST_END
    stamps = [stamp for _, stamp in recorder.activities]
    assert stamps == sorted(stamps)
    assert stamps[0] > 0
    assert recorder.seen == {"model": "passthrough", "version": 1, "request": "traced", "id": trace_id}
    assert recorder.released == [b.State.OWNED]  # handed back to Python: the binding deletes it once
    assert trace.owner_state is b.State.OWNED
    assert trace.parent_id == 0


@pytest.mark.checks("TRITONSERVER_InferenceTraceTensorNew")
def test_tensor_activities_carry_the_input(server: Any) -> None:
    recorder = Recorder()
    level = b.TRITONSERVER_InferenceTraceLevel.TIMESTAMPS | b.TRITONSERVER_InferenceTraceLevel.TENSORS
    trace = b.TRITONSERVER_InferenceTrace(
        level, 0, recorder.activity, recorder.release, recorder, tensor_activity_fn=recorder.tensor
    )
    x = np.arange(3, dtype=np.float32)
    _run(server, trace, x)
    _wait(lambda: bool(recorder.released))
    queued = [t for t in recorder.tensors if t[0] is Activity.TENSOR_QUEUE_INPUT]
    assert queued == [(Activity.TENSOR_QUEUE_INPUT, "INPUT__0", x.tobytes(), (3,))]


@pytest.mark.checks(
    "TRITONSERVER_InferenceTraceSetContext",
    "TRITONSERVER_InferenceTraceContext",
    "TRITONSERVER_InferenceTraceReportActivity",
    "TRITONSERVER_InferenceTraceSpawnChildTrace",
)
def test_custom_activity_context_and_child_traces(server: Any) -> None:
    recorder = Recorder()
    trace = b.TRITONSERVER_InferenceTrace(
        b.TRITONSERVER_InferenceTraceLevel.TIMESTAMPS, 7, recorder.activity, recorder.release, recorder
    )
    trace.context = '{"traceparent": "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"}'
    assert "traceparent" in trace.context
    trace.report_activity(123, "my_step")
    assert recorder.activities == [(Activity.CUSTOM_ACTIVITY, 123)]
    child = trace.spawn_child_trace()
    assert child.parent_id == trace.id
    assert child.id != trace.id
    _run(server, child, np.ones(2, np.float32))
    _wait(lambda: bool(recorder.released))
    child.delete()
    trace.delete()
    with pytest.raises(b.OwnershipError):
        trace.report_activity(1, "late")


def test_a_failed_submission_gives_the_trace_back_once(server: Any) -> None:
    before = b.live_handles()
    recorder = Recorder()
    trace = b.TRITONSERVER_InferenceTrace(
        b.TRITONSERVER_InferenceTraceLevel.TIMESTAMPS, 0, recorder.activity, recorder.release
    )
    request = make_request(server, "passthrough", {"INPUT__0": np.ones(2, np.int64)})  # wrong dtype
    request.set_response_callback(b.ArrayAllocator(), None, lambda *_: None)
    with pytest.raises(b.InvalidArgumentError):
        server.infer_async(request, trace)
    assert trace.owner_state is b.State.OWNED
    assert request.owner_state is b.State.OWNED
    assert len(recorder.released) <= 1
    trace.delete()
    request.delete()
    assert b.live_handles() == before


def test_an_activity_callback_exception_reaches_the_caller(server: Any) -> None:
    def activity(trace: Any, activity: Activity, timestamp_ns: int, user: Any) -> None:
        if activity is Activity.QUEUE_START:
            raise RuntimeError("trace consumer failed")

    trace = b.TRITONSERVER_InferenceTrace(b.TRITONSERVER_InferenceTraceLevel.TIMESTAMPS, 0, activity, None)
    with pytest.raises(RuntimeError, match="trace consumer failed"):
        _run(server, trace, np.ones(1, np.float32))
