"""A bundle's pre- and post-processing, as the App SDK's ``MonaiBundleInferenceOperator`` keeps them.

The configs' ``preprocessing`` / ``postprocessing`` items are built by MONAI; then the transforms whose
class name contains ``LoadImage`` or ``SaveImage`` are dropped (the image arrives in memory and the
result leaves through the operator's port), exactly the App SDK's ``filter_compose`` rule. Everything
else is kept as built: ``Invertd``, ``Lambdad``, activations, ``KeepLargestConnectedComponentd``...
"""

from __future__ import annotations

from monai.transforms import Compose, MapTransform

from ..errors import BundleError
from .config import BundleConfig

#: Transforms whose class name contains one of these are dropped (the App SDK's ``DISALLOW_LOAD_SAVE``).
DROPPED = ("LoadImage", "SaveImage")


def processing(config: BundleConfig, item: str) -> Compose:
    """Item ``item`` built by MONAI with the loaders and savers dropped; an empty ``Compose`` when absent."""
    if not config.has(item):
        return Compose([])
    built = config.parsed(item)
    if not isinstance(built, Compose):
        raise BundleError(
            f"must be a Compose of transforms, got a {type(built).__name__}", file=config.file_of(item), item=item
        )
    return drop_io(built)


def drop_io(compose: Compose) -> Compose:
    """Remove the ``LoadImage*`` / ``SaveImage*`` transforms (in place, as the App SDK does); returns ``compose``."""
    compose.transforms = tuple(t for t in compose.transforms if not any(d in type(t).__name__ for d in DROPPED))
    return compose


def is_map_compose(compose: Compose) -> bool:
    """Whether the chain works on dictionaries (its first transform is a ``MapTransform``), the App SDK's test."""
    return bool(compose.transforms) and isinstance(compose.transforms[0], MapTransform)


def names(compose: Compose) -> list[str]:
    """The class names of the transforms kept, for the log."""
    return [type(t).__name__ for t in compose.transforms]
