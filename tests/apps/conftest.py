"""What the app tests share: the sample app's input data, written once per session."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

APP = Path(__file__).resolve().parents[2] / "apps" / "brain_tissue_seg"


@pytest.fixture(scope="session")
def sample_data(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The MNI T1 as NIfTI (``t1.nii.gz``) and as a DICOM MR series (``dicom/``), with reference ``labels.nii.gz``."""
    out = tmp_path_factory.mktemp("sample") / "brain_tissue_seg"
    subprocess.run([sys.executable, str(APP / "make_sample_data.py"), "--out", str(out)], check=True, timeout=600)
    return out
