"""``apps/bundle_classify`` and the App SDK's breast density app migrated to a bundle, run as a user runs them.

PNG files in: one JSON file each, with the scores of the bundle run by MONAI alone and the bundle's class names.
A file the loader cannot read: one error line naming it, exit code 2. A single-instance DICOM MG image (no
``nifti_affine_transform``, as every MG image reaches a bundle) through the App SDK's example graph with our operator
in place of its ``ClassifierOperator``: the App SDK's own ``DICOMTextSRWriterOperator`` writes the scores into a
DICOM SR, the same as our operator gives in this process for that image.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pydicom
import pytest
from monai.deploy.core import Application, Image, IOType
from monai.deploy.operators.monai_bundle_inference_operator import IOMapping
from pydicom.dataset import Dataset, FileMetaDataset
from pydicom.uid import ExplicitVRLittleEndian, generate_uid

from monai_triton_ops import InferenceOperator

from .. import warm_python
from ..bundles.classify import CLASSES, classify_bundle, monai_alone, png_images
from ..operators.test_bundle import Ports

ROOT = Path(__file__).resolve().parents[2]
APP = ROOT / "apps" / "bundle_classify"
SR_APP = Path(__file__).resolve().parent / "breast_density" / "app.py"
MG_STORAGE = "1.2.840.10008.5.1.4.1.1.1.2"  # Digital Mammography X-Ray Image Storage - For Presentation

pytestmark = pytest.mark.slow


def run(app: Path, *args: str | Path) -> subprocess.CompletedProcess[str]:
    return warm_python.run([sys.executable, str(app), *map(str, args)], cwd=ROOT, timeout=600)


def test_png_images_in_give_one_json_each_with_monai_alones_scores(tmp_path: Path) -> None:
    bundle = classify_bundle(tmp_path / "bundle")
    files = png_images(tmp_path / "images")
    result = run(APP, "-i", tmp_path / "images", "-o", tmp_path / "out", "-m", bundle, "--backend", "torch")
    assert result.returncode == 0, result.stderr[-3000:]
    assert sorted(p.name for p in (tmp_path / "out").glob("*.json")) == [f"{f.stem}_result.json" for f in files]
    for path, want in zip(files, monai_alone(bundle, files), strict=True):
        got = json.loads((tmp_path / "out" / f"{path.stem}_result.json").read_text())
        assert got["filename"] == path.stem
        assert list(got["probabilities"]) == list(CLASSES)
        np.testing.assert_allclose(list(got["probabilities"].values()), want, rtol=0, atol=1e-6)
        assert got["predicted_class"] == CLASSES[int(np.argmax(want))]
    broken = tmp_path / "broken.png"
    broken.write_bytes(b"\x89PNG\r\n\x1a\n not really")
    result = run(APP, "-i", broken, "-o", tmp_path / "out2", "-m", bundle)
    assert result.returncode == 2, result.stderr[-2000:]
    lines = [line for line in result.stderr.splitlines() if line.startswith(("error:", "Traceback"))]
    assert len(lines) == 1, result.stderr[-2000:]
    assert "broken.png' cannot be read as a 2D image" in lines[0]


def write_mg(path: Path, pixels: np.ndarray) -> None:
    """One DICOM MG image: a single-instance series, as every mammogram is."""
    meta = FileMetaDataset()
    meta.MediaStorageSOPClassUID, meta.MediaStorageSOPInstanceUID = MG_STORAGE, generate_uid()
    meta.TransferSyntaxUID = ExplicitVRLittleEndian
    ds = Dataset()
    ds.file_meta = meta
    ds.SOPClassUID, ds.SOPInstanceUID = MG_STORAGE, meta.MediaStorageSOPInstanceUID
    ds.Modality, ds.PatientID, ds.PatientName, ds.PatientBirthDate, ds.PatientSex = "MG", "p1", "Test^MG", "", "F"
    ds.StudyInstanceUID, ds.SeriesInstanceUID, ds.FrameOfReferenceUID = generate_uid(), generate_uid(), generate_uid()
    ds.StudyDate, ds.StudyTime, ds.AccessionNumber, ds.ReferringPhysicianName, ds.StudyID = "20260101", "", "", "", ""
    ds.StudyDescription, ds.SeriesDescription, ds.SeriesNumber, ds.InstanceNumber = "mammo", "L CC", 1, 1
    ds.ImageType, ds.Manufacturer = ["ORIGINAL", "PRIMARY"], "test"
    ds.Rows, ds.Columns = pixels.shape
    ds.PixelSpacing = [0.1, 0.1]
    ds.ImageOrientationPatient, ds.ImagePositionPatient = [1, 0, 0, 0, 1, 0], [0.0, 0.0, 0.0]
    ds.BitsAllocated, ds.BitsStored, ds.HighBit, ds.PixelRepresentation = 16, 12, 11, 0
    ds.SamplesPerPixel, ds.PhotometricInterpretation = 1, "MONOCHROME2"
    ds.PixelData = np.ascontiguousarray(pixels.astype(np.uint16)).tobytes()
    path.parent.mkdir(parents=True, exist_ok=True)
    ds.save_as(path, enforce_file_format=True)


def test_the_app_sdks_breast_density_app_migrated_writes_the_scores_into_a_dicom_sr(tmp_path: Path) -> None:
    bundle = classify_bundle(tmp_path / "bundle", channels=1)
    rng = np.random.default_rng(5)
    pixels = rng.integers(0, 4000, (48, 40)).astype(np.uint16)
    pixels[:20] = 3900
    write_mg(tmp_path / "dicom" / "MG0001.dcm", pixels)
    result = run(SR_APP, "-i", tmp_path / "dicom", "-o", tmp_path / "out", "-m", bundle)
    assert result.returncode == 0, result.stderr[-3000:]
    (sr_file,) = (tmp_path / "out").glob("*.dcm")
    sr = pydicom.dcmread(sr_file)
    assert sr.Modality == "SR"
    text = sr.ContentSequence[0].TextValue
    got = json.loads(text)
    assert list(got["probabilities"]) == list(CLASSES)
    # the same image in this process, as DICOMSeriesToVolumeOperator hands it on: (1, rows, columns), no affine
    spacing = {"row_pixel_spacing": 0.1, "col_pixel_spacing": 0.1, "depth_pixel_spacing": 1.0}
    image = Image(pixels[None].astype(np.float32), metadata={"SeriesInstanceUID": "1", **spacing})
    op = InferenceOperator(
        Application(),
        bundle_path=bundle,
        backend="torch",
        input_mapping=[IOMapping("image", Image, IOType.IN_MEMORY)],
        output_mapping=[IOMapping("pred", dict, IOType.IN_MEMORY)],
    )
    op.start()
    try:
        ports = Ports({"image": image})
        op.compute(ports, ports, None)
    finally:
        op.stop()
    want = ports.emitted["pred"]
    assert got["predicted_class"] == want["predicted_class"]
    np.testing.assert_allclose(
        list(got["probabilities"].values()), list(want["probabilities"].values()), rtol=0, atol=1e-5
    )
