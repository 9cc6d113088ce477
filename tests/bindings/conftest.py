"""Fixtures for the binding's tests: the real library, one in-process server per module, checked effects.

Every C function the binding declares must have its effect checked by a test, not merely be called: a test
names the functions whose effect it asserts with ``@pytest.mark.checks("TRITONSERVER_...", ...)``. While a
test runs, every call of a declared function is recorded (a thin wrapper on the loaded library); a test
that names a function it never called fails, and a function counts as checked only through a test that
named it, called it and passed. ``test_every_declared_function_has_a_checked_effect``, moved to the end
of the run, asserts that every declared function was checked, when the whole folder ran.
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

#: Declared functions called while the current test's body runs (from any thread).
CALLED_NOW: set[str] = set()
#: Declared functions whose effect a passing test checked (it named them with ``checks`` and called them).
CHECKED: dict[str, list[str]] = {}
COVERAGE_TEST = "test_every_declared_function_has_a_checked_effect"


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", "checks(*functions): the C functions whose effect this test asserts")


def _claims(item: pytest.Item) -> set[str]:
    return {name for marker in item.iter_markers("checks") for name in marker.args}


@pytest.hookimpl(hookwrapper=True)
def pytest_pyfunc_call(pyfuncitem: pytest.Function) -> Iterator[None]:
    """Record the calls of the test body; a function the test names but never called fails the test."""
    CALLED_NOW.clear()
    outcome = yield
    claims = _claims(pyfuncitem)
    if claims and outcome.excinfo is None:
        from monai_triton_ops.bindings import _library

        unknown = sorted(claims - set(_library.DECLARATIONS))
        uncalled = sorted(claims - CALLED_NOW - set(unknown))
        if unknown or uncalled:
            problem = f"checks() names {unknown} which are not declared" if unknown else ""
            problem += f"; checks() names {uncalled}, which the test never called" if uncalled else ""
            outcome.force_exception(AssertionError(problem.lstrip("; ")))


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]) -> Iterator[None]:
    outcome = yield
    report = outcome.get_result()
    if report.when == "call" and report.passed:
        for name in _claims(item):
            CHECKED.setdefault(name, []).append(item.nodeid)


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
        CALLED_NOW.add(name)
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
