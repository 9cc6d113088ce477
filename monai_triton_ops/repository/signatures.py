"""Where a local model's signature comes from, in order of authority.

1. ``<repo>/<name>/config.pbtxt`` when present: what a Triton server would serve is the truth.
2. MONAI metadata inside the model file.

The TorchScript backend uses this, so it validates exactly as a Triton backend over the same
repository would. ``config.py`` (and with it tritonclient) is imported only when a repository
entry has a ``config.pbtxt``.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING

from ..errors import ConfigError
from ..signature import ModelSignature
from . import layout
from .metadata import read_torchscript_metadata, signature_from_metadata

if TYPE_CHECKING:
    from tritonclient.grpc.model_config_pb2 import ModelConfig


def model_filename(repository: str | Path, name: str) -> str:
    """The TorchScript file name inside a version folder, as ``config.pbtxt`` says, else ``model.pt``.

    libtorch configs name it in ``default_model_filename``; python-flavour configs (whose own
    default file is the runner ``model.py``) in the ``torchscript_filename`` parameter.
    """
    config = _config(repository, name)
    if config is None:
        return layout.DEFAULT_MODEL_FILENAME
    from .config import torchscript_filename

    return torchscript_filename(config)


def local_signature(
    repository: str | Path, name: str, version: int, *, path: Path, schema_names: Sequence[str] = ()
) -> ModelSignature:
    """The signature of one version of a model in a local repository, whose file is ``path``."""
    config = _config(repository, name)
    if config is not None:
        from .config import signature_from_config

        return signature_from_config(config, version=version)
    meta = read_torchscript_metadata(path)
    if meta is None:
        raise ConfigError(
            f"model {name!r}: {str(path)!r} carries no MONAI metadata and there is no config.pbtxt; "
            f"generate one with: monai-triton repo build MODEL --name {name} --input-shape ..."
        )
    return signature_from_metadata(name, meta, schema_names=schema_names, version=version)


def _config(repository: str | Path, name: str) -> ModelConfig | None:
    """The parsed ``<repo>/<name>/config.pbtxt``, or ``None`` when the entry has none."""
    path = layout.model_dir(repository, name) / layout.CONFIG_FILENAME
    if not path.is_file():
        return None
    from .config import read_config

    return read_config(path, name=name)
