"""What an app was given as input: a NIfTI file or a folder holding a DICOM series.

Checked before the graph runs, so an empty folder or a folder without DICOM fails at once with a
message naming the path, and no operator writes anything.
"""

from __future__ import annotations

from pathlib import Path
from typing import Literal

from pydicom.misc import is_dicom

from ..errors import InputDataError

InputKind = Literal["nifti", "dicom"]
NIFTI_SUFFIXES = (".nii", ".nii.gz")


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


def _is_dicom(path: Path) -> bool:
    try:
        return bool(is_dicom(path))
    except OSError:
        return False
