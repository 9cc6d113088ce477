"""Where a local model's signature comes from, in order of authority.

1. ``<repo>/<name>/config.pbtxt`` when present: what a Triton server would serve is the truth.
2. MONAI metadata inside the model file.

The TorchScript backend uses this, so it validates exactly as a Triton backend over the same
repository would. ``config.py`` (and with it tritonclient) is imported only when a repository
entry has a ``config.pbtxt``.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from ..errors import ConfigError
from ..signature import ModelSignature
from . import layout
from .metadata import read_torchscript_metadata, signature_from_metadata

if TYPE_CHECKING:
    from tritonclient.grpc.model_config_pb2 import ModelConfig


@dataclass(frozen=True)
class LocalEntry:
    """One model folder of a local repository, its ``config.pbtxt`` read once (``None`` when absent)."""

    name: str
    config: ModelConfig | None

    @property
    def model_filename(self) -> str:
        """The TorchScript file name inside a version folder, as ``config.pbtxt`` says, else ``model.pt``.

        libtorch configs name it in ``default_model_filename``; python-flavour configs (whose own
        default file is the runner ``model.py``) in the ``torchscript_filename`` parameter.
        """
        if self.config is None:
            return layout.DEFAULT_MODEL_FILENAME
        from .config import torchscript_filename

        return torchscript_filename(self.config)

    def signature(self, version: int, *, path: Path, schema_names: Sequence[str] = ()) -> ModelSignature:
        """The signature of one version, whose TorchScript file is ``path``."""
        if self.config is not None:
            from .config import signature_from_config

            return signature_from_config(self.config, version=version)
        meta = read_torchscript_metadata(path)
        if meta is None:
            raise ConfigError(
                f"model {self.name!r}: {str(path)!r} carries no MONAI metadata and there is no config.pbtxt; "
                f"generate one with: monai-triton repo build MODEL --name {self.name} --input-shape ..."
            )
        return signature_from_metadata(self.name, meta, schema_names=schema_names, version=version)


def local_entry(repository: str | Path, name: str) -> LocalEntry:
    """Read ``<repo>/<name>/config.pbtxt`` if there is one; the folder must exist."""
    path = layout.model_dir(repository, name) / layout.CONFIG_FILENAME
    if not path.is_file():
        return LocalEntry(name=name, config=None)
    from .config import read_config

    return LocalEntry(name=name, config=read_config(path, name=name))


def model_filename(repository: str | Path, name: str) -> str:
    """The TorchScript file name of a model entry (see ``LocalEntry.model_filename``)."""
    return local_entry(repository, name).model_filename
