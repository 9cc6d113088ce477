"""The sample app as users run it: a real App SDK application in its own process, on the real MRI.

Sample data is written once per run from the atlas nilearn ships (``tests/conftest.py``, ``sample_data``); each app
run is ``monai-triton exec`` in a subprocess, as in the README. The runs on a remote Triton use the session's
tritonserver over the committed repository (``committed_server``): what they check is the app's side of the
connection, and each looks only at what its own app process left on the server.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path
from typing import TYPE_CHECKING

import nibabel as nib
import numpy as np
import pydicom
import pytest

ROOT = Path(__file__).resolve().parents[2]
APP = ROOT / "apps" / "brain_tissue_seg"
REPO = ROOT / "model_repository"
DICE_TARGET = 0.85

pytestmark = pytest.mark.slow
sys.path.insert(0, str(APP))
from atlas import dice  # noqa: E402

from .. import warm_python  # noqa: E402

if TYPE_CHECKING:
    from monai_triton_ops.server import LocalTritonServer


def run_app(
    source: Path, out: Path, *extra: str, models: Path = REPO, env: dict[str, str] | None = None, fresh: bool = False
) -> subprocess.CompletedProcess[str]:
    """``monai-triton exec APP``: forked from a warm interpreter (``tests/warm_python.py``), or ``fresh``."""
    command = [sys.executable, "-m", "monai_triton_ops.cli", "exec", str(APP), "-i", str(source), "-o", str(out)]
    command += ["-m", str(models), "-l", "WARN", *extra]
    return warm_python.run(command, cwd=ROOT, timeout=900, env=env, fresh=fresh)


def _dice(seg_path: Path, labels_path: Path) -> dict[int, float]:
    seg = nib.as_closest_canonical(nib.load(seg_path))
    ref = nib.as_closest_canonical(nib.load(labels_path))
    assert seg.shape == ref.shape
    np.testing.assert_allclose(seg.affine, ref.affine, atol=1e-3)
    return {label: dice(np.asarray(seg.dataobj), np.asarray(ref.dataobj), label) for label in (1, 2)}


@pytest.fixture(scope="session")
def nifti_run(sample_labels: Path) -> Path:
    """The app on the NIfTI with ``--backend torch``: ``sample_labels``, run once for every module that needs it."""
    return sample_labels


def test_nifti_in_labels_out_on_the_input_grid_with_dice_above_target(nifti_run: Path, sample_data: Path) -> None:
    seg = nib.load(nifti_run / "seg.nii.gz")
    t1 = nib.load(sample_data / "t1.nii.gz")
    assert seg.shape == t1.shape
    assert seg.get_data_dtype() == np.uint8
    np.testing.assert_allclose(seg.affine, t1.affine)
    assert set(np.unique(np.asarray(seg.dataobj))) == {0, 1, 2}
    scores = _dice(nifti_run / "seg.nii.gz", sample_data / "labels.nii.gz")
    assert min(scores.values()) >= DICE_TARGET, scores


def test_dicom_in_gives_the_same_labels_and_a_dicom_seg(nifti_run: Path, sample_data: Path, tmp_path: Path) -> None:
    result = run_app(sample_data / "dicom", tmp_path, fresh=True)  # all a new process prints
    assert result.returncode == 0, result.stderr[-3000:]
    # No warning a user cannot act on (the GPU decoder's absence was two nvimgcodec warnings per DICOM run):
    # the progress bar the app asks for, and the one run line.
    lines = [line for line in result.stderr.splitlines() if line.strip() and "%|" not in line]
    assert len(lines) == 1, lines
    assert lines[0].startswith("model 'brain_tissue_seg' ran on torch (TorchScript in this process, cpu): 1 image(s)")
    from_dicom = nib.as_closest_canonical(nib.load(tmp_path / "seg.nii.gz"))
    from_nifti = nib.as_closest_canonical(nib.load(nifti_run / "seg.nii.gz"))
    np.testing.assert_array_equal(np.asarray(from_dicom.dataobj), np.asarray(from_nifti.dataobj))
    (seg_file,) = tmp_path.glob("*.dcm")
    seg = pydicom.dcmread(seg_file)
    assert seg.SOPClassUID == "1.2.840.10008.5.1.4.1.1.66.4"  # Segmentation Storage
    assert [s.SegmentLabel for s in seg.SegmentSequence] == ["grey matter", "white matter"]
    source = pydicom.dcmread(next((sample_data / "dicom").iterdir()), stop_before_pixels=True)
    assert seg.StudyInstanceUID == source.StudyInstanceUID


def one_line_error(result: subprocess.CompletedProcess[str], out: Path) -> str:
    """A failed run: exit code 2, exactly one line on stderr, no traceback, no output file."""
    assert result.returncode == 2, result.stderr
    (line,) = result.stderr.splitlines()
    assert line.startswith("error: ")
    assert not any(p.is_file() for p in out.rglob("*"))
    return line


def test_backend_from_the_environment_and_a_typo_fails_before_writing(sample_data: Path, tmp_path: Path) -> None:
    import os

    env = {**os.environ, "MONAI_TRITON_BACKEND": "tensorrt"}
    result = run_app(sample_data / "t1.nii.gz", tmp_path / "out", env=env)
    assert "unknown backend spec 'tensorrt'" in one_line_error(result, tmp_path / "out")


@pytest.mark.parametrize("case", ["empty", "no_dicom", "no_mr_series"])
def test_unusable_input_folders_fail_with_the_path_named(case: str, tmp_path: Path) -> None:
    from ..pipeline.test_inputs import write_dicom

    source = tmp_path / "in"
    source.mkdir()
    if case == "no_dicom":
        (source / "readme.txt").write_text("no images here")
    elif case == "no_mr_series":  # DICOM, but no series the app's selector (Modality MR) would pick
        write_dicom(source / "IM0001", modality="CT")
    line = one_line_error(run_app(source, tmp_path / "out"), tmp_path / "out")
    expected = {"empty": "is empty", "no_dicom": "holds no DICOM series", "no_mr_series": "holds no DICOM MR image"}
    assert expected[case] in line
    assert str(source) in line


def test_a_corrupt_model_fails_the_run_and_writes_nothing(sample_data: Path, tmp_path: Path) -> None:
    models = tmp_path / "models"
    shutil.copytree(REPO, models)
    (models / "brain_tissue_seg" / "1" / "model.pt").write_bytes(b"not a model")
    result = run_app(sample_data / "t1.nii.gz", tmp_path / "out", models=models)
    assert "is not TorchScript or .pt2 (not a zip archive)" in one_line_error(result, tmp_path / "out")


@pytest.mark.triton
@pytest.mark.parametrize("how", ["minus_t", "grpc"])
def test_on_a_local_triton_the_app_writes_the_same_labels(
    how: str, committed_server: LocalTritonServer, nifti_run: Path, sample_data: Path, tmp_path: Path
) -> None:
    """An App SDK app started with the App SDK's own ``-t HOST:PORT`` (HTTP) runs on the remote backend unchanged."""
    server = committed_server
    remote = ["-t", server.http_address] if how == "minus_t" else ["--backend", server.grpc_url]
    command = [sys.executable, str(APP), "-i", str(sample_data / "t1.nii.gz"), "-o", str(tmp_path)]
    command += ["-m", str(REPO), "-l", "WARN", *remote]
    result = warm_python.run(command, cwd=ROOT, timeout=900)
    assert result.returncode == 0, result.stderr[-3000:]
    remote_labels = nib.load(tmp_path / "seg.nii.gz")
    local_labels = nib.load(nifti_run / "seg.nii.gz")
    np.testing.assert_array_equal(np.asarray(remote_labels.dataobj), np.asarray(local_labels.dataobj))
    np.testing.assert_allclose(remote_labels.affine, local_labels.affine)


