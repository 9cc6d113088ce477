"""The committed sample model (TorchScript) exported to ONNX, with its MONAI metadata, for the ``onnx`` rows.

The network is rebuilt from ``network.py`` with the TorchScript's weights and exported by the TorchScript-based
exporter (opset 17) with the batch and the three spatial axes dynamic; the MONAI metadata goes into the file's
``metadata_props`` (``monai_metadata``), where every part of monai-triton-ops reads it; its PReLUs (one slope
each) become ``LeakyRelu`` and its instance norms take their statistics in float64 (as torch does; ONNX
Runtime's own kernel sums in float32 and flips 18 near-tied voxels of the sample MRI), both in
``monai_triton_ops/repository/onnx_rewrite.py``; the second costs time, so the library leaves it off unless asked
and this app asks. Max abs
difference of the logits against TorchScript here: ~1e-6 on a 96^3 window.

    .venv/bin/python apps/brain_tissue_seg/export_onnx.py OUT.onnx [--repository REPO]
"""

from __future__ import annotations

import argparse
import json
import sys
import warnings
from pathlib import Path

import torch

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]
sys.path.insert(0, str(HERE))

from network import build_network  # noqa: E402

from monai_triton_ops.repository.metadata import read_torchscript_metadata  # noqa: E402
from monai_triton_ops.repository.onnx_model import METADATA_KEY  # noqa: E402
from monai_triton_ops.repository.onnx_rewrite import rewrite_graph  # noqa: E402

MODEL = ROOT / "model_repository" / "brain_tissue_seg" / "1" / "model.pt"
OPSET = 17


def export_onnx(
    target: Path, source: Path = MODEL, opset: int = OPSET, *, rewrite: bool = True, norm_in_float64: bool = True
) -> Path:
    """Write ``source``'s network as ONNX to ``target`` (dynamic batch and spatial axes, metadata kept).

    ``rewrite=False`` keeps the exporter's graph as it is (the benchmark's "before"); ``norm_in_float64=False``
    rewrites the PReLUs but leaves the instance norms to ONNX Runtime's float32 statistics.
    """
    import onnx

    scripted = torch.jit.load(str(source), map_location="cpu")  # type: ignore[no-untyped-call]
    network = build_network()
    network.load_state_dict(scripted.state_dict())
    network.eval()
    axes = {0: "batch", 2: "d", 3: "h", 4: "w"}
    target.parent.mkdir(parents=True, exist_ok=True)
    with warnings.catch_warnings():  # the tracer's notes on instance norm's size checks: constant here
        warnings.simplefilter("ignore")
        torch.onnx.export(
            network, (torch.zeros(1, 1, 32, 32, 32),), str(target), dynamo=False, opset_version=opset,
            input_names=["x"], output_names=["OUTPUT__0"], dynamic_axes={"x": axes, "OUTPUT__0": axes},
        )  # fmt: skip
    model = onnx.load(str(target))
    if rewrite:  # PReLU with one slope as LeakyRelu (fused into the Conv), instance norms' statistics in float64
        rewrite_graph(model, norm_in_float64=norm_in_float64)
    meta = read_torchscript_metadata(source)
    if meta is not None:
        model.metadata_props.add(key=METADATA_KEY, value=json.dumps(meta))
    onnx.save(model, str(target))
    return target


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("out", type=Path)
    parser.add_argument("--repository", type=Path, help="also build a model repository entry brain_tissue_seg here")
    args = parser.parse_args()
    path = export_onnx(args.out)
    if args.repository is not None:
        from monai_triton_ops.repository.builder import build_repository

        build_repository(path, args.repository, "brain_tissue_seg", force=True)
    print(path)
