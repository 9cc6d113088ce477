"""Convert, check against the source on a probe input, and write the result all or nothing.

The converted model is written to a hidden temporary file beside the target, loaded back and run on the
probe input the source ran on; only when the largest absolute difference of any output is within
``tolerance`` is it renamed into place (a bundle: a copy of the bundle whose ``models/`` holds the new
file, staged in a hidden folder and renamed the same way). Whatever fails leaves nothing behind.
"""

from __future__ import annotations

import logging
import secrets
import shutil
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from ..errors import ConversionError
from ..repository.metadata import input_names
from .export import dynamic_axes, export_onnx, export_pt2
from .source import Source, load_source, probe_shapes

logger = logging.getLogger(__name__)

#: ``--to`` -> the converted file's suffix.
TARGETS = {"onnx": ".onnx", "pt2": ".pt2"}
#: The default largest absolute difference of any output against the source (float32 exports give ~1e-5).
DEFAULT_TOLERANCE = 1e-4


@dataclass(frozen=True)
class Conversion:
    """What was written, how far it is from the source on the probe, and how long it took."""

    path: Path
    max_abs_diff: float
    probe_shapes: tuple[tuple[int, ...], ...]
    seconds: float


def convert(
    path: str | Path, to: str, out: str | Path | None = None, *, tolerance: float = DEFAULT_TOLERANCE,
    input_shapes: Sequence[Sequence[int]] | None = None, network: str | None = None, force: bool = False,
) -> Conversion:  # fmt: skip
    """Convert the model or bundle at ``path`` to ``to`` (``onnx`` or ``pt2``) at ``out``; see the module doc."""
    started = time.perf_counter()
    if to not in TARGETS:
        raise ConversionError(f"unknown conversion target --to {to!r}; expected one of {sorted(TARGETS)}")
    if not tolerance >= 0:
        raise ConversionError(f"--tolerance must be a number >= 0, got {tolerance}")
    source = load_source(Path(path), network)
    target = _target(source, to, out, force)
    if to == "pt2" and not source.traceable:
        raise ConversionError(
            f"model {source.name!r} is TorchScript, which torch.export traces only with every shape fixed; a .pt2 "
            "needs the Python network: pass --network FILE.py:FUNCTION (it gets the TorchScript's weights), or "
            "convert the bundle with network_def + models/model.pt"
        )
    shapes = probe_shapes(source, input_shapes)
    generator = torch.Generator().manual_seed(0)
    probe = [torch.randn(shape, generator=generator) for shape in shapes]
    reference = _run_source(source, probe)
    suffix = "" if source.bundle_root else TARGETS[to]  # torch.export.save wants a .pt2 name
    staging = target.parent / f".{target.name}.converting-{secrets.token_hex(4)}{suffix}"
    try:
        model = staging / "models" / f"model{TARGETS[to]}" if source.bundle_root else staging
        if source.bundle_root is not None:
            _copy_bundle(source.bundle_root, staging)
        diff = _export_and_check(source, to, probe, reference, model, tolerance)
        _swap_in(staging, target)
    finally:
        if staging.is_dir():
            shutil.rmtree(staging, ignore_errors=True)
        else:
            staging.unlink(missing_ok=True)
    seconds = time.perf_counter() - started
    logger.info("converted %s to %s in %.1f s (max abs difference %.3g)", source.path, target, seconds, diff)
    return Conversion(path=target, max_abs_diff=diff, probe_shapes=tuple(shapes), seconds=seconds)


def _target(source: Source, to: str, out: str | Path | None, force: bool) -> Path:
    if out is not None:
        target = Path(out)
    elif source.bundle_root is not None:
        target = source.path.with_name(f"{source.path.name}_{to}")
    else:
        target = source.path.with_suffix(TARGETS[to])
    if target.resolve() == source.path.resolve():
        raise ConversionError(f"the output {str(target)!r} is the source itself; pass -o OUT")
    if target.exists() and not force:
        raise ConversionError(f"{str(target)!r} exists; pass --force to replace it")
    if target.exists() and target.is_dir() != (source.bundle_root is not None):
        raise ConversionError(f"{str(target)!r} exists and is a {'folder' if target.is_dir() else 'file'}")
    if not target.parent.is_dir():
        raise ConversionError(f"the output's folder {str(target.parent)!r} does not exist")
    return target


