"""Fixtures for the binding's tests: the real library, one in-process server per module, call counting.

Every C function the binding declares is counted while these tests run (a thin wrapper on the loaded
library); ``test_every_declared_function_was_called``, moved to the end of the run, asserts each was
called at least once, when the whole folder ran.
"""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from .harness import REPO_ROOT, Started, start_server, stop_server

CALLED: set[str] = set()
COVERAGE_TEST = "test_every_declared_function_was_called"


@pytest.fixture(scope="session")
def triton_library() -> Any:
    from monai_triton_ops import bindings
    from monai_triton_ops.errors import ServerNotFoundError

    try:
        return bindings.load_library()
    except ServerNotFoundError as exc:
        pytest.skip(f"no libtritonserver: {exc}")


@pytest.fixture(scope="session", autouse=True)
def _count_calls() -> Iterator[None]:
    """Wrap each declared function of the loaded library to record that it was called."""
    from monai_triton_ops.bindings import _library
    from monai_triton_ops.errors import ServerNotFoundError

    try:
        _library.load_library()
    except ServerNotFoundError:
        yield
        return
    cdll = _library.lib()
    originals = {name: getattr(cdll, name) for name in _library.DECLARATIONS}
    for name, function in originals.items():
        setattr(cdll, name, _counting(name, function))
    yield
    for name, function in originals.items():
        setattr(cdll, name, function)


def _counting(name: str, function: Any) -> Callable[..., Any]:
    def call(*args: Any) -> Any:
        CALLED.add(name)
        return function(*args)

    call.__wrapped__ = function  # type: ignore[attr-defined]
    return call


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Run the coverage check last."""
    last = [item for item in items if item.name == COVERAGE_TEST]
    for item in last:
        items.remove(item)
        items.append(item)


def pytest_deselected(items: list[pytest.Item]) -> None:
    """A binding test left out (``-k``, ``--deselect``) makes the coverage check meaningless."""
    here = Path(__file__).parent
    if any(Path(str(item.fspath)).is_relative_to(here) for item in items):
        _PARTIAL.append(True)


_PARTIAL: list[bool] = []


@pytest.fixture
def partial_run() -> bool:
    return bool(_PARTIAL)


@pytest.fixture(scope="module")
def make_server(triton_library: Any, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Callable[..., Started]]:
    """``make_server(repo, models=..., **options)``: started servers, deleted and checked at module end."""
    started: list[Started] = []

    def make(repo: Path, **options: Any) -> Started:
        server = start_server(repo, tmp_path_factory.mktemp("server"), **options)
        started.append(server)
        return server

    yield make
    for server in reversed(started):
        stop_server(server)


def run_case(
    code: str, *, timeout_s: float = 120, env: dict[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    """Run ``code`` in a fresh interpreter (a crash fails the test, not the suite); it must exit 0."""
    prelude = "import sys\nsys.path.insert(0, %r)\nfrom tests.bindings.harness import light_import\nlight_import()\n"
    script = prelude % str(REPO_ROOT) + textwrap.dedent(code)
    result = subprocess.run(
        [sys.executable, "-c", script],
        cwd=REPO_ROOT,
        capture_output=True,
        text=True,
        timeout=timeout_s,
        env=env,
        check=False,
    )
    assert result.returncode == 0, (
        f"case exited {result.returncode}\n--- stdout\n{result.stdout}\n--- stderr\n{result.stderr}"
    )
    return result


#: In a case script: ``run_case_body(name, body, scope)`` runs one case and prints its outcome as a JSON line.
CASE_DRIVER = """
import json as _json, traceback as _traceback

def run_case_body(name, body, scope):
    print(_json.dumps({"start": name}), flush=True)
    try:
        exec(body, scope)
    except BaseException:
        print(_json.dumps({"case": name, "error": _traceback.format_exc()}), flush=True)
    else:
        print(_json.dumps({"case": name, "error": None}), flush=True)
"""


@dataclass
class CaseOutcomes:
    """What one interpreter running several cases in order reported."""

    errors: dict[str, str | None]
    """Each case that ended: its traceback, or ``None``."""
    last_started: str | None
    stdout: str
    stderr: str
    code: int

    def check(self, name: str) -> None:
        """Fail unless case ``name`` ran and passed (a crash fails the case it happened in and those after)."""
        if name not in self.errors:
            where = "in this case" if self.last_started == name else f"before it ran, in {self.last_started!r}"
            pytest.fail(f"the interpreter died {where} (exit code {self.code})\n--- stderr tail\n{self.stderr[-4000:]}")
        error = self.errors[name]
        assert error is None, error


def run_cases(script: str, *, env: Mapping[str, str] | None = None, timeout_s: float = 300) -> CaseOutcomes:
    """Run ``script`` (which calls ``run_case_body``) in one fresh interpreter; never raises on its exit code."""
    prelude = "import sys\nsys.path.insert(0, %r)\nfrom tests.bindings.harness import light_import\nlight_import()\n"
    result = subprocess.run(
        [sys.executable, "-c", prelude % str(REPO_ROOT) + CASE_DRIVER + script],
        cwd=REPO_ROOT,
        capture_output=True,
        text=True,
        timeout=timeout_s,
        env=dict(env) if env is not None else None,
        check=False,
    )
    errors: dict[str, str | None] = {}
    last = None
    for line in result.stdout.splitlines():
        if line.startswith('{"'):
            record = json.loads(line)
            if "case" in record:
                errors[record["case"]] = record["error"]
            else:
                last = record["start"]
    return CaseOutcomes(errors, last, result.stdout, result.stderr, result.returncode)
