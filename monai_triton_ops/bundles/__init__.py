"""MONAI Bundles, read with ``monai.bundle`` and run over any backend (shared by the operator and ``repo build``).

``read_bundle`` finds and builds a bundle (folder or TorchScript file with embedded configs), ``run_bundle``
runs one inference as the App SDK's bundle operator does, with any network (a backend's predictor).
This package imports no backend, pipeline, operator or CLI module.

Its names are loaded when first used (PEP 562): ``monai.bundle`` imports the whole of MONAI (seconds), and a
command that only asks whether a path is a bundle (``repo describe`` of a Triton model folder) should not pay that.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from .compare import Difference as Difference
    from .compare import config_difference as config_difference
    from .config import BundleConfig as BundleConfig
    from .config import ItemNames as ItemNames
    from .network import MetaNetwork as MetaNetwork
    from .network import export_torchscript as export_torchscript
    from .reader import Bundle as Bundle
    from .reader import read_bundle as read_bundle
    from .run import run_bundle as run_bundle
    from .source import DEFAULT_CONFIG_NAMES as DEFAULT_CONFIG_NAMES
    from .source import find_bundle as find_bundle
    from .source import is_bundle as is_bundle

#: Each public name -> the module of this package that defines it.
_HOMES = {
    "DEFAULT_CONFIG_NAMES": "source",
    "BundleConfig": "config",
    "Difference": "compare",
    "config_difference": "compare",
    "ItemNames": "config",
    "MetaNetwork": "network",
    "export_torchscript": "network",
    "Bundle": "reader",
    "read_bundle": "reader",
    "run_bundle": "run",
    "find_bundle": "source",
    "is_bundle": "source",
}

__all__ = [
    "DEFAULT_CONFIG_NAMES",
    "Bundle",
    "BundleConfig",
    "Difference",
    "ItemNames",
    "MetaNetwork",
    "config_difference",
    "export_torchscript",
    "find_bundle",
    "is_bundle",
    "read_bundle",
    "run_bundle",
]


def __getattr__(name: str) -> Any:
    home = _HOMES.get(name)
    if home is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(f".{home}", __name__), name)
    globals()[name] = value
    return value