def _export_and_check(
    source: Source, to: str, probe: list[torch.Tensor], reference: list[torch.Tensor], model: Path, tolerance: float
) -> float:
    signature = source.signature()
    ins = signature.input_names if signature else input_names(len(probe), source.argument_names)
    outs = signature.output_names if signature else [f"OUTPUT__{i}" for i in range(len(reference))]
    if len(outs) != len(reference):
        raise ConversionError(
            f"model {source.name!r}: the metadata declares outputs {list(outs)}, the model returns {len(reference)}"
        )
    declared = list(signature.inputs) + list(signature.outputs) if signature else []
    fixed = [tuple(t.shape) for t in declared] if declared else [None] * (len(ins) + len(outs))
    shapes = [tuple(t.shape) for t in (*probe, *reference)]
    axes = {n: dynamic_axes(s, f) for n, s, f in zip([*ins, *outs], shapes, fixed, strict=True)}
    if to == "onnx":
        export_onnx(source.module, source.name, probe, model, inputs=ins, outputs=outs, axes=axes,
                    metadata=source.metadata)  # fmt: skip
    else:
        export_pt2(source.module, source.name, probe, model, axes=[axes[n] for n in ins], metadata=source.metadata)
    converted = _run_converted(model, to, ins, probe)
    diff = max(float((a - b).abs().max()) for a, b in zip(converted, reference, strict=True))
    if not diff <= tolerance:
        raise ConversionError(
            f"model {source.name!r}: the {to} model differs from the source by {diff:.3g} (max abs difference of "
            f"the outputs on a probe input of shapes {[list(t.shape) for t in probe]}), over the tolerance "
            f"{tolerance:g}; nothing was written (raise --tolerance to accept it)"
        )
    return diff


def _run_source(source: Source, probe: list[torch.Tensor]) -> list[torch.Tensor]:
    try:
        with torch.inference_mode():
            return _tensors(source.module(*probe))
    except Exception as exc:  # the model rejects the probe: its shapes come from the metadata or --input-shape
        raise ConversionError(
            f"model {source.name!r} fails on the probe input of shapes {[list(t.shape) for t in probe]}: "
            f"{str(exc).strip().splitlines()[-1] if str(exc).strip() else type(exc).__name__}; pass --input-shape"
        ) from exc


def _run_converted(model: Path, to: str, names: Sequence[str], probe: list[torch.Tensor]) -> list[torch.Tensor]:
    if to == "onnx":
        import onnxruntime

        session = onnxruntime.InferenceSession(str(model), providers=["CPUExecutionProvider"])
        feeds = {name: tensor.numpy() for name, tensor in zip(names, probe, strict=True)}
        return [torch.from_numpy(a) for a in session.run(None, feeds)]
    with torch.inference_mode():
        return _tensors(torch.export.load(str(model)).module()(*probe))


def _tensors(result: Any) -> list[torch.Tensor]:
    if isinstance(result, torch.Tensor):
        return [result]
    values = list(result.values()) if isinstance(result, dict) else list(result)
    return [torch.as_tensor(v) for v in values]


def _swap_in(staging: Path, target: Path) -> None:
    """Rename ``staging`` to ``target``; an existing folder (``--force``) is moved aside first, then removed."""
    if not (target.is_dir() and staging.is_dir()):
        staging.replace(target)
        return
    retired = target.with_name(f".{target.name}.retired-{secrets.token_hex(4)}")
    target.rename(retired)
    try:
        staging.rename(target)
    except OSError:
        retired.rename(target)
        raise
    shutil.rmtree(retired, ignore_errors=True)


def _copy_bundle(root: Path, staging: Path) -> None:
    """The bundle without its network files (``models/model.ts``, ``.pt``); the converted one goes in ``models/``."""
    shutil.copytree(root, staging, ignore=shutil.ignore_patterns("model.ts", "model.pt", "__pycache__"))
    (staging / "models").mkdir(exist_ok=True)
