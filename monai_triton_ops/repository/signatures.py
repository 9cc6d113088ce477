"""Where a local model's signature comes from, in order of authority.

1. ``<repo>/<name>/config.pbtxt`` when present: what a Triton server would serve is the truth.
2. MONAI metadata inside the model file.

The TorchScript backend uses this, so it validates exactly as a Triton backend over the same
repository would.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from ..errors import ConfigError
from ..signature import ModelSignature
from . import layout
from .metadata import read_torchscript_metadata, signature_from_metadata


def model_filename(repository: str | Path, name: str) -> str:
    """The model file name inside a version folder (``default_model_filename`` or ``model.pt``)."""
    layout.model_dir(repository, name)
    return layout.DEFAULT_MODEL_FILENAME


def local_signature(
    repository: str | Path, name: str, version: int, *, path: Path, schema_names: Sequence[str] = ()
) -> ModelSignature:
    """The signature of one version of a model in a local repository, whose file is ``path``."""
    meta = read_torchscript_metadata(path)
    if meta is None:
        raise ConfigError(
            f"model {name!r}: {str(path)!r} carries no MONAI metadata and there is no config.pbtxt; "
            f"generate one with: monai-triton repo build MODEL --name {name} --input-shape ..."
        )
    return signature_from_metadata(name, meta, schema_names=schema_names, version=version)
