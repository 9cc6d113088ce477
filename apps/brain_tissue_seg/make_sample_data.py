"""Write the sample app's input data: the ICBM152 T1 as NIfTI and as a DICOM MR series, plus the atlas labels.

Output (``--out``, default ``data/brain_tissue_seg`` under the repository root, which git ignores)::

    t1.nii.gz       float32 T1 in [0, 1], 197 x 233 x 189 voxels of 1 mm, RAS+ (MNI152 space)
    labels.nii.gz   uint8 reference labels: 0 background, 1 grey matter, 2 white matter
    dicom/          the same T1 as 189 axial MR Image Storage files, one per slice, inferior to superior

The DICOM geometry is chosen so that the MONAI Deploy ``DICOMSeriesToVolumeOperator`` volume, transposed as
``MonaiSegInferenceOperator`` does (``Image.asnumpy().T``), is voxel for voxel the NIfTI array, and its
``nifti_affine_transform`` is the NIfTI affine: column index = NIfTI i, row index = NIfTI j, slice = NIfTI k.
In LPS terms the rows run towards the patient's right and the columns towards anterior
(ImageOrientationPatient ``[-1, 0, 0, 0, -1, 0]``), so a plain 2D viewer shows the slices rotated by 180 degrees.
Intensities are stored as uint16 with RescaleSlope (intercept 0, so the background stays exactly 0).

UIDs are derived from fixed strings, and dates are fixed, so a re-run writes the same series again; the run
builds everything in a temporary folder next to ``--out`` and then swaps it in, so no half-written data is left.
"""

from __future__ import annotations

import argparse
import logging
import shutil
import sys
import tempfile
from collections.abc import Sequence
from pathlib import Path

import nibabel as nib
import numpy as np
import pydicom
from pydicom.dataset import Dataset, FileMetaDataset
from pydicom.uid import PYDICOM_IMPLEMENTATION_UID, ExplicitVRLittleEndian, MRImageStorage, generate_uid
from pydicom.valuerep import format_number_as_ds

try:  # imported as part of a package (tests) or run as a script from its folder (MONAI Deploy style)
    from . import atlas
except ImportError:
    import atlas

logger = logging.getLogger("brain_tissue_seg.make_sample_data")