@pytest.mark.triton
@pytest.mark.parametrize("how", ["backend_option_dicom", "environment_nifti"])
def test_on_the_in_process_triton_the_app_writes_the_same_labels(
    how: str, nifti_run: Path, sample_data: Path, tmp_path: Path
) -> None:
    """``--backend triton`` (DICOM in) and ``MONAI_TRITON_BACKEND=triton`` (NIfTI in): Triton inside the app."""
    import os

    source = sample_data / "dicom" if how.endswith("dicom") else sample_data / "t1.nii.gz"
    command = [sys.executable, str(APP), "-i", str(source), "-o", str(tmp_path), "-m", str(REPO), "-l", "WARN"]
    env = {**os.environ, "MONAI_TRITON_BACKEND": "torch"}  # the option must win over the environment
    if how.startswith("backend_option"):
        command += ["--backend", "triton"]
    else:
        env["MONAI_TRITON_BACKEND"] = "triton"
    app = warm_python.run(command, cwd=ROOT, timeout=900, env=env)
    assert app.returncode == 0, app.stderr[-3000:]
    labels = nib.as_closest_canonical(nib.load(tmp_path / "seg.nii.gz"))
    reference = nib.as_closest_canonical(nib.load(nifti_run / "seg.nii.gz"))
    np.testing.assert_array_equal(np.asarray(labels.dataobj), np.asarray(reference.dataobj))
    assert not list(Path("/dev/shm").glob(f"monai_triton_{app.pid}_*")), "the in-process server left shared memory"
    assert not list(REPO.rglob("__pycache__")), "the in-process server wrote into the model repository"


@pytest.mark.triton
def test_sigterm_mid_run_on_a_local_triton_leaves_no_shared_memory(
    committed_server: LocalTritonServer, sample_data: Path, tmp_path: Path
) -> None:
    """SIGTERM mid-run: the app closes its backend (regions unregistered and unlinked) and exits 143; the janitor
    process would clean up after a harder end (SIGKILL)."""
    import signal
    import time

    import tritonclient.grpc as grpcclient

    server = committed_server
    command = [sys.executable, str(APP), "-i", str(sample_data / "t1.nii.gz"), "-o", str(tmp_path)]
    command += ["-m", str(REPO), "-l", "WARN", "--backend", server.grpc_url]
    app = subprocess.Popen(command, cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 300
        while not list(Path("/dev/shm").glob(f"mto_{app.pid}_*")) and time.monotonic() < deadline:
            time.sleep(0.1)
        assert list(Path("/dev/shm").glob(f"mto_{app.pid}_*")), "the app never used shared memory"
        app.send_signal(signal.SIGTERM)
        assert app.wait(timeout=120) == 143  # interrupts.py: one line, backends closed, exit 143
    finally:
        app.kill()
        app.wait(timeout=30)
    deadline = time.monotonic() + 60
    while list(Path("/dev/shm").glob(f"mto_{app.pid}_*")) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not list(Path("/dev/shm").glob(f"mto_{app.pid}_*"))
    client = grpcclient.InferenceServerClient(server.grpc_address)
    try:
        regions = client.get_system_shared_memory_status(as_json=True, client_timeout=10).get("regions", {})
    finally:
        client.close()
    assert not [name for name in regions if name.startswith(f"mto_{app.pid}_")]
