"""The App SDK's own ``ai_remote_infer_app`` moves over unchanged but for the operator (issue 17).

Both apps run as users run them, as real App SDK applications in their own processes, against one real
local tritonserver serving a stand-in of the example's network (the spleen bundle's 3D UNet, random
weights) from a repository made from the example's client-side ``config.pbtxt``:

- the original: the App SDK's ``MonaiSegInferenceOperator`` with its ``TritonRemoteModel`` (``-t HOST:PORT``);
- the port: ``port.patch`` applied (``InferenceOperator`` in its place, this package's ``init_app_context``
  and ``run_app``); its dictionary transforms (``LoadImaged`` ... ``Invertd``, ``SaveImaged``) unchanged.

Their outputs are identical: the DICOM SEG's pixels and the NIfTI files the transforms save. The
example's code is not part of this repository (see ``remote_infer/fixture.py``): without a checkout the
tests that run it are skipped; the size of the migration is checked from the patch alone.
"""

from __future__ import annotations

import sys
from collections.abc import Iterator
from pathlib import Path

import nibabel as nib
import numpy as np
import pydicom
import pytest

from monai_triton_ops.server import LocalTritonServer

from .. import warm_python
from .remote_infer import fixture

UPSTREAM = fixture.upstream_app()
needs_upstream = pytest.mark.skipif(
    UPSTREAM is None,
    reason="the App SDK example is not here: set MONAI_DEPLOY_APP_SDK_SRC to a monai-deploy-app-sdk checkout "
    f"(commit {fixture.UPSTREAM_COMMIT}) or put one at output/third_party/monai-deploy-app-sdk",
)
#: The constructor call is the one line of the operator that changes by design.
CONSTRUCTOR = ("infer_operator = MonaiSegInferenceOperator(", "infer_operator = InferenceOperator(")


def changed_lines(patch: Path) -> list[str]:
    """The added and removed lines of a unified diff (headers excluded)."""
    lines = patch.read_text().splitlines()
    return [
        line for line in lines if line[:1] in "+-" and not line.startswith(("+++", "---")) and not line[1:].isspace()
    ]


def test_the_port_changes_at_most_15_lines_outside_the_operators_constructor_call() -> None:
    changed = changed_lines(fixture.PORT_PATCH)
    outside = [line for line in changed if line[1:].strip() not in CONSTRUCTOR]
    assert len(changed) - len(outside) == 2  # the class name in the constructor call, and nothing else of it
    assert 0 < len(outside) <= 15, outside
    # The dictionary transforms are not touched: no changed line mentions a transform or the keys.
    assert not [line for line in changed if "Compose" in line or "keys=" in line or line.rstrip().endswith("d(")]


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Path, LocalTritonServer]]:
    assert UPSTREAM is not None
    base = tmp_path_factory.mktemp("remote_infer")
    fixture.write_ct_series(base / "ct")
    model = fixture.save_spleen_standin(base / "spleen.pt")
    client_folder = UPSTREAM / "models_client_side" / fixture.MODEL_NAME
    repo = fixture.server_repository(client_folder, model, base / "server_repository")
    with LocalTritonServer(repo) as server:
        yield base, server


def run_example(app: Path, base: Path, out: str, *extra: str) -> Path:
    """Run an app folder as ``python APP -i -o -m ...`` in its own working folder (SaveImaged writes there)."""
    cwd = base / f"{out}_cwd"
    cwd.mkdir()
    command = [sys.executable, str(app), "-i", str(base / "ct"), "-o", str(base / out)]
    command += ["-m", str(app / "models_client_side"), *extra]
    result = warm_python.run(command, cwd=cwd, timeout=600)
    assert result.returncode == 0, result.stderr[-4000:]
    return cwd


def seg_pixels(folder: Path) -> np.ndarray:
    (path,) = folder.glob("*.dcm")
    dataset = pydicom.dcmread(path)
    assert dataset.Modality == "SEG"
    return np.asarray(dataset.pixel_array)


def saved(cwd: Path, segmentation: bool) -> nib.Nifti1Image:
    """The NIfTI a ``SaveImaged`` of the example wrote: the labels (``_seg``) or the loaded image."""
    files = (cwd / "output" / "saved_images_folder").rglob("*.nii")
    (path,) = [p for p in files if p.name.endswith("_seg.nii") == segmentation]
    return nib.load(path)


@needs_upstream
@pytest.mark.slow
@pytest.mark.triton
def test_the_original_and_the_port_give_identical_outputs(
    served: tuple[Path, LocalTritonServer], tmp_path: Path
) -> None:
    base, server = served
    assert UPSTREAM is not None
    netloc = server.http_url.split("://", 1)[1]
    original = fixture.copy_app(UPSTREAM, tmp_path / "original")
    port = fixture.copy_app(UPSTREAM, tmp_path / "port", fixture.PORT_PATCH)
    original_cwd = run_example(original, base, "original_out", "-t", netloc)  # TritonRemoteModel, HTTP + JSON
    port_cwd = run_example(port, base, "port_out", "-t", netloc)  # this package's remote backend

    labels = seg_pixels(base / "original_out")
    np.testing.assert_array_equal(seg_pixels(base / "port_out"), labels)
    assert labels.any()
    for segmentation in (True, False):  # the labels after Invertd, the image after LoadImaged (SaveImaged's files)
        a, b = saved(original_cwd, segmentation), saved(port_cwd, segmentation)
        np.testing.assert_array_equal(np.asarray(b.dataobj), np.asarray(a.dataobj))
        np.testing.assert_array_equal(b.affine, a.affine)
    values = np.unique(np.asarray(saved(port_cwd, True).dataobj))
    assert set(values.tolist()) == {0, 1}  # both classes occur: a comparison that could fail
