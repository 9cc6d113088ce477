"""The full inference in docs/binding.md runs as written (in its own interpreter, against an identity model)."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from .. import triton_models
from .harness import REPO_ROOT

pytestmark = pytest.mark.triton


def test_the_documented_inference_runs(tmp_path: Path) -> None:
    text = (REPO_ROOT / "docs" / "binding.md").read_text()
    section = text.split("## A full inference against the binding alone", 1)[1]
    example = re.search(r"```python\n(.*?)```", section, re.DOTALL)
    assert example is not None
    triton_models.passthrough(tmp_path / "model_repository", "identity")
    prelude = f"import sys\nsys.path.insert(0, {str(REPO_ROOT)!r})\n"
    prelude += "from tests.bindings.harness import light_import\nlight_import()\n"
    result = subprocess.run(
        [sys.executable, "-c", prelude + example.group(1)],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
        env={**os.environ, "TMPDIR": str(tmp_path)},  # the example's temporary folder stays in the test's
    )
    assert result.returncode == 0, result.stderr[-3000:]
    assert "'count': 1" in result.stdout
    assert "nv_" in result.stdout
