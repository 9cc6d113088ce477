"""Every C function the binding declares has its effect checked by a passing test (moved to the end of the run).

A test claims the functions whose effect it asserts with ``@pytest.mark.checks(...)`` (see ``conftest.py``):
merely calling a function no longer counts. The few whose effect cannot be observed on this machine are
listed below, each with why; a listed one that a test does check must leave the list.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from monai_triton_ops.bindings import _library

from .conftest import CHECKED

HERE = Path(__file__).parent

#: Functions whose effect nothing on this machine (no GPU, no NUMA, seconds per test) can observe: each is
#: still called by ``test_options.py`` / ``test_inference.py`` on a server that starts and serves.
NOTHING_TO_OBSERVE_HERE = {
    "TRITONSERVER_ServerOptionsSetCudaVirtualAddressSize": "a CUDA memory setting: no GPU here",
    "TRITONSERVER_ServerOptionsSetEnablePeerAccess": "CUDA peer access between GPUs: no GPU here",
    "TRITONSERVER_ServerOptionsSetHostPolicy": "a NUMA policy handed to backends; the Python backend ignores it",
    "TRITONSERVER_ServerOptionsSetBufferManagerThreadCount": "threads for CUDA buffer copies: no GPU here",
    "TRITONSERVER_ServerOptionsSetModelLoadThreadCount": "a pool size: loads run the same, only their overlap changes",
    "TRITONSERVER_ServerOptionsSetMetricsInterval": "how often GPU/CPU gauges refresh: only timing shows it",
    "TRITONSERVER_ServerOptionsSetGpuMetrics": "GPU gauges: no GPU here (DCGM's start-up failure is logged once per "
    "process at most, so even that is no reliable sign)",
    "TRITONSERVER_ResponseAllocatorSetQueryFunction": "the 2.51 Python backend never queries (pitfall A7); the "
    "trampoline is driven directly by test_query_with_null_name_and_size_answers_cpu",
    "TRITONSERVER_ResponseAllocatorDelete": "frees a 32-byte struct: a leak is below what RSS shows in a test; "
    "the binding refuses it while in use (test_ownership.py)",
}


def test_every_declared_function_has_a_checked_effect(request: pytest.FixtureRequest, partial_run: bool) -> None:
    ours = [item for item in request.session.items if Path(str(item.fspath)).is_relative_to(HERE)]
    whole_folder = {Path(str(item.fspath)).name for item in ours} >= {p.name for p in HERE.glob("test_*.py")}
    if partial_run or not whole_folder or request.session.testsfailed:
        pytest.skip("only meaningful after the whole tests/bindings folder ran and passed")
    unchecked = sorted(set(_library.DECLARATIONS) - set(CHECKED) - set(NOTHING_TO_OBSERVE_HERE))
    assert not unchecked, f"declared, but no passing test checks their effect (pytest.mark.checks): {unchecked}"
    needless = sorted(set(NOTHING_TO_OBSERVE_HERE) & set(CHECKED))
    assert not needless, f"listed as unobservable, yet a test checks them: {needless}"
