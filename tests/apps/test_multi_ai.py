"""An App SDK multi-AI app (``tests/apps/multi_ai``: two bundles, one DICOM CT series in, two DICOM SEGs out) that
keeps the App SDK's own ``init_app_context``, run through ``monai-triton exec`` with a backend per model.

The models folder holds the two models as App SDK apps find them: ``spleen_ct/`` a bundle folder, and
``pancreas_ct_dints/model.ts`` a bundle archive (configs embedded). The reference for each model is the DICOM SEG
that ``apps/bundle_seg`` (a single-model app) writes with that model alone on ``torch``. Four runs put each model
on each backend (torch, triton, grpc, http), every run one model remote and one in-process, the choice given each
way a deployer gives it: ``--backend`` before APP, after APP, ``MONAI_TRITON_BACKEND``, ``app.yaml``.
"""

from __future__ import annotations

import os
import shutil
import sys
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pydicom
import pytest

from monai_triton_ops.errors import ServerNotFoundError
from monai_triton_ops.repository.bundle import build_bundle
from monai_triton_ops.server import LocalTritonServer, find_tritonserver

from .. import warm_python
from ..bundles.makers import UNET_CONFIG, UNET_DEF, metadata, write_bundle
from .test_bundle_seg import write_ct_series

ROOT = Path(__file__).resolve().parents[2]
APP = Path(__file__).resolve().parent / "multi_ai"
SINGLE = ROOT / "apps" / "bundle_seg"
SPLEEN, PANCREAS = "spleen_ct", "pancreas_ct_dints"

pytestmark = pytest.mark.slow


def write_models(root: Path) -> Path:
    """``root/models``: a 2-class bundle folder and a 3-class bundle archive (other channels: other weights)."""
    models = root / "models"
    spleen_config = {**UNET_CONFIG, "network_def": {**UNET_DEF, "out_channels": 2}}
    write_bundle(models / SPLEEN, spleen_config, metadata(SPLEEN, 1, 2, 3), form="ts")
    pancreas_config = {**UNET_CONFIG, "network_def": {**UNET_DEF, "channels": [6, 12]}}
    archive = write_bundle(root / "archive" / PANCREAS, pancreas_config, metadata(PANCREAS, 1, 3, 3), form="archive")
    (models / PANCREAS).mkdir()
    shutil.move(archive, models / PANCREAS / "model.ts")
    return models


