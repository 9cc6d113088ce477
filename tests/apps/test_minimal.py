"""The minimal example app as a newcomer runs it: from a fresh copy of its files, as real processes.

One session fixture copies ``apps/minimal`` (as a clone has it), runs its ``make_model.py`` and
``monai-triton repo build`` for the 1-channel model (the 2-channel one is made in this process), and
writes the input images; each test then runs the app (``python APP`` or ``monai-triton exec``) once.
Failures must be one line on stderr, the documented exit code, no traceback, and no output file.
"""

from __future__ import annotations

import importlib.util
import re
import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType
from unittest import mock

import nibabel as nib
import numpy as np
import pytest

from monai_triton_ops.repository.builder import build_repository

from .. import warm_python

ROOT = Path(__file__).resolve().parents[2]
APP = ROOT / "apps" / "minimal"
MODEL = "minimal_seg"

pytestmark = pytest.mark.slow


def run(*command: str | Path, cwd: Path = ROOT, fresh: bool = False) -> subprocess.CompletedProcess[str]:
    """``python COMMAND``: forked from a warm interpreter (``tests/warm_python.py``), or ``fresh``."""
    return warm_python.run([sys.executable, *map(str, command)], cwd=cwd, timeout=600, fresh=fresh)


def run_ok(*command: str | Path, fresh: bool = False) -> subprocess.CompletedProcess[str]:
    result = run(*command, fresh=fresh)
    assert result.returncode == 0, result.stderr[-3000:]
    return result


@dataclass(frozen=True)
class Clone:
    app: Path  # the copied apps/minimal
    repo: Path  # minimal_seg with 1 input channel
    repo2: Path  # minimal_seg with 2 input channels
    image: Path  # (X, Y, Z)
    image2: Path  # (X, Y, Z, 2)


@pytest.fixture(scope="session")
def clone(tmp_path_factory: pytest.TempPathFactory) -> Clone:
    """The newcomer's steps as processes for the 1-channel model; the 2-channel one in this process.

    ``make_model.py --in-channels 2`` runs through the script's own ``main`` here: a second interpreter would
    import MONAI again (seconds of CPU) for a step the README's walk-through does not take.
    """
    base = tmp_path_factory.mktemp("minimal")
    app = base / "minimal"
    shutil.copytree(APP, app, ignore=shutil.ignore_patterns("__pycache__"))
    model = base / f"{MODEL}_1.pt"
    run_ok(app / "make_model.py", "--out", model)
    run_ok("-m", "monai_triton_ops.cli", "repo", "build", model, "-o", base / "models", "--name", MODEL)
    model2 = base / f"{MODEL}_2.pt"
    with mock.patch.object(sys, "argv", ["make_model.py", "--out", str(model2), "--in-channels", "2"]):
        script(app / "make_model.py").main()
    build_repository(model2, base / "models2", MODEL)
    run_ok(app / "make_input.py", "--out", base / "image.nii.gz")
    run_ok(app / "make_input.py", "--out", base / "image2.nii.gz", "--channels", "2")
    return Clone(app, base / "models", base / "models2", base / "image.nii.gz", base / "image2.nii.gz")


def script(path: Path) -> ModuleType:
    """The example script at ``path`` as a module (its ``__main__`` block does not run)."""
    spec = importlib.util.spec_from_file_location(f"minimal_{path.stem}", path)
    assert spec is not None
    assert spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="session")
