"""What ``convert`` converts: a network callable in Python, its MONAI metadata, tensor names and probe shapes.

A TorchScript file keeps no Python network: ONNX export runs it as it is, but ``torch.export`` traces
through it only with every shape fixed, so a ``.pt2`` from TorchScript needs the Python network
(``network=FILE.py:FUNCTION``, which gets the TorchScript's weights). A bundle gives its ``network_def``
with ``models/model.pt`` (or its ``models/model.ts``); a ``.pt2`` gives its program's module.
"""

from __future__ import annotations

import importlib.util
import inspect
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from ..errors import ConfigError, ConversionError
from ..repository.metadata import (
    archive_format,
    example_shapes,
    load_exported_program,
    load_served_module,
    read_torchscript_metadata,
    signature_from_metadata,
)
from ..repository.naming import rename
from ..signature import ModelSignature

#: Values tried for the symbols of the metadata's ``spatial_shape`` ("8*n" -> 8, 16, 32): the first that gives
#: every spatial axis ``PROBE_MIN_SIZE`` or more is the probe (a small one keeps the check cheap).
PROBE_SYMBOLS = (1, 2, 4)
PROBE_MIN_SIZE = 16
#: The probe's batch: 2, since ``torch.export`` fixes an axis whose example size is 0 or 1.
PROBE_BATCH = 2


@dataclass(frozen=True, kw_only=True)
class Source:
    """A model to convert: ``module`` (a Python network, TorchScript or a program's module) and what it takes."""

    path: Path
    name: str
    format: str  # "torchscript", "pt2" or "bundle"
    module: torch.nn.Module
    traceable: bool  # torch.export can trace it with dynamic shapes (not TorchScript)
    metadata: dict[str, Any] | None
    argument_names: tuple[str, ...]
    bundle_root: Path | None = None
    control_flow: tuple[str, ...] = ()  # a .pt2's torch.cond / while_loop, which only torch.export carries over

    def signature(self) -> ModelSignature | None:
        """The signature the metadata gives (tensor names as ``repo build`` names them), or ``None``.

        A bundle's tensors keep its ``network_data_format`` names, as ``repo build BUNDLE`` serves them.
        """
        if self.metadata is None:
            return None
        signature = signature_from_metadata(self.name, self.metadata, schema_names=self.argument_names)
        if self.bundle_root is None:
            return signature
        fmt = self.metadata["network_data_format"]
        return rename(signature, list(fmt["inputs"]), list(fmt["outputs"]))


def load_source(path: Path, network: str | None = None) -> Source:
    """Read ``path`` (a TorchScript or ``.pt2`` file, or a bundle folder); ``network`` replaces a TorchScript's."""
    from ..bundles.source import is_bundle

    if path.is_dir():
        if not is_bundle(path):
            raise ConversionError(f"{str(path)!r} is a folder but not a MONAI bundle (no configs/metadata.json)")
        return _bundle(path, network)
    name = path.stem
    if archive_format(path, name) == "pt2":
        from .branches import program_control_flow

        program, meta = load_exported_program(path)
        call: torch.nn.Module = ProgramCall(program.module())
        return Source(path=path, name=name, format="pt2", module=call, traceable=True, metadata=meta,
                      argument_names=_program_inputs(program),
                      control_flow=tuple(program_control_flow(program.graph_module)))  # fmt: skip
    module, schema = load_served_module(path, name)
    meta = read_torchscript_metadata(path)
    source = Source(path=path, name=name, format="torchscript", module=module, traceable=False, metadata=meta,
                    argument_names=tuple(schema))  # fmt: skip
    if network is None:
        return source
    python = python_network(network, module.state_dict())
    return Source(path=path, name=name, format="torchscript", module=python, traceable=True, metadata=meta,
                  argument_names=tuple(schema))  # fmt: skip


