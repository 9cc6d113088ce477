"""``monai-triton convert``: a TorchScript, ``.pt2`` or bundle as ONNX or ``.pt2``, checked against its source."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from .parser import add_log_level


def add_convert(commands: argparse._SubParsersAction[Any]) -> None:
    p = commands.add_parser(
        "convert",
        help="convert a model or bundle to ONNX or torch.export .pt2 (checked against the source)",
        description="Export a TorchScript file, a .pt2 or a bundle folder (network_def + models/model.pt, or "
        "models/model.ts) to ONNX (opset 17) or .pt2, with dynamic batch and spatial axes and the MONAI metadata; "
        "the result is run on a probe input against the source and written only within --tolerance.",
    )
    p.add_argument("model", type=Path, help="a model file (.pt/.ts/.pt2) or a bundle folder")
    p.add_argument("--to", required=True, help="onnx or pt2")
    p.add_argument("-o", "--output", type=Path, help="the file (a bundle: the folder) to write; default beside MODEL")
    p.add_argument(
        "--tolerance", type=float, default=1e-4, help="largest max abs difference accepted (default: %(default)s)"
    )
    p.add_argument(
        "--input-shape", action="append", metavar="B,C,D,H,W", help="probe shape per input (default: from metadata)"
    )
    p.add_argument("--network", metavar="FILE.py:FUNCTION", help="the Python network of a TorchScript (for pt2)")
    p.add_argument("--force", action="store_true", help="replace an existing output")
    add_log_level(p)
    p.set_defaults(handler=_run_convert)


def _run_convert(args: argparse.Namespace) -> int:
    from ..convert import convert
    from ..errors import UsageError

    try:
        shapes = [[int(d) for d in text.split(",")] for text in args.input_shape or ()]
    except ValueError as exc:
        raise UsageError(f"--input-shape takes comma-separated integers, e.g. 2,1,32,32,32: {exc}") from None
    result = convert(
        args.model, args.to, args.output, tolerance=args.tolerance, input_shapes=shapes or None,
        network=args.network, force=args.force,
    )  # fmt: skip
    shapes_text = ", ".join("x".join(map(str, s)) for s in result.probe_shapes)
    print(
        f"wrote {result.path} ({args.to}) in {result.seconds:.1f} s; max abs difference against {args.model} "
        f"on a probe {shapes_text}: {result.max_abs_diff:.3g} (tolerance {args.tolerance:g})"
    )
    if result.control_flow.ops:
        print(result.control_flow.describe())
    return 0
