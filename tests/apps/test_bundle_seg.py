"""``apps/bundle_seg``, the App SDK's spleen app ported, run as a user runs it: a process, a bundle given with ``-m``.

NIfTI in: the labels must be exactly those of the App SDK's own ``MonaiBundleInferenceOperator`` on the same
image. DICOM CT series in (selected as the spleen app selects it), from a repository that ``repo build`` made of the
bundle: the labels as NIfTI on the input's grid, and a DICOM SEG whose segments are the bundle's channels.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import nibabel as nib
import numpy as np
import pydicom
import pytest
from monai.deploy.core import AppContext, Application, Image, IOType
from monai.deploy.operators.monai_bundle_inference_operator import IOMapping, MonaiBundleInferenceOperator
from pydicom.dataset import Dataset, FileMetaDataset
from pydicom.uid import CTImageStorage, ExplicitVRLittleEndian, generate_uid

from monai_triton_ops import InferenceOperator
from monai_triton_ops.operators.nifti import read_nifti
from monai_triton_ops.repository.bundle import build_bundle

from .. import warm_python
from ..bundles.makers import unet_bundle
from ..operators.test_bundle import Ports

ROOT = Path(__file__).resolve().parents[2]
APP = ROOT / "apps" / "bundle_seg"

pytestmark = pytest.mark.slow


def run_app(*args: str | Path) -> subprocess.CompletedProcess[str]:
    command = [sys.executable, str(APP), *map(str, args), "--backend", "torch"]
    result = warm_python.run(command, cwd=ROOT, timeout=600)
    assert result.returncode == 0, result.stderr[-3000:]
    return result


def ct_volume() -> np.ndarray:
    """(X, Y, Z) CT-like values with structure, so the labels are not one class."""
    rng = np.random.default_rng(3)
    data = rng.standard_normal((30, 26, 12)) * 60 + 50
    data[:, :13] += 80
    return data


def write_ct_series(volume: np.ndarray, folder: Path, spacing: tuple[float, float, float]) -> None:
    """One CT file per axial slice, identity orientation (LPS), ``PixelSpacing`` ``[row, column]``."""
    folder.mkdir(parents=True)
    study, series, frame = generate_uid(), generate_uid(), generate_uid()
    stored = np.clip(volume + 1024, 0, 4095).astype(np.uint16)
    for k in range(volume.shape[2]):
        meta = FileMetaDataset()
        meta.MediaStorageSOPClassUID, meta.MediaStorageSOPInstanceUID = CTImageStorage, generate_uid()
        meta.TransferSyntaxUID = ExplicitVRLittleEndian
        ds = Dataset()
        ds.file_meta = meta
        ds.SOPClassUID, ds.SOPInstanceUID = CTImageStorage, meta.MediaStorageSOPInstanceUID
        ds.Modality, ds.PatientID, ds.PatientName, ds.StudyDescription = "CT", "p1", "Test^Bundle", "abdomen"
        ds.PatientBirthDate, ds.PatientSex, ds.Manufacturer = "19700101", "O", "test"
        ds.StudyInstanceUID, ds.SeriesInstanceUID, ds.FrameOfReferenceUID = study, series, frame
        ds.SeriesDescription, ds.SeriesNumber, ds.InstanceNumber = "axial", 1, k + 1
        ds.StudyDate, ds.StudyTime, ds.AccessionNumber, ds.ReferringPhysicianName, ds.StudyID = (
            "20260101",
            "",
            "",
            "",
            "",
        )
        ds.Rows, ds.Columns = volume.shape[1], volume.shape[0]
        ds.PixelSpacing = [spacing[1], spacing[0]]  # [between rows (y), between columns (x)]
        ds.SliceThickness = spacing[2]
        ds.ImageOrientationPatient = [1, 0, 0, 0, 1, 0]
        ds.ImagePositionPatient = [0.0, 0.0, k * spacing[2]]
        ds.RescaleSlope, ds.RescaleIntercept = 1, -1024
        ds.BitsAllocated, ds.BitsStored, ds.HighBit, ds.PixelRepresentation = 16, 12, 11, 0
        ds.SamplesPerPixel, ds.PhotometricInterpretation = 1, "MONOCHROME2"
        ds.PixelData = np.ascontiguousarray(stored[:, :, k].T).tobytes()  # rows (y) by columns (x)
        ds.save_as(folder / f"IM{k + 1:04d}.dcm", enforce_file_format=True)


def test_nifti_in_gives_the_app_sdk_operators_labels(tmp_path: Path) -> None:
    bundle = unet_bundle(tmp_path / "spleen")
    nib.save(nib.Nifti1Image(ct_volume().astype(np.float32), np.diag([1.2, 1.2, 2.5, 1.0])), tmp_path / "ct.nii.gz")
    run_app("-i", tmp_path / "ct.nii.gz", "-o", tmp_path / "out", "-m", bundle)
    got = nib.load(tmp_path / "out" / "seg.nii.gz")
    reference = MonaiBundleInferenceOperator(
        Application(),
        app_context=AppContext({}),
        bundle_path=bundle,
        input_mapping=[IOMapping("image", Image, IOType.IN_MEMORY)],
        output_mapping=[IOMapping("pred", Image, IOType.IN_MEMORY)],
    )
    ports = Ports({"image": read_nifti(tmp_path / "ct.nii.gz")})
    reference.compute(ports, ports, None)
    want = ports.emitted["pred"].asnumpy().T  # (D, H, W) -> NIfTI (X, Y, Z)
    assert got.shape == want.shape == (30, 26, 12)
    assert len(np.unique(want)) > 1
    assert int(np.count_nonzero(np.asarray(got.dataobj) != want)) == 0
    np.testing.assert_allclose(got.affine, np.diag([1.2, 1.2, 2.5, 1.0]))


def test_dicom_in_from_a_built_repository_gives_labels_and_a_dicom_seg(tmp_path: Path) -> None:
    repo = tmp_path / "models"
    build_bundle(unet_bundle(tmp_path / "spleen", "pt"), repo)
    write_ct_series(ct_volume(), tmp_path / "dicom", (1.2, 1.2, 2.5))
    run_app("-i", tmp_path / "dicom", "-o", tmp_path / "out", "-m", repo)
    labels = nib.load(tmp_path / "out" / "seg.nii.gz")
    assert labels.shape == (30, 26, 12)
    assert len(np.unique(np.asarray(labels.dataobj))) > 1
    (seg_file,) = (tmp_path / "out").glob("*.dcm")
    seg = pydicom.dcmread(seg_file)
    assert seg.Modality == "SEG"
    assert [s.SegmentLabel for s in seg.SegmentSequence] == ["label1", "label2"]  # the bundle's channel_def


def test_the_sample_model_as_a_bundle_gives_the_app_sdk_operators_labels(sample_data: Path, tmp_path: Path) -> None:
    """``apps/brain_tissue_seg/make_bundle.py``: the committed model in the zoo's layout, on the sample MRI.

    On the sample's brain, cropped to 160 x 168 x 160 voxels (its affine kept): 2 x 2 x 2 windows of the bundle's
    96^3 inferer, so the blending runs, at under a third of the whole image's CPU (two inferences of 27 windows
    each took ~28 s of CPU). Agreement with the reference labels is 0.93 on the crop (0.98 on the whole image).
    """
    import importlib.util

    spec = importlib.util.spec_from_file_location("make_bundle", ROOT / "apps" / "brain_tissue_seg" / "make_bundle.py")
    assert spec is not None
    assert spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    bundle = module.make_bundle(tmp_path)
    crop = (slice(18, 178), slice(32, 200), slice(14, 174))  # (X, Y, Z) of the NIfTI
    nib.save(nib.load(sample_data / "t1.nii.gz").slicer[crop], tmp_path / "t1_brain.nii.gz")
    image = read_nifti(tmp_path / "t1_brain.nii.gz")
    mapping = {
        "input_mapping": [IOMapping("image", Image, IOType.IN_MEMORY)],
        "output_mapping": [IOMapping("pred", Image, IOType.IN_MEMORY)],
    }
    reference = MonaiBundleInferenceOperator(Application(), app_context=AppContext({}), bundle_path=bundle, **mapping)
    ours = InferenceOperator(Application(), bundle_path=bundle, backend="torch", **mapping)
    ports = Ports({"image": image})
    reference.compute(ports, ports, None)
    want = ports.emitted["pred"].asnumpy()
    ours.start()
    try:
        ours.compute(ports, ports, None)
    finally:
        ours.stop()
    got = ports.emitted["pred"].asnumpy()
    assert set(np.unique(want)) == {0, 1, 2}
    assert int(np.count_nonzero(got != want)) == 0
    assert got.shape == (160, 168, 160)[::-1]
    truth = np.asarray(nib.load(sample_data / "labels.nii.gz").slicer[crop].dataobj).T  # (D, H, W)
    agree = float(np.mean(got == truth))
    assert agree > 0.9, f"only {agree:.3f} of the voxels agree with the sample's reference labels"
