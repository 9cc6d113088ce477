"""What the port test of the App SDK's ``ai_remote_infer_app`` needs besides the example itself.

- ``upstream_app()``: the example's own code, never committed here (it is the App SDK's, Apache-2.0,
  https://github.com/Project-MONAI/monai-deploy-app-sdk, ``examples/apps/ai_remote_infer_app`` at commit
  0d8fd45341849566f5de667475bb7d6257bfbb51, release 3.5). No published package carries it (the PyPI
  wheel has no examples and there is no sdist of 4.x), so the test finds a checkout at
  ``$MONAI_DEPLOY_APP_SDK_SRC`` or ``output/third_party/monai-deploy-app-sdk`` (git-ignored) and skips
  without one.
- ``copy_app()``: the example as it runs (``upstream-fix.patch``), and with ``port.patch``: the whole migration.
- ``write_ct_series()``: a small synthetic abdominal CT series (ORIGINAL/PRIMARY, as the example selects).
- ``save_spleen_standin()``: the spleen bundle's 3D UNet with random weights (seed 0), TorchScript.
- ``server_repository()``: the server side of the example's client-side ``config.pbtxt`` (``repo build --like``).
"""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import numpy as np
import torch
from monai.networks.nets import UNet
from pydicom.dataset import Dataset, FileMetaDataset
from pydicom.uid import CTImageStorage, ExplicitVRLittleEndian, generate_uid

from monai_triton_ops.repository.builder import build_repository

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[2]
EXAMPLE = Path("examples/apps/ai_remote_infer_app")
UPSTREAM_COMMIT = "0d8fd45341849566f5de667475bb7d6257bfbb51"
PORT_PATCH = HERE / "port.patch"
#: The example does not run as published: it wires a port 'pred' that its operator lacks to an STL operator
#: (which needs trimesh, scikit-image and SimpleITK too). Its comment says the STL step is optional: commented out.
UPSTREAM_FIX = HERE / "upstream-fix.patch"
MODEL_NAME = "spleen_ct"


def upstream_app() -> Path | None:
    """The example's folder in an App SDK checkout, if one is here."""
    for base in (os.environ.get("MONAI_DEPLOY_APP_SDK_SRC"), ROOT / "output" / "third_party" / "monai-deploy-app-sdk"):
        if base and (Path(base) / EXAMPLE / "spleen_seg_operator.py").is_file():
            return Path(base) / EXAMPLE
    return None


def copy_app(upstream: Path, dest: Path, *patches: Path) -> Path:
    """Copy the example to ``dest`` with ``upstream-fix.patch`` and then ``patches`` applied; returns ``dest``."""
    shutil.copytree(upstream, dest, ignore=shutil.ignore_patterns("__pycache__"))
    git = shutil.which("git") or "git"
    env = {**os.environ, "GIT_CEILING_DIRECTORIES": str(dest.parent)}  # plain patching even inside a checkout
    for patch in (UPSTREAM_FIX, *patches):
        subprocess.run([git, "apply", "--whitespace=nowarn", str(patch)], cwd=dest, env=env, check=True, timeout=60)
    return dest


def write_ct_series(folder: Path, shape: tuple[int, int, int] = (100, 64, 40), spacing: float = 1.6) -> Path:
    """An axial CT series (HU + intercept), a body with a brighter 'spleen' blob; rows x cols x slices.

    After the example's resampling to 1.5 x 1.5 x 2.9 mm it is 107 x 68 x 41 voxels: two 96^3 windows, so the
    sliding window's batching and blending are part of the comparison.
    """
    rows, cols, slices = shape
    rng = np.random.default_rng(0)
    z, y, x = np.mgrid[0:slices, 0:rows, 0:cols].astype(np.float32)
    body = ((y - rows / 2) / (rows * 0.45)) ** 2 + ((x - cols / 2) / (cols * 0.45)) ** 2 < 1
    blob = ((y - rows * 0.4) / 9) ** 2 + ((x - cols * 0.65) / 7) ** 2 + ((z - slices / 2) / 6) ** 2 < 1
    hu = np.where(body, 40.0, -1000.0) + np.where(blob, 80.0, 0.0) + rng.normal(0, 15, z.shape)
    stored = np.clip(hu + 1024, 0, 4095).astype(np.uint16)
    folder.mkdir(parents=True)
    study, series, frame = generate_uid(), generate_uid(), generate_uid()
    for k in range(slices):
        ds = _slice(stored[k], k, spacing, study, series, frame)
        ds.save_as(folder / f"CT{k + 1:04d}.dcm", enforce_file_format=True)
    return folder


