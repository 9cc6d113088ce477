"""Why a few voxels of the sample MRI get another label on ``onnx`` than on ``torch``: near-ties, measured.

The sample app's whole path without Holoscan (its pre-transforms, the sliding window its metadata asks for, 2
windows per request) on the committed model, once on ``torch`` and once on ``onnx`` per graph optimisation level,
keeping the full-volume logits. Printed per run: the largest absolute logit difference from ``torch``, how
many voxels get another label, how many voxels have a top-2 logit margin (on ``torch``) below that difference
(the near-ties a difference of that size can flip), and the largest margin among the flipped voxels.

    .venv/bin/python benchmarks/onnx_near_ties.py --data data/brain_tissue_seg \
        [--levels all,basic,disable] [--dicom]

``--data`` is what ``apps/brain_tissue_seg/make_sample_data.py`` writes (``t1.nii.gz``, ``dicom/``); ``--dicom``
also runs the DICOM series, read back with pydicom (``make_sample_data.read_dicom_series``), on ``all``. Two
baselines on the NIfTI: each level against the first (do graph rewrites change the numbers at all?), and
``torch`` with one intra-op thread against ``torch`` with its default (how far summation order alone moves them).
``onnx`` runs the sample's export (``export_onnx.py``), every ``InstanceNormalization`` in it taking its mean
and variance in float64 (``monai_triton_ops/repository/onnx_norm.py``); then the same model
without that rewrite (ONNX Runtime's float32 statistics: the "before", 18 flipped voxels). Last, which layer:
the UNet's two kinds, ``InstanceNorm3d`` and ``Conv3d`` (16 channels, random input of mean 5 and deviation 3),
each exported alone and run at 32^3 and at the 96^3 window, against float64.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

import nibabel as nib
import numpy as np
import torch

ROOT = Path(__file__).resolve().parents[1]
APP = ROOT / "apps" / "brain_tissue_seg"
sys.path[:0] = [str(ROOT), str(APP)]

from export_onnx import export_onnx  # noqa: E402
from make_sample_data import read_dicom_series  # noqa: E402
from transforms import pre_transforms  # noqa: E402

from monai_triton_ops import create_backend  # noqa: E402
from monai_triton_ops.pipeline.run import InferenceSettings, predict  # noqa: E402
from monai_triton_ops.repository.builder import build_repository  # noqa: E402

MODEL = "brain_tissue_seg"
REQUEST_BATCH = 2  # the app's settings_overrides


def logits(spec: str, repository: Path, image: np.ndarray) -> tuple[np.ndarray, float]:
    """The full-volume logits ``(3, X, Y, Z)`` of ``image`` ``(X, Y, Z)`` on backend ``spec``, and the seconds."""
    tensor = pre_transforms()(image[np.newaxis].astype(np.float32))
    with create_backend(spec, MODEL, model_repository=repository) as backend:
        settings = InferenceSettings.from_metadata(backend.signature.metadata, request_batch_size=REQUEST_BATCH)
        started = time.perf_counter()
        with torch.inference_mode():
            result = predict(torch.as_tensor(tensor).unsqueeze(0), backend, settings)
        return np.asarray(result[0], dtype=np.float32), time.perf_counter() - started


def compare(label: str, reference: np.ndarray, other: np.ndarray) -> None:
    """One line: max abs difference (and the largest logit), flipped labels, near-ties below the difference, the
    largest flipped margin, and how many margins are below 1e-5."""
    diff = float(np.abs(other - reference).max())
    ordered = np.sort(reference, axis=0)
    margin = ordered[-1] - ordered[-2]  # top-1 minus top-2 logit, per voxel
    flipped = reference.argmax(axis=0) != other.argmax(axis=0)
    ties = int((margin < diff).sum())
    largest = float(margin[flipped].max()) if flipped.any() else 0.0
    peak = float(np.abs(reference).max())
    print(
        f"{label:30s} max|dlogit| {diff:.3g} (max|logit| {peak:.3g})  flipped {int(flipped.sum()):4d} of {margin.size} "
        f"margin < max|dlogit|: {ties:5d}  largest flipped margin {largest:.3g}  "
        f"margin < 1e-5: {int((margin < 1e-5).sum())}",
        flush=True,
    )


def norm32_repository(scratch: Path) -> Path:
    """A repository whose entry holds the export without the instance norm rewrite (``onnx_norm.py``): ONNX
    Runtime's own float32 statistics, the "before"; run with ``rewrite_graph=false``, so nothing rewrites it."""
    exported = export_onnx(scratch / "norm32.onnx", norm_in_float64=False)
    repository = scratch / "norm32"
    build_repository(exported, repository, MODEL)
    (repository / MODEL / "1" / "model.onnx").write_bytes(exported.read_bytes())  # repo build would rewrite it
    return repository