@pytest.fixture(scope="module")
def work(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """The models, a 32 x 32 x 16 CT series, and a bundle cache of the module's own."""
    root = tmp_path_factory.mktemp("multi_ai")
    write_models(root)
    rng = np.random.default_rng(5)
    volume = rng.standard_normal((32, 32, 16)) * 60 + 50
    volume[:, :16] += 80  # structure, so that the labels are not one class
    write_ct_series(volume, root / "dicom", (1.2, 1.2, 2.5))
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("MONAI_TRITON_CACHE", str(root / "cache"))
        yield root


@pytest.fixture(scope="module")
def server(work: Path) -> Iterator[LocalTritonServer]:
    """One real tritonserver serving what ``repo build`` made of both models."""
    try:
        find_tritonserver()
    except ServerNotFoundError as exc:
        pytest.skip(f"no tritonserver: {exc}")
    repo = work / "served"
    build_bundle(work / "models" / SPLEEN, repo, SPLEEN)
    build_bundle(work / "models" / PANCREAS / "model.ts", repo, PANCREAS)
    with LocalTritonServer(repo, startup_timeout_s=180.0) as running:
        yield running


def exec_app(
    app: Path, *args: str | Path, before: tuple[str, ...] = (), code: int = 0, **env: str
) -> warm_python.PythonRun:
    """``monai-triton exec [BEFORE] APP ARGS`` forked from the warm interpreter, with ``env`` added."""
    command = [sys.executable, "-m", "monai_triton_ops.cli", "exec", *before, str(app), *map(str, args)]
    result = warm_python.run(command, cwd=ROOT, env={**os.environ, **env}, timeout=600)
    assert result.returncode == code, result.stderr[-3000:]
    return result


def seg_frames(path: Path) -> tuple[np.ndarray, list[int]]:
    """A DICOM SEG's frames and the segment of each frame: what the labels were, as the SEG writer encodes them."""
    seg = pydicom.dcmread(path)
    assert seg.Modality == "SEG"
    shared = seg.SharedFunctionalGroupsSequence[0]
    groups = [f if "SegmentIdentificationSequence" in f else shared for f in seg.PerFrameFunctionalGroupsSequence]
    numbers = [int(g.SegmentIdentificationSequence[0].ReferencedSegmentNumber) for g in groups]
    return seg.pixel_array.reshape(len(numbers), seg.Rows, seg.Columns), numbers


def segs_by_model(folder: Path) -> dict[str, tuple[np.ndarray, list[int]]]:
    found = {}
    for path in folder.glob("*.dcm"):
        description = str(getattr(pydicom.dcmread(path, stop_before_pixels=True), "SeriesDescription", ""))
        found[description.removeprefix("AI ")] = seg_frames(path)
    return found


@pytest.fixture(scope="module")
def references(work: Path) -> dict[str, tuple[np.ndarray, list[int]]]:
    """Each model alone in the single-model app, on torch."""
    found = {}
    for name, model in ((SPLEEN, work / "models" / SPLEEN), (PANCREAS, work / "models" / PANCREAS / "model.ts")):
        out = work / f"single_{name}"
        command = [sys.executable, str(SINGLE), "-i", work / "dicom", "-o", out, "-m", model, "--backend", "torch"]
        result = warm_python.run(command, cwd=ROOT, timeout=600)
        assert result.returncode == 0, result.stderr[-3000:]
        ((frames, numbers),) = segs_by_model(out).values()
        assert frames.any()  # labels, not an empty segmentation
        found[name] = (frames, numbers)
    assert not np.array_equal(found[SPLEEN][0], found[PANCREAS][0])  # two different models
    return found


def check(out: Path, references: dict[str, tuple[np.ndarray, list[int]]], log: str, ran: dict[str, str]) -> None:
    got = segs_by_model(out)
    assert sorted(got) == [PANCREAS, SPLEEN]
    for model, backend in ran.items():
        frames, numbers = got[model]
        want_frames, want_numbers = references[model]
        assert numbers == want_numbers, model
        assert int(np.count_nonzero(frames != want_frames)) == 0, model
        assert f"model {model!r} ran on {backend}" in log  # the run line names each model's backend


@pytest.mark.triton
def test_each_model_on_each_backend_one_remote_one_in_process(
    work: Path, server: LocalTritonServer, references: dict[str, tuple[np.ndarray, list[int]]]
) -> None:
    grpc, http = server.grpc_url, server.http_url
    io = ["-i", work / "dicom", "-m", work / "models"]
    # --backend before APP: app-wide grpc, spleen in-process
    run = exec_app(APP, *io, "-o", work / "run1", before=("--backend", grpc, "--backend", f"{SPLEEN}=torch"))
    check(work / "run1", references, run.stderr, {SPLEEN: "torch", PANCREAS: "grpc"})
    # MONAI_TRITON_BACKEND, both models named
    run = exec_app(APP, *io, "-o", work / "run2", MONAI_TRITON_BACKEND=f"{SPLEEN}=triton;{PANCREAS}={http}")
    check(work / "run2", references, run.stderr, {SPLEEN: "triton", PANCREAS: "http"})
    # app.yaml beside the app: one model named, the other the app-wide value
    app = work / "app_with_yaml"
    shutil.copytree(APP, app, ignore=shutil.ignore_patterns("__pycache__"))
    yaml = f'application:\n  environment:\n    MONAI_TRITON_BACKEND: "{PANCREAS}=torch;{grpc}"\n'
    (app / "app.yaml").write_text(yaml)
    run = exec_app(app, *io, "-o", work / "run3")
    check(work / "run3", references, run.stderr, {SPLEEN: "grpc", PANCREAS: "torch"})
    # --backend after APP: app-wide triton (a straight port gains --backend), spleen remote
    run = exec_app(APP, *io, "-o", work / "run4", "--backend", "triton", "--backend", f"{SPLEEN}={http}")
    check(work / "run4", references, run.stderr, {SPLEEN: "http", PANCREAS: "triton"})


def test_a_bad_choice_is_one_line_before_anything_runs(work: Path, tmp_path: Path) -> None:
    """The App SDK's own app context carries none of our settings: the operators read them from the environment
    when the app composes its graph, and refuse a bad one there, before any model loads or any file is written.
    (A model missing from the folder: ``tests/test_quickstart_errors.py``.)"""
    io = ["-i", work / "dicom", "-o", tmp_path / "out"]
    run = exec_app(APP, *io, "-m", work / "models", code=2, MONAI_TRITON_BACKEND="torch;liver=triton")
    line = run.stderr.strip().splitlines()[-1]
    assert line.startswith("error: MONAI_TRITON_BACKEND (environment): backend for model 'liver', which is not in")
    assert "(models there: pancreas_ct_dints, spleen_ct)" in line
    assert "Traceback" not in run.stderr
    assert not list((tmp_path / "out").glob("*.dcm"))
