"""What apps accept as input, refused early with the path named."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pydicom
import pytest
from pydicom.dataset import FileMetaDataset
from pydicom.uid import ExplicitVRLittleEndian, MRImageStorage, generate_uid

from monai_triton_ops.errors import InputDataError
from monai_triton_ops.pipeline.inputs import classify_input


def write_dicom(path: Path, modality: str = "MR") -> None:
    """One tiny DICOM image file (2 x 2 pixels) of ``modality``."""
    meta = FileMetaDataset()
    meta.MediaStorageSOPClassUID = MRImageStorage
    meta.MediaStorageSOPInstanceUID = generate_uid()
    meta.TransferSyntaxUID = ExplicitVRLittleEndian
    ds = pydicom.Dataset()
    ds.file_meta = meta
    ds.SOPClassUID, ds.SOPInstanceUID, ds.Modality = MRImageStorage, meta.MediaStorageSOPInstanceUID, modality
    ds.Rows = ds.Columns = 2
    ds.BitsAllocated, ds.BitsStored, ds.HighBit, ds.PixelRepresentation = 16, 16, 15, 0
    ds.SamplesPerPixel, ds.PhotometricInterpretation = 1, "MONOCHROME2"
    ds.PixelData = np.zeros((2, 2), np.uint16).tobytes()
    ds.save_as(path, enforce_file_format=True)


def test_a_nifti_file_and_a_dicom_folder_are_recognised(tmp_path: Path) -> None:
    nifti = tmp_path / "t1.nii.gz"
    nifti.write_bytes(b"")
    assert classify_input(nifti) == "nifti"
    (tmp_path / "series" / "sub").mkdir(parents=True)
    write_dicom(tmp_path / "series" / "sub" / "IM0001")  # no suffix, nested: still found
    assert classify_input(tmp_path / "series") == "dicom"


def test_an_empty_folder_is_refused(tmp_path: Path) -> None:
    with pytest.raises(InputDataError, match=r"input folder '.*' is empty"):
        classify_input(tmp_path)


def test_a_folder_without_dicom_is_refused_with_a_hint(tmp_path: Path) -> None:
    (tmp_path / "notes.txt").write_text("not an image")
    (tmp_path / "t1.nii.gz").write_bytes(b"")
    with pytest.raises(InputDataError, match=r"holds no DICOM series \(2 file\(s\), none of them DICOM\).*t1\.nii\.gz"):
        classify_input(tmp_path)


def test_missing_paths_and_other_files_are_refused(tmp_path: Path) -> None:
    with pytest.raises(InputDataError, match="does not exist"):
        classify_input(tmp_path / "nope")
    png = tmp_path / "slice.png"
    png.write_bytes(b"\x89PNG")
    with pytest.raises(InputDataError, match="not NIfTI"):
        classify_input(png)


def test_dicom_without_the_image_series_the_app_selects_is_refused(tmp_path: Path) -> None:
    from monai_triton_ops.pipeline.inputs import check_dicom_images

    write_dicom(tmp_path / "IM0001")
    assert check_dicom_images(tmp_path, modality="MR")
    with pytest.raises(InputDataError, match=r"holds no DICOM CT image series \(found: 1 MR file\(s\)\)"):
        check_dicom_images(tmp_path, modality="CT")
    report = pydicom.dcmread(tmp_path / "IM0001")
    for tag in ("Rows", "Columns", "PixelData"):
        delattr(report, tag)
    report.Modality = "SR"
    report.save_as(tmp_path / "IM0001")
    with pytest.raises(InputDataError, match=r"holds no DICOM image series \(found: 1 SR \(not an image\) file\(s\)\)"):
        check_dicom_images(tmp_path)