class _Layer(torch.nn.Module):
    def __init__(self, layer: torch.nn.Module) -> None:
        super().__init__()
        self.layer = layer

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.layer(x)


def layer_errors(scratch: Path) -> None:
    """Per layer kind and size: max abs difference of ONNX Runtime and of torch (float32) from float64."""
    import onnxruntime

    torch.manual_seed(0)
    for name, layer in (
        ("InstanceNorm3d", torch.nn.InstanceNorm3d(16)),
        ("Conv3d 16->16 k3", torch.nn.Conv3d(16, 16, 3, padding=1)),
    ):
        module = _Layer(layer).eval()
        for size in (32, 96):
            x = torch.randn(1, 16, size, size, size) * 3 + 5
            path = scratch / "layer.onnx"
            torch.onnx.export(module, (x,), str(path), dynamo=False, opset_version=17, input_names=["x"])
            session = onnxruntime.InferenceSession(str(path), providers=["CPUExecutionProvider"])
            with torch.inference_mode():
                ours = module(x).numpy()
                exact = module.double()(x.double()).numpy()
            module.float()
            theirs = session.run(None, {"x": x.numpy()})[0]
            print(
                f"{name:16s} {size}^3: onnx vs float64 {np.abs(theirs - exact).max():.2g}, torch vs float64 "
                f"{np.abs(ours - exact).max():.2g}, onnx vs torch {np.abs(theirs - ours).max():.2g}",
                flush=True,
            )


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data", type=Path, default=ROOT / "data" / "brain_tissue_seg")
    parser.add_argument("--levels", default="all,basic,disable", help="onnx graph_optimization levels")
    parser.add_argument("--dicom", action="store_true", help="also the DICOM series, on level all")
    args = parser.parse_args()
    images = {"nifti": np.asarray(nib.load(str(args.data / "t1.nii.gz")).dataobj, dtype=np.float32)}
    if args.dicom:
        images["dicom"] = read_dicom_series(args.data / "dicom")[0].astype(np.float32)
    with tempfile.TemporaryDirectory(prefix="near-ties-") as scratch:
        onnx_repo = Path(scratch) / "repo"
        build_repository(export_onnx(Path(scratch) / "model.onnx"), onnx_repo, MODEL)
        norm32_repo = norm32_repository(Path(scratch))
        for kind, image in images.items():
            reference, seconds = logits("torch", ROOT / "model_repository", image)
            print(f"{kind}: torch {seconds:.1f} s ({torch.get_num_threads()} threads), volume {list(image.shape)}")
            first = None
            for level in args.levels.split(",") if kind == "nifti" else ["all"]:
                other, seconds = logits(f"onnx?graph_optimization={level}", onnx_repo, image)
                compare(f"{kind} onnx {level} ({seconds:.0f} s)", reference, other)
                if first is not None:
                    compare(f"{kind} onnx {level} vs {args.levels.split(',')[0]}", first, other)
                first = other if first is None else first
            other, seconds = logits("onnx?rewrite_graph=false", norm32_repo, image)
            compare(f"{kind} onnx, norm in float32", reference, other)
            if kind == "nifti":
                threads = torch.get_num_threads()
                torch.set_num_threads(1)
                other, seconds = logits("torch", ROOT / "model_repository", image)
                torch.set_num_threads(threads)
                compare(f"{kind} torch 1 thread vs {threads}", reference, other)
        layer_errors(Path(scratch))
    return 0


if __name__ == "__main__":
    sys.exit(main())
