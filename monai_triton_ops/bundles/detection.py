"""A detection bundle's detector, set up as the bundle defines it, with the backend as its network.

The model zoo's detection bundles (``lung_nodule_ct_detection``) build a ``RetinaNetDetector`` (item
``detector``: anchors, box coder, box selection, NMS) around their RetinaNet, set it up with the calls of
item ``detector_ops`` (target keys, box selector thresholds, the sliding window over the network), and run
it through a bundle-local inferer (``scripts.detection_inferer.RetinaNetInferer``) that hands the detector
the network it is given. Here only the network runs on the backend: ``run_bundle`` makes the backend the
detector's network (a ``MetaNetwork`` returning RetinaNet's own dict of heads per feature level), and the
detector and the inferer run beside the app, as MONAI runs them.

Order matters: ``detector_ops`` runs when the bundle is read, before the inferer is built, because the
zoo's inferer decides at construction whether it uses the detector's sliding window (from the window set
by ``detector_ops``); built the other way round it skips the window and finds other boxes.
"""

from __future__ import annotations

from typing import Any

from ..errors import BundleError
from .config import BundleConfig

#: The config items of a detection bundle.
DETECTOR, DETECTOR_OPS = "detector", "detector_ops"


def detector(config: BundleConfig) -> Any:
    """The bundle's detector set up by its ``detector_ops``; ``None`` for a bundle without a ``detector`` item."""
    if not config.has(DETECTOR):
        return None
    if not config.has(DETECTOR_OPS):
        raise BundleError(
            "has no 'detector_ops' item: a detection bundle sets up its detector there (target keys, box selector, "
            "sliding window: '$@detector.set_sliding_window_inferer(...)'), and the inferer relies on it",
            file=config.file_of(DETECTOR_OPS),
            item=DETECTOR_OPS,
        )
    built = config.parsed(DETECTOR)
    if not hasattr(built, "network") or not callable(built):
        raise BundleError(
            f"must build a detector holding its network (a RetinaNetDetector), got a {type(built).__name__}",
            file=config.file_of(DETECTOR),
            item=DETECTOR,
        )
    config.parsed(DETECTOR_OPS)
    return built
