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


class SlowSteps(torch.nn.Module):
    """The contract's ``Slow`` model in a form the exporter turns into an ONNX ``Loop`` (an int64 trip count)."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = x[0]
        steps = x[0, 0, 0].to(torch.int64)
        for _ in range(int(steps)):
            y = torch.tanh(y @ y)
        return x + 0.0 * y.sum()


def onnx_repository(
    cases: Mapping[str, Any], torch_repo: Path, target: Path, scratch: Path, *, skip: Sequence[str] = ()
) -> Path:
    """The contract repository again with every model exported to ONNX under the same names and signature.

    Each case (``module``, ``max_batch_size``, ``dynamic_batching``) is exported with the tensor names of its
    TorchScript entry's signature and every axis that is -1 there dynamic, then built with ``repo build``.
    Extra version folders of the TorchScript repository are copied as they are.
    """
    from monai_triton_ops.repository.builder import build_repository
    from monai_triton_ops.repository.layout import versions
    from monai_triton_ops.repository.signatures import local_entry
    from monai_triton_ops.signature import dtype_to_torch

    for name, case in cases.items():
        if name in skip:
            continue
        signature = local_entry(torch_repo, name).signature(1, path=torch_repo / name / "1" / "model.pt")
        batch = signature.max_batch_size
        examples, dynamic = [], {}
        for spec in (*signature.inputs, *signature.outputs):
            full = spec.full_shape(batch)
            dynamic[spec.name] = [axis for axis, size in enumerate(full) if size == -1]
            if spec in signature.inputs:
                sizes = [4 if size == -1 else size for size in full]
                examples.append(torch.ones(sizes, dtype=dtype_to_torch(spec.dtype)))
        module = torch.jit.script(SlowSteps()) if name == "slow" else case.module
        model = save_onnx(
            module, scratch / f"{name}.onnx", examples, input_names=signature.input_names,
            output_names=signature.output_names, dynamic=dynamic, meta=dict(signature.metadata) or None,
        )  # fmt: skip
        build_repository(model, target, name, max_batch_size=batch, dynamic_batching=case.dynamic_batching)
        for version in versions(torch_repo / name)[1:]:
            (target / name / str(version)).mkdir()
            (target / name / str(version) / "model.onnx").write_bytes((target / name / "1" / "model.onnx").read_bytes())
    return target