def _slice(pixels: np.ndarray, k: int, spacing: float, study: str, series: str, frame: str) -> Dataset:
    ds = Dataset()
    ds.SOPClassUID, ds.SOPInstanceUID = CTImageStorage, generate_uid()
    ds.ImageType = ["ORIGINAL", "PRIMARY", "AXIAL"]
    ds.Modality = "CT"
    ds.PatientName, ds.PatientID, ds.PatientBirthDate, ds.PatientSex = "Synthetic^CT", "SYN1", "", "O"
    ds.StudyInstanceUID, ds.SeriesInstanceUID, ds.FrameOfReferenceUID = study, series, frame
    ds.StudyDescription, ds.SeriesDescription = "synthetic abdomen", "synthetic CT"
    ds.StudyDate = ds.SeriesDate = "20250101"
    ds.StudyTime = ds.SeriesTime = "120000"
    ds.StudyID, ds.SeriesNumber, ds.InstanceNumber = "1", 1, k + 1
    ds.AccessionNumber = ds.ReferringPhysicianName = ""
    ds.PatientPosition = "HFS"
    ds.ImageOrientationPatient = [1, 0, 0, 0, 1, 0]
    ds.ImagePositionPatient = [0.0, 0.0, float(k * 3.0)]
    ds.SliceLocation = float(k * 3.0)
    ds.PixelSpacing = [spacing, spacing]
    ds.SliceThickness = ds.SpacingBetweenSlices = 3.0
    ds.SamplesPerPixel, ds.PhotometricInterpretation = 1, "MONOCHROME2"
    ds.Rows, ds.Columns = pixels.shape
    ds.BitsAllocated, ds.BitsStored, ds.HighBit, ds.PixelRepresentation = 16, 12, 11, 0
    ds.RescaleIntercept, ds.RescaleSlope = "-1024", "1"
    ds.PixelData = np.ascontiguousarray(pixels).tobytes()
    ds.file_meta = FileMetaDataset()
    ds.file_meta.MediaStorageSOPClassUID, ds.file_meta.MediaStorageSOPInstanceUID = ds.SOPClassUID, ds.SOPInstanceUID
    ds.file_meta.TransferSyntaxUID = ExplicitVRLittleEndian
    return ds


def save_spleen_standin(path: Path) -> Path:
    """The spleen_ct_segmentation bundle's network (MONAI UNet, 5 levels, 2 residual units), random weights."""
    torch.manual_seed(0)
    net = UNet(
        spatial_dims=3,
        in_channels=1,
        out_channels=2,
        channels=(16, 32, 64, 128, 256),
        strides=(2, 2, 2, 2),
        num_res_units=2,
        norm="batch",
    ).eval()
    path.parent.mkdir(parents=True, exist_ok=True)
    torch.jit.script(net).save(str(path))
    return path


def server_repository(client_folder: Path, model: Path, repo: Path) -> Path:
    """The server side of the example's client-side model folder, as a user makes it: ``monai-triton repo build
    MODEL --like models_client_side/spleen_ct --flavor python --instance-kind cpu``. Name, tensors, batching,
    version policy, parameters and ``default_model_filename`` come from the example's ``config.pbtxt``; the
    python runner serves it instead of ``pytorch_libtorch`` (this server has no libtorch backend), on CPU
    instances instead of ``KIND_GPU``."""
    build_repository(model, repo, like=client_folder, flavor="python", instance_kind="cpu")
    return repo
