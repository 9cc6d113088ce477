"""What an app was given as input: a NIfTI file or a folder holding a DICOM series.

Checked before the graph runs, so an empty folder, a folder without DICOM, or DICOM without the
image series the app selects fails at once with a message naming the path (and, for DICOM, the
series that are there), and no operator writes anything.
"""

from __future__ import annotations

from collections import Counter
from pathlib import Path
from typing import Literal

import pydicom
from pydicom.errors import InvalidDicomError
from pydicom.misc import is_dicom

from ..errors import InputDataError

InputKind = Literal["nifti", "dicom"]
NIFTI_SUFFIXES = (".nii", ".nii.gz")
#: Modalities of DICOM objects that are not images a model can segment (segmentations, reports, RT structures...).
NON_IMAGE_MODALITIES = frozenset({"SEG", "SR", "RTSTRUCT", "RTPLAN", "RTDOSE", "PR", "KO", "REG", "DOC"})


def classify_input(path: str | Path) -> InputKind:
    """``"nifti"`` for a NIfTI file, ``"dicom"`` for a folder with DICOM files, else ``InputDataError``."""
    path = Path(path)
    if path.is_file():
        if path.name.endswith(NIFTI_SUFFIXES):
            return "nifti"
        raise InputDataError(f"input {str(path)!r} is a file but not NIfTI (.nii/.nii.gz); give a DICOM folder instead")
    if not path.is_dir():
        raise InputDataError(f"input {str(path)!r} does not exist")
    files = [p for p in sorted(path.rglob("*")) if p.is_file()]
    if not files:
        raise InputDataError(f"input folder {str(path)!r} is empty: expected a DICOM series or a NIfTI file")
    niftis = [p for p in files if p.name.endswith(NIFTI_SUFFIXES)]
    if any(_is_dicom(p) for p in files):
        return "dicom"
    hint = f"; for NIfTI input pass the file itself, e.g. {str(niftis[0])!r}" if niftis else ""
    raise InputDataError(
        f"input folder {str(path)!r} holds no DICOM series ({len(files)} file(s), none of them DICOM){hint}"
    )


def check_dicom_images(path: str | Path, *, modality: str | None = None) -> Path:
    """A file of the first DICOM image series in ``path`` (of ``modality`` when given); else ``InputDataError``.

    Headers only are read, and reading stops at the first match.
    """
    folder = Path(path)
    found: Counter[str] = Counter()
    for file in sorted(p for p in folder.rglob("*") if p.is_file()):
        try:
            ds = pydicom.dcmread(file, stop_before_pixels=True)
        except (InvalidDicomError, OSError, ValueError):
            continue
        kind = str(getattr(ds, "Modality", "") or "no modality")
        is_image = "Rows" in ds and "Columns" in ds and kind.upper() not in NON_IMAGE_MODALITIES
        if is_image and (modality is None or kind.upper() == modality.upper()):
            return file
        found[kind if is_image else f"{kind} (not an image)"] += 1
    wanted = f"{modality} image series" if modality else "image series"
    seen = ", ".join(f"{count} {kind} file(s)" for kind, count in sorted(found.items())) or "no readable DICOM file"
    raise InputDataError(f"input folder {str(folder)!r} holds no DICOM {wanted} (found: {seen})")


def _is_dicom(path: Path) -> bool:
    try:
        return bool(is_dicom(path))
    except OSError:
        return False
