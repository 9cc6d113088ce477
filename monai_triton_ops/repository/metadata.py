"""Model metadata -> ``ModelSignature``: where MONAI's description of a model comes from.

TorchScript stores no tensor names, dtypes or shapes, so the signature comes from MONAI's metadata:
``metadata.json`` in a TorchScript's extra files (``monai.data.save_net_with_metadata``, bundle
export), the same file in a ``.pt2`` archive (``torch.export.save(..., extra_files=...)``), or a
bundle's ``configs/metadata.json``. Input names follow the TorchScript ``forward`` schema when they
are valid Triton names, else ``INPUT__i``; outputs are ``OUTPUT__i``. When there is no metadata,
``probe.py`` runs the model instead.
"""

from __future__ import annotations

import ast
import json
import logging
import re
import zipfile
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ..bundles.outputs import tensor_dims
from ..errors import ConfigError, ModelLoadError, ModelNotFoundError
from ..signature import TENSOR_NAME, ModelSignature, TensorSpec, dtype_of

if TYPE_CHECKING:
    import torch

logger = logging.getLogger(__name__)

METADATA_FILE = "metadata.json"
#: Where a MONAI bundle keeps its metadata, relative to the bundle folder.
BUNDLE_METADATA = Path("configs") / METADATA_FILE
#: A bundle spatial-shape entry that is a fixed size, e.g. 96 or "96".
_FIXED_DIM = re.compile(r"^\d+$")
#: The largest size an example shape may have along one dim (a probe must stay small).
_MAX_EXAMPLE_SIZE = 4096


def archive_format(path: str | Path, name: str | None = None) -> str:
    """``"torchscript"`` or ``"pt2"``, told from the archive's entries rather than from the suffix."""
    path = Path(path)
    where = f"model {name!r}: " if name is not None else ""
    if not path.is_file():
        raise ModelNotFoundError(f"{where}model file {str(path)!r} does not exist")
    try:
        with zipfile.ZipFile(path) as archive:
            names = archive.namelist()
    except (OSError, zipfile.BadZipFile) as exc:
        raise ModelLoadError(f"{where}{str(path)!r} is not TorchScript or .pt2 (not a zip archive): {exc}") from exc
    if any(n.endswith("/archive_format") for n in names):
        return "pt2"
    if any(n.endswith("/constants.pkl") or "/code/" in n for n in names):
        return "torchscript"
    raise ModelLoadError(
        f"{where}{str(path)!r} is a zip archive but neither TorchScript nor .pt2 (a torch.save() checkpoint?); "
        "export the network with torch.jit.script/trace or monai.data.save_net_with_metadata"
    )


def read_torchscript_metadata(path: str | Path) -> dict[str, Any] | None:
    """The MONAI ``metadata.json`` inside a TorchScript file, or ``None`` when it has none.

    TorchScript files are zip archives with extra files under ``<prefix>/extra/``; reading the
    entry directly avoids loading the weights just to learn the tensor layout.
    """
    try:
        with zipfile.ZipFile(path) as archive:
            entries = [n for n in archive.namelist() if n.endswith(f"/extra/{METADATA_FILE}")]
            text = archive.read(entries[0]) if entries else b""
    except (OSError, zipfile.BadZipFile) as exc:
        raise ModelLoadError(f"{str(path)!r} is not a TorchScript file (not a readable zip archive): {exc}") from exc
    return parse_metadata_text(text, source=str(path))


def load_exported_program(path: str | Path) -> tuple[torch.export.ExportedProgram, dict[str, Any] | None]:
    """A ``.pt2`` program and its ``metadata.json`` extra file (``None`` when absent).

    MONAI's ``save_exported_program`` writes the same ``metadata.json`` as TorchScript export, through
    ``torch.export.save(..., extra_files=...)``; ``torch.export.load`` fills the dict it is given.
    """
    import torch  # here, not above: reading a config.pbtxt's metadata needs no torch

    extra = {METADATA_FILE: ""}
    try:
        program = torch.export.load(str(path), extra_files=extra)
    except Exception as exc:  # torch raises RuntimeError, KeyError or zip errors for a bad archive
        raise ModelLoadError(f"{str(path)!r} is not a loadable .pt2 file: {exc}") from exc
    return program, parse_metadata_text(extra[METADATA_FILE], source=str(path))


