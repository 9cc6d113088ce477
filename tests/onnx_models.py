"""Small ONNX models for the tests: a network exported with ``torch.onnx.export`` and MONAI metadata.

The metadata goes into the file's ``metadata_props`` under ``monai_metadata``, where the package reads it.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import onnx
import torch

from monai_triton_ops.repository.onnx_model import METADATA_KEY


def save_onnx(
    module: torch.nn.Module,
    path: Path,
    examples: Sequence[torch.Tensor],
    *,
    input_names: Sequence[str],
    output_names: Sequence[str],
    dynamic: Mapping[str, Sequence[int]] | None = None,
    meta: Mapping[str, Any] | None = None,
) -> Path:
    """Export ``module`` to ``path`` (opset 17, the given axes dynamic), with ``meta`` in its metadata_props."""
    path.parent.mkdir(parents=True, exist_ok=True)
    axes = {name: {axis: f"{name}_{axis}" for axis in dims} for name, dims in (dynamic or {}).items()}
    torch.onnx.export(
        module.eval(), tuple(examples), str(path), dynamo=False, opset_version=17,
        input_names=list(input_names), output_names=list(output_names), dynamic_axes=axes,
    )  # fmt: skip
    if meta is not None:
        model = onnx.load(str(path))
        model.metadata_props.add(key=METADATA_KEY, value=json.dumps(dict(meta)))
        onnx.save(model, str(path))
    return path
