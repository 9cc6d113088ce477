"""MONAI Bundles, read with ``monai.bundle`` and run over any backend (shared by the operator and ``repo build``).

``read_bundle`` finds and builds a bundle (folder or TorchScript file with embedded configs), ``run_bundle``
runs one inference as the App SDK's bundle operator does, with any network (a backend's predictor).
This package imports no backend, pipeline, operator or CLI module.
"""

from .config import DEFAULT_CONFIG_NAMES as DEFAULT_CONFIG_NAMES
from .config import BundleConfig as BundleConfig
from .config import ItemNames as ItemNames
from .network import MetaNetwork as MetaNetwork
from .network import export_torchscript as export_torchscript
from .reader import Bundle as Bundle
from .reader import read_bundle as read_bundle
from .run import run_bundle as run_bundle
from .source import find_bundle as find_bundle
from .source import is_bundle as is_bundle

__all__ = [
    "DEFAULT_CONFIG_NAMES",
    "Bundle",
    "BundleConfig",
    "ItemNames",
    "MetaNetwork",
    "export_torchscript",
    "find_bundle",
    "is_bundle",
    "read_bundle",
    "run_bundle",
]