def load_torchscript(path: str | Path, name: str, device: str | torch.device = "cpu") -> torch.jit.ScriptModule:
    """Load a TorchScript file in eval mode; anything torch cannot load is a ``ModelLoadError`` naming it."""
    import torch

    try:
        module: torch.jit.ScriptModule = torch.jit.load(str(path), map_location=device)  # type: ignore[no-untyped-call]
    except Exception as exc:  # torch raises RuntimeError, ValueError or zip errors for a bad file
        raise ModelLoadError(f"model {name!r}: {str(path)!r} is not a loadable TorchScript file: {exc}") from exc
    module.eval()
    return module


def load_served_module(
    path: str | Path, name: str, device: str | torch.device = "cpu"
) -> tuple[torch.nn.Module, list[str]]:
    """The module a backend calls for the model file ``path`` and its ``forward`` argument names.

    TorchScript loads in eval mode; a ``.pt2`` archive (told by its entries, whatever its suffix) through
    ``torch.export.load``, its program's module moved to ``device`` (an exported program is already in the
    mode it was exported in, and its module refuses ``eval()``).
    """
    if archive_format(path, name) == "pt2":
        program, _ = load_exported_program(path)
        names = [s.arg.name for s in program.graph_signature.input_specs if s.kind.name == "USER_INPUT"]
        return program.module().to(device), names
    module = load_torchscript(path, name, device)
    return module, forward_input_names(module)


def read_bundle_metadata(path: str | Path) -> dict[str, Any]:
    """A MONAI bundle's metadata: ``path`` is the bundle folder or its ``metadata.json`` itself."""
    path = Path(path)
    file = path / BUNDLE_METADATA if path.is_dir() else path
    try:
        text = file.read_bytes()
    except FileNotFoundError as exc:
        raise ModelNotFoundError(f"no bundle metadata at {str(file)!r}") from exc
    except OSError as exc:
        raise ConfigError(f"cannot read bundle metadata {str(file)!r}: {exc}") from exc
    meta = parse_metadata_text(text, source=str(file))
    if meta is None:
        raise ConfigError(f"bundle metadata {str(file)!r} is empty")
    return meta


def parse_metadata_text(text: str | bytes, *, source: str, what: str = "metadata.json") -> dict[str, Any] | None:
    """Decode a MONAI metadata payload (``what`` names where it came from); empty means absent."""
    if not text:
        return None
    try:
        meta = json.loads(text)
    except json.JSONDecodeError as exc:
        raise ConfigError(f"{source}: {what} is not valid JSON: {exc}") from exc
    if not isinstance(meta, dict):
        raise ConfigError(f"{source}: {what} must hold a JSON object, got {type(meta).__name__}")
    return meta


def forward_input_names(module: torch.jit.ScriptModule) -> list[str]:
    """Argument names of ``forward`` (without ``self``), as the TorchScript schema records them."""
    try:
        arguments = module.forward.schema.arguments  # type: ignore[attr-defined]
    except (AttributeError, RuntimeError):
        return []
    return [str(a.name) for a in arguments if a.name != "self"]


def input_names(count: int, schema_names: Sequence[str] = ()) -> list[str]:
    """Schema names when there is one valid, unique name per input, else ``INPUT__i``."""
    names = list(schema_names)[:count]
    if len(names) == count and len(set(names)) == count and all(TENSOR_NAME.match(n) for n in names):
        return names
    return [f"INPUT__{i}" for i in range(count)]


def output_names(count: int, keys: Sequence[Any] = ()) -> list[str]:
    """Dict keys when there is one valid, unique name per output, else ``OUTPUT__i``."""
    names = [k for k in keys if isinstance(k, str)][:count]
    if len(names) == count and len(set(names)) == count and all(TENSOR_NAME.match(n) for n in names):
        return names
    return [f"OUTPUT__{i}" for i in range(count)]


def spatial_dim(value: Any) -> int:
    """A bundle ``spatial_shape`` entry as a Triton dim: fixed ints stay, expressions become -1."""
    text = str(value).strip()
    return int(text) if _FIXED_DIM.match(text) else -1


def example_size(value: Any, symbol: int = 1) -> int | None:
    """A concrete size a ``spatial_shape`` entry allows: 96 -> 96, "16*n" -> 16 (``symbol=2``: 32), "*" -> None.

    Every symbol of an expression is set to ``symbol``; entries that are not integer arithmetic
    over symbols (``"*"``, ``-1``) give ``None``, since no size is implied.
    """
    text = str(value).strip()
    if _FIXED_DIM.match(text):
        return int(text) or None
    try:
        size = _evaluate(ast.parse(text, mode="eval").body, symbol)
    except (SyntaxError, ValueError):
        return None
    return size if 0 < size <= _MAX_EXAMPLE_SIZE else None