def probe_shapes(source: Source, given: Sequence[Sequence[int]] | None) -> list[tuple[int, ...]]:
    """The probe's input shapes: ``given`` (``--input-shape``), else the largest the metadata implies (batch 2)."""
    if given:
        return [tuple(int(d) for d in shape) for shape in given]
    if source.metadata is None:
        raise ConversionError(
            f"model {source.name!r}: {str(source.path)!r} carries no MONAI metadata, so no probe input is known; "
            "pass --input-shape B,C,D,H,W (one per input)"
        )
    found = None
    for symbol in PROBE_SYMBOLS:
        shapes = example_shapes(source.name, source.metadata, symbol)
        if shapes is None:
            break
        found = shapes
        if all(min(s[2:], default=PROBE_MIN_SIZE) >= PROBE_MIN_SIZE for s in shapes):
            break
    if found is None:
        raise ConversionError(
            f"model {source.name!r}: the metadata's spatial_shape implies no concrete size; pass --input-shape "
            "B,C,D,H,W"
        )
    return [(PROBE_BATCH, *s[1:]) for s in found]


def python_network(spec: str, state: dict[str, torch.Tensor]) -> torch.nn.Module:
    """``FILE.py:FUNCTION`` called with no arguments, given ``state`` (the TorchScript's weights) strictly."""
    file, _, function = spec.rpartition(":")
    where = f"--network {spec!r}"
    if not file or not function or not Path(file).is_file():
        raise ConfigError(f"{where}: expected FILE.py:FUNCTION naming an existing file and a function in it")
    loader = importlib.util.spec_from_file_location(Path(file).stem, file)
    if loader is None or loader.loader is None:
        raise ConfigError(f"{where}: {file!r} cannot be imported as Python")
    module = importlib.util.module_from_spec(loader)
    loader.loader.exec_module(module)
    build = getattr(module, function, None)
    if not callable(build):
        raise ConfigError(f"{where}: {file!r} has no function {function!r}")
    network = build()
    if not isinstance(network, torch.nn.Module):
        raise ConfigError(f"{where}: {function}() returned a {type(network).__name__}, not a torch.nn.Module")
    try:
        network.load_state_dict(state, strict=True)
    except RuntimeError as exc:
        raise ConfigError(
            f"{where}: the TorchScript's weights do not fit the network: {' '.join(str(exc).split())[:400]}"
        ) from None
    return network.eval()


def _bundle(root: Path, network_spec: str | None) -> Source:
    from ..bundles.config import load_config
    from ..bundles.network import built_network, network_file
    from ..bundles.source import find_bundle

    config = load_config(find_bundle(root))
    model, is_script = network_file(config)
    if is_script:
        module, schema = load_served_module(model, root.name)
        traceable = network_spec is not None  # models/model.ts: the Python network only when given
        if network_spec is not None:
            module = python_network(network_spec, module.state_dict())
        return Source(path=root, name=root.name, format="bundle", module=module, traceable=traceable,
                      metadata=config.metadata, argument_names=tuple(schema), bundle_root=root)  # fmt: skip
    network, _ = built_network(config, model)
    names = tuple(inspect.signature(network.forward).parameters)  # as TorchScript's schema would name them
    return Source(path=root, name=root.name, format="bundle", module=network, traceable=True,
                  metadata=config.metadata, argument_names=names, bundle_root=root)  # fmt: skip


class ProgramCall(torch.nn.Module):
    """A program's module behind a plain module whose ``train``/``eval`` do nothing.

    An exported program is fixed in the mode it was exported in and refuses ``train()``, which the ONNX
    exporter calls; held outside the module tree, its weights are traced as the constants they are.
    """

    def __init__(self, program_module: torch.nn.Module) -> None:
        super().__init__()
        program_module.requires_grad_(False)  # traced as constants, which must not require grad
        self._program: Callable[..., Any]
        object.__setattr__(self, "_program", program_module)

    def forward(self, *args: torch.Tensor) -> Any:
        return self._program(*args)


def _program_inputs(program: torch.export.ExportedProgram) -> tuple[str, ...]:
    return tuple(s.arg.name for s in program.graph_signature.input_specs if s.kind.name == "USER_INPUT")
