"""Read a bundle into what a run needs: configs, pre/post-processing, inferer, network file, tensor names.

``read_bundle(path, config_names)`` is the one entry point, shared by the operator (every backend) and by
``monai-triton repo build``: whatever reads a bundle reads it the same way. Everything that can be checked
without running the network is checked here, each failure a ``BundleError`` naming the file and item.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from monai.transforms import Compose

from ..errors import BundleError
from . import detection, transforms
from . import inferer as inferers
from .config import DEFAULT_CONFIG_NAMES, BundleConfig, ItemNames
from .network import network_file, scripted_network
from .outputs import output_spec
from .source import SERVED_SUFFIXES, find_bundle

logger = logging.getLogger(__name__)


@dataclass(frozen=True, eq=False)
class Bundle:
    """A bundle read and built: ``pre``/``post`` (loaders and savers dropped), ``inferer``, ``network``."""

    config: BundleConfig
    items: ItemNames
    pre: Compose
    post: Compose
    inferer: Any
    network: Path
    network_is_torchscript: bool
    scripted: torch.jit.ScriptModule | None = None  # network_def + weights, built and checked at read time
    detector: Any = None  # a detection bundle's detector (its 'detector' item), set up by 'detector_ops'

    @property
    def path(self) -> Path:
        return self.config.source.path

    @property
    def label(self) -> str:
        return self.config.source.label

    @property
    def input_names(self) -> list[str]:
        return list(self.config.inputs)

    @property
    def output_names(self) -> list[str]:
        return list(self.config.outputs)

    @property
    def metadata(self) -> dict[str, Any]:
        return self.config.metadata

    def describe(self) -> str:
        """One line for the log: where, which configs, what runs."""
        return (
            f"bundle {self.label} (configs {list(self.config.config_names)}): inputs {self.input_names}, outputs "
            f"{self.output_names}, inferer {inferers.describe(self.inferer)}, network {self.network.name}; "
            f"pre {transforms.names(self.pre)}, post {transforms.names(self.post)}"
        )


def read_bundle(
    path: str | Path, config_names: Sequence[str] = DEFAULT_CONFIG_NAMES, items: ItemNames | None = None
) -> Bundle:
    """Find, parse and build the bundle at ``path`` (folder or TorchScript file); nothing runs the network yet."""
    names = items or ItemNames()
    config = BundleConfig(find_bundle(path), config_names)
    check_single_input(config)
    for name, desc in config.outputs.items():  # class names that do not fit the classes: refused now
        output_spec(name, desc, file=config.metadata_file.label)
    network, is_script = network_file(config)
    served = is_script or network.suffix in SERVED_SUFFIXES  # a .pt2 / .onnx is served as it is
    scripted = None if served else scripted_network(config, network)  # weights that do not fit: an error now
    detector = detection.detector(config)  # before the inferer: a RetinaNet inferer reads the detector's set-up
    bundle = Bundle(
        config=config,
        items=names,
        pre=transforms.processing(config, names.preprocessing),
        post=transforms.processing(config, names.postprocessing),
        inferer=inferers.bundle_inferer(config, names.inferer),
        network=network,
        network_is_torchscript=is_script,
        scripted=scripted,
        detector=detector,
    )
    logger.info("%s", bundle.describe())
    return bundle


def check_single_input(config: BundleConfig) -> None:
    """A backend feeds the inferer's network one tensor: a bundle whose network takes more cannot run."""
    inputs = list(config.inputs)
    if len(inputs) != 1:
        raise BundleError(
            f"the network takes {len(inputs)} inputs {inputs}; a bundle runs on a backend with one input tensor "
            "(the inferer's), as the App SDK's sliding-window and simple inferers feed it",
            file=config.metadata_file.label,
            item="network_data_format#inputs",
        )
