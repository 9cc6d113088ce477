"""Every C function the binding declares has its effect checked by a passing test (moved to the end of the run).

A test claims the functions whose effect it asserts with ``@pytest.mark.checks(...)`` (see ``conftest.py``):
merely calling a function no longer counts.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from monai_triton_ops.bindings import _library

from .conftest import CHECKED

HERE = Path(__file__).parent


def test_every_declared_function_has_a_checked_effect(request: pytest.FixtureRequest, partial_run: bool) -> None:
    ours = [item for item in request.session.items if Path(str(item.fspath)).is_relative_to(HERE)]
    whole_folder = {Path(str(item.fspath)).name for item in ours} >= {p.name for p in HERE.glob("test_*.py")}
    if partial_run or not whole_folder or request.session.testsfailed:
        pytest.skip("only meaningful after the whole tests/bindings folder ran and passed")
    unchecked = sorted(set(_library.DECLARATIONS) - set(CHECKED))
    assert not unchecked, f"declared, but no passing test checks their effect (pytest.mark.checks): {unchecked}"
