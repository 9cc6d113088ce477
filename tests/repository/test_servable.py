"""A model this machine's Triton cannot load fails with one line that names the fix, and one exit code per cause,
whether ``monai-triton serve`` (a ``tritonserver`` process) or the in-process ``triton`` backend loads it.

The causes are real: the wheel's server has no libtorch backend, and ``CUDA_VISIBLE_DEVICES=""`` leaves it no GPU
(on any machine). Each run is a fresh ``monai-triton`` process or interpreter, as a user meets it.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from monai_triton_ops.errors import ServerNotFoundError
from monai_triton_ops.repository import servable

from .. import triton_models

pytestmark = pytest.mark.triton

NO_GPU = {**os.environ, "CUDA_VISIBLE_DEVICES": ""}
IN_PROCESS = """
import sys
from monai_triton_ops import create_backend
from monai_triton_ops.exits import exit_code
try:
    create_backend("triton", sys.argv[2], model_repository=sys.argv[1]).open()
except Exception as exc:
    print(exit_code(exc), type(exc).__name__, exc)
"""


@pytest.fixture(scope="module")
def capabilities() -> servable.Capabilities:
    from monai_triton_ops.server import find_tritonserver

    try:
        install = find_tritonserver()
    except ServerNotFoundError as exc:
        pytest.skip(f"no tritonserver: {exc}")
    return servable.Capabilities.of_install(install)


def gpu_model(repo: Path) -> Path:
    triton_models.passthrough(repo, "seg")
    config = repo / "seg" / "config.pbtxt"
    config.write_text(config.read_text().replace("KIND_CPU", "KIND_GPU"))
    return repo


def libtorch_model(repo: Path) -> Path:
    (repo / "seg" / "1").mkdir(parents=True)
    (repo / "seg" / "1" / "model.pt").write_bytes(b"never read: the backend is missing")
    (repo / "seg" / "config.pbtxt").write_text(
        'platform: "pytorch_libtorch" max_batch_size: 0 '
        'input [ { name: "INPUT__0" data_type: TYPE_FP32 dims: [ -1 ] } ] '
        'output [ { name: "OUTPUT__0" data_type: TYPE_FP32 dims: [ -1 ] } ]'
    )
    return repo


CAUSES = {
    "gpu": (gpu_model, "its config.pbtxt asks for KIND_GPU instances and this machine has no GPU; rebuild it with "
            "'monai-triton repo build ... --instance-kind cpu'"),
    "libtorch": (libtorch_model, "its config.pbtxt needs Triton's 'pytorch' backend (platform 'pytorch_libtorch'), "
                 "which this server does not have (it has: python); rebuild it for the Python backend with "
                 "'monai-triton repo build MODEL -o REPO --name seg --flavor python'"),
}  # fmt: skip


@pytest.mark.parametrize("cause", sorted(CAUSES))
def test_serve_names_the_fix_with_exit_2(capabilities: servable.Capabilities, tmp_path: Path, cause: str) -> None:
    if cause == "libtorch" and "pytorch" in capabilities.backends:
        pytest.skip("this Triton has the libtorch backend")
    make, message = CAUSES[cause]
    repo = make(tmp_path / "repo")
    command = [sys.executable, "-m", "monai_triton_ops.cli", "serve", str(repo), "--startup-timeout", "120"]
    result = subprocess.run(command, capture_output=True, text=True, timeout=240, check=False, env=NO_GPU)
    assert result.returncode == 2, result.stderr
    errors = [line for line in result.stderr.splitlines() if line.startswith("error:")]  # serve logs at INFO
    assert len(errors) == 1, result.stderr
    assert errors[0].startswith(f"error: model 'seg' failed to load in tritonserver: {message}"), errors[0]
    assert " (Triton: " in errors[0]


@pytest.mark.parametrize("cause", sorted(CAUSES))
def test_the_in_process_backend_gives_the_same_line_and_code(
    capabilities: servable.Capabilities, tmp_path: Path, cause: str
) -> None:
    if cause == "libtorch" and "pytorch" in capabilities.backends:
        pytest.skip("this Triton has the libtorch backend")
    make, message = CAUSES[cause]
    repo = make(tmp_path / "repo")
    command = [sys.executable, "-c", IN_PROCESS, str(repo), "seg"]
    result = subprocess.run(command, capture_output=True, text=True, timeout=240, check=False, env=NO_GPU)
    assert result.returncode == 0, result.stderr[-3000:]
    prefix = "2 ModelLoadError model 'seg' failed to load in the in-process Triton server: "
    assert result.stdout.startswith(prefix + message), result.stdout


@pytest.mark.usefixtures("capabilities")
def test_a_load_failure_the_config_does_not_explain_is_left_to_the_caller(tmp_path: Path) -> None:
    from monai_triton_ops.server import find_tritonserver

    install = find_tritonserver()
    repo = triton_models.passthrough(tmp_path / "repo", "fine")
    assert servable.load_failure(repo / "fine", install, "whatever Triton said") is None
    (repo / "fine" / "config.pbtxt").write_text("not a config")
    assert servable.load_failure(repo / "fine", install, "x") is None
    assert servable.load_failure(tmp_path / "absent", install, "x") is None
    error = servable.load_failure(libtorch_model(tmp_path / "other") / "seg", None, "")
    assert error is not None
    assert str(error) == (
        "model 'seg' failed to load in the Triton server: its config.pbtxt needs Triton's 'pytorch' backend (platform "
        "'pytorch_libtorch'), which this server does not have (it has: none); " + servable.FIX_FLAVOR.format(name="seg")
    )
