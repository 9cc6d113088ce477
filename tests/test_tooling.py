"""The checks `make test` runs do catch the defects they exist for.

Each case plants one defect in a scratch copy (never in the tree) and runs the real tool with the
project's own configuration from ``pyproject.toml``.
"""

from __future__ import annotations

import importlib.util
import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
BIN = Path(sys.executable).parent


def _run(*args: str | Path, cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run([str(a) for a in args], cwd=cwd, capture_output=True, text=True, timeout=300, check=False)


@pytest.fixture
def scratch(tmp_path: Path) -> Path:
    """A copy of the package and the configuration, free to break."""
    shutil.copy(ROOT / "pyproject.toml", tmp_path / "pyproject.toml")
    shutil.copytree(
        ROOT / "monai_triton_ops", tmp_path / "monai_triton_ops", ignore=shutil.ignore_patterns("__pycache__")
    )
    return tmp_path


def test_ruff_passes_the_tree_and_fails_an_unused_import(scratch: Path) -> None:
    assert _run(BIN / "ruff", "check", "monai_triton_ops", cwd=scratch).returncode == 0
    target = scratch / "monai_triton_ops" / "validation.py"
    target.write_text("import os\n" + target.read_text())
    result = _run(BIN / "ruff", "check", "monai_triton_ops", cwd=scratch)
    assert result.returncode == 1
    assert "F401" in result.stdout


def test_lint_imports_passes_the_tree_and_fails_a_cycle_and_an_upward_import(scratch: Path) -> None:
    """The contracts of ``[tool.importlinter]`` on the copy: kept as it is, broken by one import each."""
    assert _run(BIN / "lint-imports", cwd=scratch).returncode == 0, "the tree itself breaks a contract"
    interrupts = scratch / "monai_triton_ops" / "interrupts.py"
    original = interrupts.read_text()
    interrupts.write_text(original + "\n\ndef _cycle() -> None:\n    from . import exits  # noqa: F401\n")
    result = _run(BIN / "lint-imports", cwd=scratch)
    assert result.returncode == 1
    assert "BROKEN" in result.stdout
    assert "monai_triton_ops.interrupts -> monai_triton_ops.exits" in result.stdout
    interrupts.write_text(original)
    readiness = scratch / "monai_triton_ops" / "server" / "readiness.py"
    readiness.write_text(readiness.read_text() + "\nfrom ..repository import layout  # noqa: E402, F401\n")
    result = _run(BIN / "lint-imports", cwd=scratch)
    assert result.returncode == 1
    assert "monai_triton_ops.server.readiness -> monai_triton_ops.repository.layout" in result.stdout


def test_module_sizes_pass_the_tree_and_fail_an_oversized_module(scratch: Path) -> None:
    """``tools/module_sizes.py``: the tree passes; a module grown past 400 lines, or past its allowance, fails."""
    tool = ROOT / "tools" / "module_sizes.py"
    package = scratch / "monai_triton_ops"
    assert _run(sys.executable, tool, package, cwd=scratch).returncode == 0
    (package / "grown.py").write_text("x = 1\n" * 401)
    result = _run(sys.executable, tool, package, cwd=scratch)
    assert result.returncode == 1
    assert "monai_triton_ops/grown.py: 401 lines, over 400" in result.stderr
    (package / "grown.py").write_text("x = 1\n" * 400)
    assert _run(sys.executable, tool, package, cwd=scratch).returncode == 0
    # An allowance (ALLOWED is empty now that every module is under the limit): passed, kept, no longer needed.
    spec = importlib.util.spec_from_file_location("module_sizes", tool)
    assert spec is not None
    assert spec.loader is not None
    sizes = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(sizes)
    grown = package / "grown.py"
    grown.write_text("x = 1\n" * 420)
    name = "monai_triton_ops/grown.py"
    assert sizes.problems(package, allowed={name: 410}) == [
        f"{name}: 420 lines, over its allowance of 410 (tools/module_sizes.py): split it"
    ]
    assert sizes.problems(package, allowed={name: 420}) == []
    grown.write_text("x = 1\n" * 400)
    assert sizes.problems(package, allowed={name: 420}) == [
        f"{name}: 400 lines, no longer over 400: remove it from ALLOWED"
    ]


def test_ruff_format_check_fails_badly_formatted_code(scratch: Path) -> None:
    target = scratch / "monai_triton_ops" / "validation.py"
    target.write_text(target.read_text() + "\nx = {  'a':1 }\n")
    assert _run(BIN / "ruff", "format", "--check", "monai_triton_ops", cwd=scratch).returncode == 1


@pytest.mark.slow
def test_mypy_fails_a_wrong_type_on_a_public_function(scratch: Path) -> None:
    target = scratch / "monai_triton_ops" / "signature.py"
    text = target.read_text()
    broken = text.replace("def triton_dtypes() -> tuple[str, ...]:", "def triton_dtypes() -> list[int]:")
    assert broken != text
    target.write_text(broken)
    # The tree's cache, where mypy has run (``make test`` runs it beside the tests; mypy writes each file of its
    # cache whole, so a copy taken meanwhile holds what it has finished): numpy, torch and MONAI are not analysed
    # again (a cold run takes about 30 s of CPU). The copies of our files have other paths, so every one of them
    # is checked afresh.
    if (ROOT / ".mypy_cache").is_dir():
        shutil.copytree(ROOT / ".mypy_cache", scratch / ".mypy_cache")
    result = _run(BIN / "mypy", "--cache-dir", scratch / ".mypy_cache", cwd=scratch)
    assert result.returncode == 1
    assert "signature.py" in result.stdout
    assert "Incompatible return value type" in result.stdout


def _pytest_project(tmp_path: Path, package: str, test: str) -> Path:
    """A scratch project with this project's ``pyproject.toml``: a one-module package and one test file."""
    shutil.copy(ROOT / "pyproject.toml", tmp_path / "pyproject.toml")
    (tmp_path / "monai_triton_ops").mkdir()
    (tmp_path / "monai_triton_ops" / "__init__.py").write_text(package)
    (tmp_path / "tests").mkdir()
    (tmp_path / "tests" / "test_it.py").write_text(test)
    return tmp_path


def test_a_misspelt_marker_fails_the_run(tmp_path: Path) -> None:
    """``--strict-markers`` in our addopts: ``@pytest.mark.slwo`` would otherwise put a slow test in ``test-fast``."""
    test = "import pytest\n\n\n@pytest.mark.slwo\ndef test_it():\n    pass\n"
    project = _pytest_project(tmp_path, "", test)
    result = _run(sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", cwd=project)
    assert result.returncode != 0
    assert "'slwo' not found in `markers` configuration option" in result.stdout + result.stderr


def test_coverage_below_the_floor_fails_the_run(tmp_path: Path) -> None:
    """``make pytest`` runs ``--cov``; our ``fail_under`` turns a passing run below the floor into a failure."""
    package = "def used():\n    return 1\n\n\n" + "".join(f"def unused_{i}():\n    return {i}\n\n\n" for i in range(9))
    test = "from monai_triton_ops import used\n\n\ndef test_it():\n    assert used() == 1\n"
    project = _pytest_project(tmp_path, package, test)
    result = _run(sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "--cov", cwd=project)
    assert "1 passed" in result.stdout
    assert result.returncode != 0
    assert "Required test coverage of 85.0% not reached" in result.stdout


def test_ci_runs_exactly_the_readme_test_command() -> None:
    readme = (ROOT / "README.md").read_text()
    ci = (ROOT / ".ci" / "run").read_text()
    assert "make test   #" in readme
    assert ci.strip().splitlines()[-1] == "make test"


def test_make_test_runs_on_workers_and_prints_the_slowest_tests() -> None:
    """Which tests cost what is printed by every run (issue 19: "pytest prints no durations"). The Makefile's
    defaults: no worker count from the environment or from a ``make`` this run is part of."""
    unset = {"TEST_WORKERS", "MAKEFLAGS", "MFLAGS", "MAKELEVEL"}
    env = {key: value for key, value in os.environ.items() if key not in unset}
    result = subprocess.run(
        [shutil.which("make") or "make", "-n", "pytest"],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert result.returncode == 0, result.stderr
    (command,) = [line for line in result.stdout.splitlines() if "-m pytest" in line]
    assert "--durations=25" in command
    workers = re.search(r" -n (\d+) ", command)
    assert workers is not None, command
    assert int(workers.group(1)) >= 2, command


def test_the_worker_groups_name_what_is_on_disk() -> None:
    """A renamed file or folder would silently leave ``LONGEST_FIRST`` (handed out last) or ``SHARED_FOLDERS``
    (its session fixtures made once per worker, the binding meta-test split from what it reads)."""
    from .conftest import LONGEST_FIRST, SHARED_FOLDERS, xdist_group_of

    for folder in SHARED_FOLDERS:
        assert (ROOT / "tests" / folder).is_dir(), folder
    for group in LONGEST_FIRST:
        assert (ROOT / group).is_file() or group in SHARED_FOLDERS, group
    assert xdist_group_of("tests/bindings/test_server.py::test_x[a-b]") == "bindings"
    assert xdist_group_of("tests/backends/remote/test_fleet.py::test_y") == "tests/backends/remote/test_fleet.py"
    assert xdist_group_of("tests/test_docs.py::test_z[README.md:1]") == "tests/test_docs.py"


def test_cpu_per_test_puts_a_childs_cpu_on_the_test_that_started_it(tmp_path: Path) -> None:
    """``tools/cpu_per_test.py``: the CPU of a process a test starts is that test's, a sleep costs none, and the
    summary ranks the files by CPU."""
    (tmp_path / "test_burn.py").write_text(
        "import subprocess, sys, time\n"
        "def test_child_burns():\n"
        "    subprocess.run([sys.executable, '-c', 'import time\\nt = time.process_time()\\n"
        "while time.process_time() - t < 0.5: pass'], check=True)\n"
    )
    (tmp_path / "test_sleep.py").write_text("import time\ndef test_sleeps():\n    time.sleep(0.5)\n")
    records = tmp_path / "records"
    env = {**os.environ, "CPU_PER_TEST_DIR": str(records), "PYTHONPATH": str(ROOT / "tools")}
    command = [sys.executable, "-m", "pytest", "-q", "-p", "cpu_per_test", "-p", "no:cacheprovider", "-o", "addopts="]
    result = subprocess.run([*command, str(tmp_path)], cwd=tmp_path, env=env, capture_output=True, text=True,
                            timeout=120, check=False)  # fmt: skip
    assert result.returncode == 0, result.stdout[-3000:]
    recorded = json.loads((records / "main.json").read_text())
    burn, sleep = recorded["test_burn.py::test_child_burns"], recorded["test_sleep.py::test_sleeps"]
    assert burn["children"] >= 0.45, burn
    assert sleep["wall"] >= 0.5, sleep
    assert sleep["self"] + sleep["children"] < 0.2, sleep
    summary = _run(sys.executable, ROOT / "tools" / "cpu_per_test.py", records, "--tests", "1", cwd=tmp_path)
    assert summary.returncode == 0, summary.stderr
    lines = summary.stdout.splitlines()
    assert lines[0].startswith("2 tests: ")
    assert [line.split()[-1] for line in lines[2:4]] == ["test_burn.py", "test_sleep.py"], lines
    assert lines[-1].endswith("test_burn.py::test_child_burns")
