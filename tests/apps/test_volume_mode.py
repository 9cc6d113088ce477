"""The sample app in volume mode against the real local server: the same labels as window mode, NIfTI and DICOM.

One server for the module serves the sample model and an untrained one (random weights, 2 classes, another
roi size, gaussian blending), each with its ``_volume`` model from ``monai-triton repo wrap``. The app runs
as users run it, in its own process; the mode is set at deploy time (``MONAI_TRITON_MODE``, ``--mode``) and
the app's code is unchanged. Window mode's labels are the reference: for the sample model the run's torch labels
of the whole MRI (``sample_labels``, which ``test_brain_tissue_seg.py`` shows a server's window mode gives exactly),
for the untrained one window mode on this server.
"""

from __future__ import annotations

import os
import shutil
import sys
from collections.abc import Iterator
from pathlib import Path

import nibabel as nib
import numpy as np
import pytest
import torch
from monai.networks.nets import UNet

from monai_triton_ops.repository.builder import build_repository
from monai_triton_ops.repository.volume import wrap_network
from monai_triton_ops.server import LocalTritonServer

from .. import warm_python
from ..conftest import nd_format, save_model

ROOT = Path(__file__).resolve().parents[2]
APP = ROOT / "apps" / "brain_tissue_seg"
SAMPLE = "brain_tissue_seg"
UNTRAINED = "untrained_seg"
#: Not the sample model's 96^3, overlap 0.25, constant blending.
UNTRAINED_INFERENCE = {"roi_size": [64, 80, 48], "overlap": 0.5, "sw_batch_size": 2, "mode": "gaussian"}

pytestmark = [pytest.mark.slow, pytest.mark.triton]


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[LocalTritonServer, Path]]:
    folder = tmp_path_factory.mktemp("volume_mode")
    repo = folder / "repo"
    shutil.copytree(ROOT / "model_repository" / SAMPLE, repo / SAMPLE)
    torch.manual_seed(1)  # nobody trained it: whatever random weights give, both modes must agree voxel for voxel
    network = UNet(spatial_dims=3, in_channels=1, out_channels=2, channels=(8, 16, 32), strides=(2, 2), num_res_units=1)
    meta = nd_format({"image": (1, ["16*n"] * 3, "float32")}, {"pred": (2, ["16*n"] * 3, "float32")})
    build_repository(save_model(network, folder / "untrained.pt", {**meta, "inference": UNTRAINED_INFERENCE}), repo,
                     UNTRAINED)  # fmt: skip
    for name in (SAMPLE, UNTRAINED):
        wrap_network(repo, name)
    with LocalTritonServer(repo, startup_timeout_s=300.0) as server:
        yield server, repo


def run_app(source: Path, out: Path, served: tuple[LocalTritonServer, Path], *extra: str, **env: str) -> np.ndarray:
    """Run the sample app on the local server; its labels on the canonical grid."""
    server, repo = served
    command = [sys.executable, str(APP), "-i", str(source), "-o", str(out), "-m", str(repo), "-l", "WARN"]
    command += ["--backend", server.grpc_url, *extra]
    result = warm_python.run(command, cwd=ROOT, timeout=900, env={**os.environ, **env})
    assert result.returncode == 0, result.stderr[-3000:]
    (line,) = [line for line in result.stderr.splitlines() if line.startswith("model ")]
    whole = "whole volume to" in line
    assert whole == ("volume" in extra or env.get("MONAI_TRITON_MODE") == "volume"), line
    return np.asarray(nib.as_closest_canonical(nib.load(out / "seg.nii.gz")).dataobj)


@pytest.fixture(scope="module")
def window_labels(sample_labels: Path) -> np.ndarray:
    """Window mode's labels of the sample model on the whole MRI: the torch backend's run that the sample app's tests
    share (``sample_labels``; ``test_brain_tissue_seg.py`` shows this server's window mode gives them exactly)."""
    return np.asarray(nib.as_closest_canonical(nib.load(sample_labels / "seg.nii.gz")).dataobj)


@pytest.mark.parametrize("source", ["nifti", "dicom"])
def test_the_sample_app_gives_window_modes_labels_in_volume_mode(
    source: str, served: tuple[LocalTritonServer, Path], sample_data: Path, window_labels: np.ndarray, tmp_path: Path
) -> None:
    """NIfTI with the mode from the environment, DICOM with ``--mode``: the app's code is the same."""
    if source == "nifti":
        labels = run_app(sample_data / "t1.nii.gz", tmp_path, served, MONAI_TRITON_MODE="volume")
    else:
        labels = run_app(sample_data / "dicom", tmp_path, served, "--mode", "volume")
        assert list(tmp_path.glob("*.dcm")), "the DICOM SEG is written as in window mode"
    assert set(np.unique(window_labels).tolist()) == {0, 1, 2}
    np.testing.assert_array_equal(labels, window_labels)


def test_an_untrained_two_class_model_with_another_roi_gives_the_same_labels_in_both_modes(
    served: tuple[LocalTritonServer, Path], sample_data: Path, tmp_path: Path
) -> None:
    """On a crop of the MRI (112 x 128 x 96 voxels: 3 x 3 x 3 windows of 64 x 80 x 48 at overlap 0.5, so the
    gaussian blending of overlapping windows is exercised), not the whole head's 210 windows twice."""
    image = nib.load(sample_data / "t1.nii.gz")
    source = tmp_path / "crop.nii.gz"
    nib.save(image.slicer[40:152, 50:178, 40:136], source)
    window = run_app(source, tmp_path / "window", served, "--model-name", UNTRAINED)
    volume = run_app(source, tmp_path / "volume", served, "--model-name", UNTRAINED, "--mode", "volume")
    assert set(np.unique(window).tolist()) == {0, 1}
    np.testing.assert_array_equal(volume, window)
