"""``apps/bundle_detect`` run as a user runs it: a process, the detection bundle given with ``-m``, JSON out.

NIfTI in: the boxes, labels and scores in the JSON file are MONAI alone's on the same file (``monai.bundle``'s
``ConfigWorkflow``), exactly, on ``torch``. A DICOM CT series in, from a repository ``repo build`` made of the bundle
(the network from there, the configs beside it): a result per box, boxes in world coordinates inside the volume.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from monai_triton_ops.repository.bundle import build_bundle

from .. import warm_python
from ..bundles.heads import detection_maker, run_with_monai
from .test_bundle_seg import write_ct_series

ROOT = Path(__file__).resolve().parents[2]
APP = ROOT / "apps" / "bundle_detect"

pytestmark = pytest.mark.slow


def run_app(*args: str | Path) -> subprocess.CompletedProcess[str]:
    command = [sys.executable, str(APP), *map(str, args), "--backend", "torch"]
    result = warm_python.run(command, cwd=ROOT, timeout=600)
    assert result.returncode == 0, result.stderr[-3000:]
    return result


def test_nifti_in_gives_monai_alones_boxes(tmp_path: Path) -> None:
    maker = detection_maker()
    bundle, ct = maker.make_bundle(tmp_path), maker.write_volume(tmp_path / "ct.nii.gz")
    run_app("-i", ct, "-o", tmp_path / "out", "-m", bundle)
    document = json.loads((tmp_path / "out" / "ct_result.json").read_text())
    reference = run_with_monai(bundle, ct)
    assert document["filename"] == "ct"
    assert len(document["box"]) > 0
    for key in ("box", "label", "label_scores"):
        np.testing.assert_array_equal(np.asarray(document[key]), np.asarray(reference[key]), err_msg=key)


def test_a_dicom_series_from_a_built_repository(tmp_path: Path) -> None:
    maker = detection_maker()
    bundle = maker.make_bundle(tmp_path / "bundles")
    build_bundle(bundle, tmp_path / "models")
    volume, _ = maker.ct_volume()
    write_ct_series(volume, tmp_path / "dicom", (0.703125, 0.703125, 1.25))
    run_app("-i", tmp_path / "dicom", "-o", tmp_path / "out", "-m", tmp_path / "models")
    document = json.loads((tmp_path / "out" / "dicom_result.json").read_text())
    boxes = np.asarray(document["box"]).reshape(-1, 6)
    assert len(boxes) == len(document["label"]) == len(document["label_scores"]) > 0
    extent = np.asarray(volume.shape) * np.array([0.703125, 0.703125, 1.25])
    assert np.all(np.abs(boxes[:, :3]) <= extent + 1.0)  # centres inside the volume, whatever the orientation
