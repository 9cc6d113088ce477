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
from dataclasses import dataclass, field, replace
from pathlib import Path

import torch

from ..errors import ConversionError
from ..repository.metadata import input_names
from .branches import ControlFlow, variants
from .check import Runner, converted_runner, tensors
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
    control_flow: ControlFlow = field(default_factory=lambda: ControlFlow(()))


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
    if to == "onnx" and source.control_flow:
        raise ConversionError(
            f"model {source.name!r}: the .pt2 program holds {sorted(set(source.control_flow))} (control flow on the "
            "data), which the ONNX exporter used here (torch.onnx.export over TorchScript) cannot carry; convert the "
            "TorchScript made by torch.jit.script instead (its branches become ONNX If / Loop)"
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
        diff, flow = _export_and_check(source, to, probe, reference, model, tolerance)
        _swap_in(staging, target)
    finally:
        if staging.is_dir():
            shutil.rmtree(staging, ignore_errors=True)
        else:
            staging.unlink(missing_ok=True)
    seconds = time.perf_counter() - started
    logger.info("converted %s to %s in %.1f s (max abs difference %.3g)", source.path, target, seconds, diff)
    return Conversion(path=target, max_abs_diff=diff, probe_shapes=tuple(shapes), seconds=seconds, control_flow=flow)


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
) -> tuple[float, ControlFlow]:
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
    run, flow = converted_runner(source.name, model, to, ins, len(outs))
    first = run(probe)
    diff = _compare(source.name, to, "the probe", probe, reference, first, tolerance)
    if not flow.ops:
        return diff, flow
    return diff, _check_branches(source, to, run, flow, probe, reference, first[1], tolerance)


def _check_branches(
    source: Source, to: str, run: Runner, flow: ControlFlow, probe: list[torch.Tensor], reference: list[torch.Tensor],
    conditions: list[bool], tolerance: float,
) -> ControlFlow:  # fmt: skip
    """Control flow on the data kept: the converted model against the source on each probe variant, meant to take
    the other branch; returns ``flow`` with how many of its top-level ``If`` the variants saw go both ways.

    A variant's outputs may be larger than the probe's (shifted, scaled), and float32 rounding with them: its
    tolerance grows by the ratio of its largest output to the probe's (never below ``tolerance``).
    """
    seen, peak = [conditions], _peak(reference)
    for label, inputs in variants(probe):
        expected = _run_source_quietly(source, inputs)
        if expected is None:
            continue
        got = run(inputs)
        allowed = tolerance * max(1.0, _peak(expected) / peak) if peak > 0 else tolerance
        _compare(source.name, to, f"the probe {label}", inputs, expected, got, allowed)
        seen.append(got[1])
    if flow.conditions:
        flow = replace(flow, both_ways=sum(len(set(values)) == 2 for values in zip(*seen, strict=True)))
    logger.info("model %r: %s", source.name, flow.describe())
    return flow


def _compare(
    name: str, to: str, label: str, inputs: list[torch.Tensor], expected: list[torch.Tensor],
    got: tuple[list[torch.Tensor], list[bool]], tolerance: float,
) -> float:  # fmt: skip
    """The largest absolute difference of the converted outputs ``got`` from the source's; over ``tolerance``
    (or another shape) a ``ConversionError`` that says on which input."""
    outputs = got[0]
    on = f"on {label} (input shapes {[list(t.shape) for t in inputs]})"
    for index, (a, b) in enumerate(zip(outputs, expected, strict=True)):
        if a.shape != b.shape:
            raise ConversionError(
                f"model {name!r}: output {index} of the {to} model has shape {list(a.shape)} {on}, the source's "
                f"{list(b.shape)}; nothing was written"
            )
    diff = max(
        float((a.double() - b.double()).abs().max()) if a.numel() else 0.0
        for a, b in zip(outputs, expected, strict=True)
    )
    if not diff <= tolerance:
        raise ConversionError(
            f"model {name!r}: the {to} model differs from the source by {diff:.3g} (max abs difference of the "
            f"outputs {on}), over the tolerance {tolerance:g}; nothing was written (raise --tolerance to accept it)"
        )
    return diff


def _peak(outputs: list[torch.Tensor]) -> float:
    return max((float(t.double().abs().max()) for t in outputs if t.numel() and t.is_floating_point()), default=0.0)


def _run_source(source: Source, probe: list[torch.Tensor]) -> list[torch.Tensor]:
    try:
        with torch.inference_mode():
            return tensors(source.module(*probe))
    except Exception as exc:  # the model rejects the probe: its shapes come from the metadata or --input-shape
        raise ConversionError(
            f"model {source.name!r} fails on the probe input of shapes {[list(t.shape) for t in probe]}: "
            f"{str(exc).strip().splitlines()[-1] if str(exc).strip() else type(exc).__name__}; pass --input-shape"
        ) from exc


def _run_source_quietly(source: Source, inputs: list[torch.Tensor]) -> list[torch.Tensor] | None:
    """The source's outputs on a probe variant, or ``None`` where the source itself refuses it (not compared)."""
    try:
        return _run_source(source, inputs)
    except ConversionError as exc:
        logger.debug("model %r: probe variant not compared: %s", source.name, exc)
        return None


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