REPO_ROOT = Path(__file__).resolve().parents[2]
DEFAULT_OUT = REPO_ROOT / "data" / "brain_tissue_seg"
#: Fixed seed of every UID, so that re-running yields the same study, series and instances.
UID_SEED = "monai_triton_ops/apps/brain_tissue_seg/MNI152-ICBM2009a-T1"
#: RAS -> LPS: DICOM patient coordinates have x and y negated.
RAS_TO_LPS = np.diag([-1.0, -1.0, 1.0])
STORED_MAX = np.iinfo(np.uint16).max
STUDY_DATE = "20090101"  # fixed, the template's release year, so re-runs write identical headers


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    """Command-line options."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT, help="folder to (re)create (default: %(default)s)")
    return parser.parse_args(argv)


def uid(*parts: object) -> str:
    """A deterministic UID, unique per ``parts``."""
    return generate_uid(entropy_srcs=[UID_SEED, *map(str, parts)])


def ds_value(value: float) -> str:
    """``value`` as a DICOM DS string (at most 16 characters)."""
    return format_number_as_ds(float(value))


def rescale(volume: np.ndarray) -> tuple[np.ndarray, float]:
    """uint16 stored values and the RescaleSlope that maps them back (intercept 0).

    The slope is rounded UP to a 7-digit DS value first, so that the exact value written to the header is the
    one used to quantise and the maximum still fits in 16 bits; the error is at most slope / 2.
    """
    if volume.min() < 0:
        raise ValueError("the T1 must be non-negative (intercept 0 keeps its background exactly 0)")
    slope = float(f"{max(float(volume.max()), 1e-12) / STORED_MAX * (1 + 1e-6):.6e}")
    stored = np.clip(np.rint(volume / slope), 0, STORED_MAX).astype(np.uint16)
    return stored, slope


def geometry(affine: np.ndarray) -> tuple[list[float], list[float], np.ndarray, float]:
    """ImageOrientationPatient, PixelSpacing, the LPS position of voxel (0, 0, 0) and the slice step, from RAS.

    Columns of a slice follow NIfTI i and rows follow NIfTI j; slices follow k, which must point along
    row x column (positive determinant) so that sorting by position along the normal gives k order.
    """
    lps = RAS_TO_LPS @ affine[:3, :3]
    spacing = np.linalg.norm(lps, axis=0)
    if np.linalg.det(lps) <= 0:
        raise ValueError("the NIfTI affine must have a positive determinant (as RAS+ images do)")
    row_dir, col_dir = lps[:, 0] / spacing[0], lps[:, 1] / spacing[1]
    orientation = [float(v) for v in np.concatenate([row_dir, col_dir])]
    pixel_spacing = [float(spacing[1]), float(spacing[0])]  # (between rows, between columns)
    return orientation, pixel_spacing, RAS_TO_LPS @ affine[:3, 3], float(spacing[2])


def base_dataset(rows: int, columns: int, slope: float, vmax: float) -> Dataset:
    """Attributes shared by every slice: patient, study, series, frame of reference, pixel format."""
    ds = Dataset()
    ds.SpecificCharacterSet = "ISO_IR 100"
    ds.SOPClassUID = MRImageStorage
    ds.ImageType = ["DERIVED", "SECONDARY", "AXIAL"]  # an average of 152 brains, not one acquisition
    ds.PatientName = "MNI152^ICBM2009a"
    ds.PatientID = "MNI152"
    ds.PatientBirthDate = ""
    ds.PatientSex = ""
    ds.StudyInstanceUID = uid("study")
    ds.StudyID = "1"
    ds.StudyDate = ds.SeriesDate = ds.ContentDate = STUDY_DATE
    ds.StudyTime = ds.SeriesTime = ds.ContentTime = "000000"
    ds.AccessionNumber = ""
    ds.ReferringPhysicianName = ""
    ds.StudyDescription = "MNI ICBM152 2009a template (sample data)"
    ds.SeriesInstanceUID = uid("series", "t1")
    ds.SeriesNumber = 1
    ds.SeriesDescription = "T1 MNI ICBM152 2009a skull-stripped"
    ds.Modality = "MR"
    ds.BodyPartExamined = "BRAIN"
    ds.PatientPosition = "HFS"
    ds.Manufacturer = "MNI ICBM152 2009a via nilearn (monai_triton_ops sample data)"
    ds.InstitutionName = "McConnell Brain Imaging Centre, MNI, McGill University"
    ds.ImageComments = atlas.ATLAS_COPYRIGHT[:10240]
    ds.FrameOfReferenceUID = uid("frame-of-reference")
    ds.PositionReferenceIndicator = ""
    # MR Image module; the template was not acquired, so acquisition parameters are empty (type 2).
    ds.ScanningSequence = "RM"
    ds.SequenceVariant = "NONE"
    ds.ScanOptions = ""
    ds.MRAcquisitionType = "3D"
    ds.RepetitionTime = ds.EchoTime = ds.EchoTrainLength = None
    # Image pixel module: uint16 with a rescale back to the float T1.
    ds.SamplesPerPixel = 1
    ds.PhotometricInterpretation = "MONOCHROME2"
    ds.Rows, ds.Columns = rows, columns
    ds.BitsAllocated, ds.BitsStored, ds.HighBit, ds.PixelRepresentation = 16, 16, 15, 0
    ds.RescaleIntercept = "0"
    ds.RescaleSlope = ds_value(slope)
    if float(ds.RescaleSlope) != slope:
        raise ValueError(f"RescaleSlope {slope!r} does not survive as DS {ds.RescaleSlope!r}")
    ds.WindowCenter = ds_value(vmax / 2)
    ds.WindowWidth = ds_value(vmax)
    return ds


def slice_dataset(base: Dataset, stored: np.ndarray, k: int, affine: np.ndarray) -> Dataset:
    """One axial slice k (pixel [row, col] = volume[col, row, k]) with its own UID, number and position."""
    orientation, pixel_spacing, origin, step = geometry(affine)
    position = origin + (RAS_TO_LPS @ affine[:3, 2]) * k
    ds = Dataset()
    ds.update(base)
    ds.SOPInstanceUID = uid("instance", "t1", k)
    ds.InstanceNumber = k + 1
    ds.ImageOrientationPatient = [ds_value(v) for v in orientation]
    ds.ImagePositionPatient = [ds_value(v) for v in position]
    ds.SliceLocation = ds_value(position[2])
    ds.PixelSpacing = [ds_value(v) for v in pixel_spacing]
    ds.SliceThickness = ds.SpacingBetweenSlices = ds_value(step)
    ds.PixelData = np.ascontiguousarray(stored[:, :, k].T).tobytes()
    ds.file_meta = FileMetaDataset()
    ds.file_meta.MediaStorageSOPClassUID = ds.SOPClassUID
    ds.file_meta.MediaStorageSOPInstanceUID = ds.SOPInstanceUID
    ds.file_meta.TransferSyntaxUID = ExplicitVRLittleEndian
    ds.file_meta.ImplementationClassUID = PYDICOM_IMPLEMENTATION_UID
    return ds


def write_dicom_series(t1: nib.Nifti1Image, folder: Path) -> float:
    """Write ``t1`` as one MR file per axial slice into ``folder``; returns the RescaleSlope."""
    volume = np.asarray(t1.dataobj, dtype=np.float32)
    stored, slope = rescale(volume)
    base = base_dataset(rows=volume.shape[1], columns=volume.shape[0], slope=slope, vmax=float(volume.max()))
    folder.mkdir(parents=True)
    for k in range(volume.shape[2]):
        slice_dataset(base, stored, k, t1.affine).save_as(folder / f"IM{k + 1:04d}.dcm", enforce_file_format=True)
    logger.info(
        "wrote %d slices of %d x %d to %s (slope %.7g)", volume.shape[2], base.Rows, base.Columns, folder, slope
    )
    return slope


def read_dicom_series(folder: Path) -> tuple[np.ndarray, np.ndarray]:
    """Read a series back independently: sort along the slice normal, rescale; returns (X, Y, Z) and RAS affine."""
    slices = [pydicom.dcmread(path) for path in sorted(folder.glob("*.dcm"))]
    iop = np.asarray(slices[0].ImageOrientationPatient, dtype=float)
    normal = np.cross(iop[:3], iop[3:])
    slices.sort(key=lambda s: float(np.dot(normal, np.asarray(s.ImagePositionPatient, dtype=float))))
    volume = np.stack([s.pixel_array * float(s.RescaleSlope) + float(s.RescaleIntercept) for s in slices])
    first, last = (np.asarray(s.ImagePositionPatient, dtype=float) for s in (slices[0], slices[-1]))
    row_spacing, col_spacing = (float(v) for v in slices[0].PixelSpacing)
    lps = np.eye(4)
    lps[:3, 0] = iop[:3] * col_spacing
    lps[:3, 1] = iop[3:] * row_spacing
    lps[:3, 2] = (last - first) / (len(slices) - 1)
    lps[:3, 3] = first
    ras = np.diag([-1.0, -1.0, 1.0, 1.0]) @ lps
    return volume.transpose(2, 1, 0), ras  # (slice, row, col) -> (col, row, slice) = NIfTI (i, j, k)


def verify(out: Path, slope: float) -> float:
    """Check that the DICOM series reads back as the NIfTI T1 (same grid, values within slope / 2)."""
    t1 = nib.load(out / "t1.nii.gz")
    reference = np.asarray(t1.dataobj, dtype=np.float64)
    volume, affine = read_dicom_series(out / "dicom")
    if volume.shape != reference.shape or not np.allclose(affine, t1.affine, atol=1e-4):
        raise RuntimeError(f"DICOM grid {volume.shape}\n{affine}\ndiffers from NIfTI {reference.shape}\n{t1.affine}")
    max_diff = float(np.abs(volume - reference).max())
    if max_diff > slope / 2 * 1.001:
        raise RuntimeError(f"DICOM intensities differ from the NIfTI by {max_diff} > slope / 2 = {slope / 2}")
    return max_diff


def write_all(folder: Path) -> float:
    """Fill ``folder`` with the NIfTI files and the DICOM series; returns the RescaleSlope."""
    t1 = atlas.load_t1()
    nib.save(t1, folder / "t1.nii.gz")
    nib.save(atlas.load_labels(), folder / "labels.nii.gz")
    return write_dicom_series(t1, folder / "dicom")


def replace_folder(new: Path, out: Path) -> None:
    """Swap ``new`` in as ``out``, removing the previous ``out`` only once the new one is in place."""
    old = out.with_name(f".{out.name}.old")
    shutil.rmtree(old, ignore_errors=True)
    if out.exists():
        out.rename(old)
    new.rename(out)
    shutil.rmtree(old, ignore_errors=True)


def main(argv: Sequence[str] | None = None) -> int:
    """Write everything to a temporary sibling of ``--out``, swap it in, then verify the DICOM round trip."""
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    out = parse_args(argv).out.resolve()
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{out.name}.tmp-", dir=out.parent))
    tmp.chmod(0o755)  # mkdtemp makes it private; the data is meant to be shared like any other folder
    try:
        slope = write_all(tmp)
        replace_folder(tmp, out)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    max_diff = verify(out, slope)
    print(f"wrote {out}: t1.nii.gz, labels.nii.gz, dicom/ ({len(list((out / 'dicom').glob('*.dcm')))} slices)")
    print(f"DICOM vs NIfTI: same grid and affine; max abs difference {max_diff:.3g} (RescaleSlope {slope:.7g})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
