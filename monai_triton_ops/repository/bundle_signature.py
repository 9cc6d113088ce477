"""What the Triton model of a bundle takes and returns, learned from the network itself.

A bundle's ``network_data_format`` describes what its *post-processing* hands on (a detector's ``pred``
object, a HoVerNet's three maps), not always what the network returns. So the bundle's network runs on
two small inputs of the shapes the metadata implies, and the served metadata is written from what it
returned:

- one output per tensor of the result (``heads.py``: a tuple, a dict of heads, RetinaNet's dict of lists
  per feature level), named from the bundle's outputs or the result's keys, with the result's layout;
  a dim whose size changed between the two inputs is dynamic (-1), the others keep their size;
- the input dtype the network takes on the device the model is built on (its floating parameters'), not
  the metadata's: the model zoo's detection bundle declares ``float16`` because it runs under ``amp``
  on a GPU, while its network takes ``float32`` on a CPU. A difference is logged.

A network with one tensor out keeps the bundle's own output entries (names, channels, spatial shape).
"""

from __future__ import annotations

import copy
import logging
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

import torch

from ..errors import BundleError, ConfigError
from ..signature import dtype_of
from .heads import LAYOUT_KEY, Layout, layout_of, tensor_names
from .metadata import example_shapes
from .runner.model import flatten_result

if TYPE_CHECKING:
    from ..bundles import Bundle

logger = logging.getLogger(__name__)

#: Values tried for the symbols of "16*n" shapes: the first two the network accepts are compared.
SYMBOLS = (1, 2, 3, 4)


def served_metadata(
    bundle: Bundle, module: torch.jit.ScriptModule, device: str = "cpu"
) -> tuple[dict[str, Any], list[str]]:
    """The MONAI metadata the bundle's Triton model is described by, and its output names in order."""
    meta = copy.deepcopy(bundle.metadata)
    item = "network_data_format#inputs"
    input_name = bundle.input_names[0]
    declared = str(bundle.config.inputs[input_name].get("dtype", "float32"))
    takes = _parameter_dtype(module)
    if takes is not None and dtype_of(declared) != dtype_of(takes):
        logger.info(
            "bundle %s: metadata declares input %r as %s; the network takes %s on %s, so the model's input is %s",
            bundle.label, input_name, declared, takes, device, dtype_of(takes),
        )  # fmt: skip
        meta["network_data_format"]["inputs"][input_name]["dtype"] = str(takes).removeprefix("torch.")
    runs = _example_runs(bundle, module, takes or torch.float32)
    if not runs:
        logger.warning("bundle %s: %s implies no input shape to run the network on", bundle.label, item)
        return meta, bundle.output_names
    first, second = runs[0], runs[-1]
    _check_heads(bundle, first)
    layout = layout_of(first, bundle.output_names)
    if isinstance(layout, str):  # one tensor: the bundle's own description of it
        return meta, bundle.output_names
    meta["network_data_format"]["outputs"] = _entries(bundle, layout, first, second)
    meta[LAYOUT_KEY] = layout
    logger.info("bundle %s: the network returns %d tensors, served as %s", bundle.label, len(tensor_names(layout)),
                tensor_names(layout))  # fmt: skip
    return meta, tensor_names(layout)


def _check_heads(bundle: Bundle, result: Any) -> None:
    """A bundle whose outputs are named after the network's heads (the zoo's HoVerNet) must name only heads the
    network returns: a head missing from its result would leave the post-processing without it."""
    if not isinstance(result, Mapping):
        return
    heads, declared = [str(key) for key in result], bundle.output_names
    missing = [name for name in declared if name not in heads]
    if missing and len(missing) < len(declared):
        raise BundleError(
            f"names outputs {declared}, but the network returns the heads {heads}: {missing} missing from its result",
            file=bundle.config.metadata_file.label,
            item=f"network_data_format#outputs#{missing[0]}",
        )


def _parameter_dtype(module: torch.nn.Module) -> torch.dtype | None:
    for tensor in (*module.parameters(), *module.buffers()):
        if tensor.is_floating_point():
            return tensor.dtype
    return None


def _example_runs(bundle: Bundle, module: torch.jit.ScriptModule, dtype: torch.dtype) -> list[Any]:
    """The network's results on the two smallest example inputs it accepts (one if only one fits)."""
    runs: list[Any] = []
    seen: list[list[tuple[int, ...]]] = []
    for symbol in SYMBOLS:
        shapes = example_shapes(bundle.label, bundle.metadata, symbol)
        if shapes is None:
            return []
        if shapes in seen:
            continue
        seen.append(shapes)
        generator = torch.Generator().manual_seed(0)
        try:
            with torch.inference_mode():
                runs.append(module(torch.rand(shapes[0], generator=generator).to(dtype)))
        except Exception as exc:  # too small for the network (TorchScript raises any kind): the next size
            logger.debug("bundle %s: the network fails on %s: %s", bundle.label, shapes[0], str(exc).splitlines()[-1:])
            continue
        if len(runs) == 2:
            break
    return runs


def _entries(bundle: Bundle, layout: Layout, first: Any, second: Any) -> dict[str, dict[str, Any]]:
    """One ``network_data_format`` output entry per tensor: fixed dims kept, dims that changed dynamic."""
    names = tensor_names(layout)
    small, large = flatten_result(bundle.label, first), flatten_result(bundle.label, second)
    entries: dict[str, dict[str, Any]] = {}
    for name, a, b in zip(names, small, large, strict=True):
        if a.dim() < 2 or a.dim() != b.dim():
            raise BundleError(
                f"the network's output {name!r} has shape {list(a.shape)} then {list(b.shape)}; a served output "
                "needs a batch and a channel dim and a fixed rank",
                file=bundle.config.file_of("network_def"),
                item="network_def",
            )
        dims: list[Any] = [int(x) if x == y else "n" for x, y in zip(a.shape, b.shape, strict=True)]
        try:
            dtype = str(a.dtype).removeprefix("torch.")
            dtype_of(dtype)
        except ConfigError as exc:
            raise BundleError(f"output {name!r}: {exc}", file=bundle.config.file_of("network_def")) from None
        entries[name] = {
            "type": "tensor",
            "num_channels": dims[1] if isinstance(dims[1], int) else -1,
            "spatial_shape": dims[2:],
            "dtype": dtype,
        }
    return entries
