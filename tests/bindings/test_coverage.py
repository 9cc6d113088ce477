"""Every C function the binding declares is called by this test suite (moved to the end of the run)."""

from __future__ import annotations

from pathlib import Path

import pytest

from monai_triton_ops.bindings import _library

from .conftest import CALLED

HERE = Path(__file__).parent


def test_every_declared_function_was_called(request: pytest.FixtureRequest, partial_run: bool) -> None:
    ours = [item for item in request.session.items if Path(str(item.fspath)).is_relative_to(HERE)]
    whole_folder = {Path(str(item.fspath)).name for item in ours} >= {p.name for p in HERE.glob("test_*.py")}
    if partial_run or not whole_folder or request.session.testsfailed:
        pytest.skip("only meaningful after the whole tests/bindings folder ran and passed")
    missing = sorted(set(_library.DECLARATIONS) - CALLED)
    assert not missing, f"declared but never called by the tests: {missing}"
