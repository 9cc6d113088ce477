"""Model metadata -> ``ModelSignature``.

TorchScript stores no tensor names, dtypes or shapes, so the signature comes from MONAI's metadata
(``metadata.json`` in the TorchScript's extra files, as ``monai.data.save_net_with_metadata``
writes it). Input names follow the TorchScript ``forward`` schema when they are valid Triton names,
else ``INPUT__i``; outputs are ``OUTPUT__i``.
"""

from __future__ import annotations

import json
import logging
import re
import zipfile
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import torch

from ..errors import ConfigError, ModelLoadError
from ..signature import TENSOR_NAME, ModelSignature, TensorSpec, dtype_of

logger = logging.getLogger(__name__)

METADATA_FILE = "metadata.json"
#: A bundle spatial-shape entry that is a fixed size, e.g. 96 or "96".
_FIXED_DIM = re.compile(r"^\d+$")


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


def parse_metadata_text(text: str | bytes, *, source: str) -> dict[str, Any] | None:
    """Decode a ``metadata.json`` payload; empty means absent."""
    if not text:
        return None
    try:
        meta = json.loads(text)
    except json.JSONDecodeError as exc:
        raise ConfigError(f"{source}: metadata.json is not valid JSON: {exc}") from exc
    if not isinstance(meta, dict):
        raise ConfigError(f"{source}: metadata.json must hold an object, got {type(meta).__name__}")
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


def spatial_dim(value: Any) -> int:
    """A bundle ``spatial_shape`` entry as a Triton dim: fixed ints stay, expressions become -1."""
    text = str(value).strip()
    return int(text) if _FIXED_DIM.match(text) else -1


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
    fmt = meta.get("network_data_format")
    if not isinstance(fmt, Mapping) or not fmt.get("inputs") or not fmt.get("outputs"):
        raise ConfigError(f"model {name!r}: metadata has no network_data_format with inputs and outputs")
    in_items = list(fmt["inputs"].items())
    out_items = list(fmt["outputs"].items())
    in_names = input_names(len(in_items), schema_names)
    inputs = [_spec(name, n, d, max_batch_size) for n, (_, d) in zip(in_names, in_items, strict=True)]
    outputs = [_spec(name, f"OUTPUT__{i}", d, max_batch_size) for i, (_, d) in enumerate(out_items)]
    return ModelSignature(
        name=name, inputs=tuple(inputs), outputs=tuple(outputs), max_batch_size=max_batch_size,
        version=version, metadata=dict(meta),
    )


def _spec(model: str, tensor: str, desc: Mapping[str, Any], max_batch_size: int) -> TensorSpec:
    where = f"model {model!r} tensor {tensor!r}"
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
