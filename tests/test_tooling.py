"""The checks `make test` runs do catch the defects they exist for.

Each case plants one defect in a scratch copy (never in the tree) and runs the real tool with the
project's own configuration from ``pyproject.toml``.
"""

from __future__ import annotations

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
    result = _run(BIN / "mypy", "--cache-dir", scratch / ".mypy_cache", cwd=scratch)
    assert result.returncode == 1
    assert "signature.py" in result.stdout
    assert "Incompatible return value type" in result.stdout


def test_pytest_fails_a_failing_test(tmp_path: Path) -> None:
    shutil.copy(ROOT / "pyproject.toml", tmp_path / "pyproject.toml")
    (tmp_path / "tests").mkdir()
    (tmp_path / "tests" / "test_broken.py").write_text("def test_broken():\n    assert 1 + 1 == 3\n")
    result = _run(sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", cwd=tmp_path)
    assert result.returncode == 1
    assert "1 failed" in result.stdout


def test_ci_runs_exactly_the_readme_test_command() -> None:
    readme = (ROOT / "README.md").read_text()
    ci = (ROOT / ".ci" / "run").read_text()
    assert "make test   #" in readme
    assert ci.strip().splitlines()[-1] == "make test"