def first_run(clone: Clone, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """``python APP -i image -o out -m models``: the README's step 4, in a fresh interpreter (all it prints)."""
    out = tmp_path_factory.mktemp("out")
    result = run_ok(clone.app, "-i", clone.image, "-o", out, "-m", clone.repo, fresh=True)
    assert_run_line(result.stderr)  # quiet by default: no Holoscan lines, no stack warning; the run line alone
    return out / "seg.nii.gz"


def assert_run_line(stderr: str, backend: str = "torch (TorchScript in this process, cpu)") -> None:
    """A successful run prints one line: which backend ran the model, where, and how long inference took."""
    (line,) = stderr.splitlines()
    assert re.fullmatch(rf"model 'minimal_seg' ran on {re.escape(backend)}: 1 image\(s\), inference \d+\.\d\d s", line)


def labels(path: Path) -> np.ndarray:
    return np.asarray(nib.load(path).dataobj)


def test_the_example_runs_from_a_fresh_copy(first_run: Path, clone: Clone) -> None:
    seg, image = nib.load(first_run), nib.load(clone.image)
    assert seg.shape == image.shape
    np.testing.assert_allclose(seg.affine, image.affine)
    assert seg.get_data_dtype() == np.uint8
    assert set(np.unique(labels(first_run))) <= {0, 1}
    assert not list(clone.repo.rglob("__pycache__"))


def readme_app() -> str:
    """The first python block of the README's "Use it in an app" section."""
    text = (ROOT / "README.md").read_text(encoding="utf-8")
    section = text[text.index("## Use it in an app") :]
    match = re.search(r"```python\n(.*?)```", section, re.DOTALL)
    assert match, "no python block in the README's 'Use it in an app'"
    return match.group(1)


def test_the_readme_snippet_is_the_example_shortened_and_runs(first_run: Path, clone: Clone, tmp_path: Path) -> None:
    app = tmp_path / "my_app.py"
    app.write_text(readme_app(), encoding="utf-8")
    out = tmp_path / "out"
    command = ["exec", app, "-i", clone.image, "-o", out, "-m", clone.repo, "--preview", "--timeout-s", "60"]
    result = run_ok("-m", "monai_triton_ops.cli", *command)  # exec hands --preview and --timeout-s to the app
    assert_run_line(result.stderr)
    np.testing.assert_array_equal(labels(out / "seg.nii.gz"), labels(first_run))
    assert (out / "preview.png").stat().st_size > 0


def test_a_two_channel_nifti_through_a_two_channel_model(clone: Clone, tmp_path: Path) -> None:
    result = run_ok(clone.app, "-i", clone.image2, "-o", tmp_path, "-m", clone.repo2, "--backend", "torch")
    seg = nib.load(tmp_path / "seg.nii.gz")
    assert seg.shape == nib.load(clone.image).shape  # (X, Y, Z): the 2 channels went into the model, not the grid
    assert_run_line(result.stderr)


def test_nan_voxels_are_refused_with_their_count_unless_allowed(clone: Clone, tmp_path: Path) -> None:
    source = nib.load(clone.image)
    data = np.asarray(source.dataobj).copy()
    data[10:13, 20, 5] = np.nan
    spoiled = tmp_path / "nan.nii.gz"
    nib.save(nib.Nifti1Image(data, source.affine), spoiled)
    result = run(clone.app, "-i", spoiled, "-o", tmp_path / "out", "-m", clone.repo)
    assert_one_line_failure(result, 2, "the input image has 3 non-finite voxel(s) (3 NaN, 0 Inf)", tmp_path / "out")
    assert "first at channel 0, voxel (10, 20, 5)" in result.stderr
    allowed = run("-m", "monai_triton_ops.cli", "exec", clone.app, "-i", spoiled, "-o", tmp_path / "ok",
                  "-m", clone.repo, "--allow-non-finite")  # fmt: skip
    assert allowed.returncode == 0, allowed.stderr
    assert (tmp_path / "ok" / "seg.nii.gz").is_file()
    assert "kept because non-finite voxels are allowed" in allowed.stderr


def assert_one_line_failure(result: subprocess.CompletedProcess[str], code: int, text: str, out: Path) -> None:
    """One ``error:`` line; before it, only the lines saying the backend is waiting for its servers (and why)."""
    assert result.returncode == code, result.stderr
    lines = [line for line in result.stderr.splitlines() if "waiting for model" not in line]
    assert len(lines) == 1, result.stderr
    assert lines[0].startswith("error: ")
    assert text in lines[0]
    assert not any(p.is_file() for p in out.rglob("*")) if out.exists() else True


@pytest.mark.parametrize(
    ("case", "code", "text"),
    [
        ("unreachable_server", 3, "on grpc://127.0.0.1:9 was not ready within 2 s (ready_timeout_s)"),
        (
            "unreachable_fleet",
            3,
            "was not ready on any of its 2 servers within 2 s (ready_timeout_s): grpc://127.0.0.1:9 connection "
            "refused (nothing listens on 127.0.0.1:9); grpc://127.0.0.1:7 connection refused",
        ),
        ("channels", 2, "(dim 1: expected 1, got 2); the image is [2, 48, 40, 32] (channel first"),
        ("malformed_config", 2, "config.pbtxt: not a valid Triton model configuration"),
        ("model_name", 2, "model 'minimal_seg' not found in repository"),
        ("output_not_writable", 2, "cannot be created: Not a directory"),
    ],
)
def test_each_failure_is_one_line_with_its_exit_code_and_no_output(
    clone: Clone, tmp_path: Path, case: str, code: int, text: str
) -> None:
    image, repo, out, extra = clone.image, clone.repo, tmp_path / "out", []
    if case == "unreachable_server":  # nothing listens on the discard port
        extra = ["--backend", "grpc://127.0.0.1:9?ready_timeout_s=2"]
    elif case == "unreachable_fleet":  # every server of a fleet stopped: one line, no output
        extra = ["--backend", "grpc://127.0.0.1:9,127.0.0.1:7?ready_timeout_s=2"]
    elif case == "channels":
        image = clone.image2
    elif case in ("malformed_config", "model_name"):
        repo = tmp_path / "models"
        shutil.copytree(clone.repo, repo)
        if case == "model_name":  # built with --name minimal-seg, while the app asks for minimal_seg
            config = repo / MODEL / "config.pbtxt"
            config.write_text(config.read_text().replace(f'name: "{MODEL}"', 'name: "minimal-seg"'))
            (repo / MODEL).rename(repo / "minimal-seg")
        else:
            (repo / MODEL / "config.pbtxt").write_text(f'name: "{MODEL}"\ninput [ {{ name: "x" dims: [ -1')
    elif case == "output_not_writable":
        (tmp_path / "file").write_text("")
        out = tmp_path / "file" / "out"
    result = run(clone.app, "-i", image, "-o", out, "-m", repo, *extra)
    assert_one_line_failure(result, code, text, out)


def test_the_app_help_lists_every_option(clone: Clone) -> None:
    result = run_ok(clone.app, "--help")
    for option in ("-i PATH", "-o DIR", "-m PATH", "-w DIR", "-t HOST:PORT", "--backend SPEC", "--allow-non-finite"):
        assert option in result.stdout
    assert "Segment one NIfTI image with the minimal_seg model" in result.stdout
