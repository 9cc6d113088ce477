"""Shared by the packaging tests: one wheel of this checkout and one build context of the sample app per session."""

from __future__ import annotations

from pathlib import Path

import pytest

from monai_triton_ops.packaging import PackageRequest
from monai_triton_ops.packaging.context import BuildContext, write_context
from monai_triton_ops.packaging.wheel import project_wheel

ROOT = Path(__file__).resolve().parents[2]
APP = ROOT / "apps" / "brain_tissue_seg"
MODELS = ROOT / "model_repository"
BASE = "localhost/monai-triton-base:test"


@pytest.fixture(scope="session")
def wheel(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """This checkout as a wheel, built once (pip wheel, about 10 s)."""
    return project_wheel(tmp_path_factory.mktemp("wheel"))


@pytest.fixture(scope="session")
def sample_context(wheel: Path, tmp_path_factory: pytest.TempPathFactory) -> BuildContext:
    """The sample app's build context, written as ``monai-triton package --no-build`` writes it."""
    out = tmp_path_factory.mktemp("context") / "brain_tissue_seg"
    return write_context(PackageRequest(app=APP, models=MODELS, output=out, wheel=wheel), base_image=BASE)