def _evaluate(node: ast.AST, symbol: int) -> int:
    """Integer arithmetic (+, *, **) over integer constants and symbols; anything else is a ValueError."""
    if isinstance(node, ast.Constant) and type(node.value) is int:
        return node.value
    if isinstance(node, ast.Name):
        return symbol
    if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Add | ast.Mult | ast.Pow):
        left, right = _evaluate(node.left, symbol), _evaluate(node.right, symbol)
        if isinstance(node.op, ast.Add):
            return left + right
        if isinstance(node.op, ast.Mult):
            return left * right
        if 0 <= right <= 32:
            return int(left**right)
    raise ValueError(f"not a spatial_shape expression: {ast.dump(node)}")


def network_format(name: str, meta: Mapping[str, Any]) -> Mapping[str, Any]:
    """``network_data_format`` with non-empty ``inputs`` and ``outputs``, or a ``ConfigError``."""
    fmt = meta.get("network_data_format")
    if not isinstance(fmt, Mapping) or not fmt.get("inputs") or not fmt.get("outputs"):
        raise ConfigError(f"model {name!r}: metadata has no network_data_format with inputs and outputs")
    return fmt


def example_shapes(name: str, meta: Mapping[str, Any], symbol: int = 1) -> list[tuple[int, ...]] | None:
    """One concrete input shape per metadata input (batch 1), or ``None`` when none is implied.

    ``symbol`` is the value of every symbol in ``spatial_shape`` expressions ("16*n" with 2 -> 32).
    """
    shapes = []
    for desc in network_format(name, meta)["inputs"].values():
        channels = example_size(desc.get("num_channels", "*"))
        spatial = [example_size(d, symbol) for d in desc.get("spatial_shape", ["*"])]
        if channels is None or None in spatial:
            return None
        shapes.append((1, channels, *(int(d) for d in spatial if d is not None)))
    return shapes


def signature_from_metadata(
    name: str,
    meta: Mapping[str, Any],
    *,
    schema_names: Sequence[str] = (),
    version: int | None = None,
    max_batch_size: int = 0,
) -> ModelSignature:
    """Build the signature from MONAI ``network_data_format`` (inputs/outputs in file order).

    Each tensor gets shape ``[batch, num_channels, *spatial]``; the batch dim is -1 when
    ``max_batch_size == 0`` and implicit otherwise, as in ``config.pbtxt``.
    """
    fmt = network_format(name, meta)
    in_items = list(fmt["inputs"].items())
    out_items = list(fmt["outputs"].items())
    in_names = input_names(len(in_items), schema_names)
    inputs = [_spec(name, n, d, max_batch_size) for n, (_, d) in zip(in_names, in_items, strict=True)]
    outputs = [_spec(name, f"OUTPUT__{i}", d, max_batch_size, output=True) for i, (_, d) in enumerate(out_items)]
    return ModelSignature(
        name=name,
        inputs=tuple(inputs),
        outputs=tuple(outputs),
        max_batch_size=max_batch_size,
        version=version,
        metadata=dict(meta),
    )


def _spec(model: str, tensor: str, desc: Mapping[str, Any], max_batch_size: int, *, output: bool = False) -> TensorSpec:
    """``[batch, num_channels, *spatial_shape]``; a class-score output ``[batch, num_channels]`` (``bundles.outputs``:
    the zoo writes those as ``spatial_shape [1, num_channels]``)."""
    where = f"model {model!r} tensor {tensor!r}"
    scores = tensor_dims(desc) if output else None
    if scores is not None:
        dtype = dtype_of(str(desc.get("dtype", "float32")))
        return TensorSpec(name=tensor, dtype=dtype, shape=scores if max_batch_size > 0 else (-1, *scores))
    if "spatial_shape" not in desc:
        raise ConfigError(f"{where}: network_data_format gives no spatial_shape, so the tensor rank is unknown")
    try:
        channels = int(desc.get("num_channels", -1))
        spatial = [spatial_dim(d) for d in desc.get("spatial_shape", [])]
        dtype = dtype_of(str(desc.get("dtype", "float32")))
    except (TypeError, ValueError) as exc:
        raise ConfigError(f"{where}: invalid network_data_format entry {dict(desc)}: {exc}") from exc
    shape = (channels, *spatial)
    return TensorSpec(name=tensor, dtype=dtype, shape=shape if max_batch_size > 0 else (-1, *shape))
