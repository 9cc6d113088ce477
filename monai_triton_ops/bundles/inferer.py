"""The bundle's own inferer object, as MONAI builds it from the config, with our backend as its network.

``SimpleInferer`` and ``SlidingWindowInferer`` (every argument: ``roi_size``, ``sw_batch_size``,
``overlap``, ``mode`` gaussian, ``sigma_scale``, ``padding_mode``, ``cval``...) and their relatives only
call the network on tensors, so any backend can be their network. An inferer that needs the network as a
``torch.nn.Module`` (MONAI's ``SaliencyInferer`` hooks its layers) cannot run a network that lives in a server,
and is refused with the item's name. A bundle's own inferer (``scripts/``, such as the model zoo's
``RetinaNetInferer``) runs as the bundle defines it; should it ask the network for what only a local module has
(``parameters()``, hooks), ``MetaNetwork`` answers with an error naming the inferer item.
"""

from __future__ import annotations

from typing import Any

from monai.inferers import Inferer, SimpleInferer, SliceInferer, SlidingWindowInferer

from ..errors import BundleError
from .config import BundleConfig

#: Inferers known to call their network only as ``network(tensor)``: safe with any backend.
CALLABLE_NETWORK = (SimpleInferer, SlidingWindowInferer, SliceInferer)


def bundle_inferer(config: BundleConfig, item: str = "inferer") -> Any:
    """The inferer item built by MONAI (``SimpleInferer()`` when the bundle has none, as in the App SDK)."""
    if not config.has(item):
        return SimpleInferer()
    inferer = config.parsed(item)
    if not callable(inferer):
        raise BundleError(
            f"must be a MONAI inferer, got a {type(inferer).__name__}", file=config.file_of(item), item=item
        )
    if not isinstance(inferer, CALLABLE_NETWORK) and _from_monai(inferer):
        kind = "an Inferer" if isinstance(inferer, Inferer) else "a callable"
        raise BundleError(
            f"{type(inferer).__name__} ({kind}) may need the network as a torch module, which no Triton backend has; "
            f"supported: {', '.join(c.__name__ for c in CALLABLE_NETWORK)}, or the bundle's own (scripts/) inferer",
            file=config.file_of(item),
            item=item,
        )
    return inferer


def _from_monai(inferer: Any) -> bool:
    """Whether the inferer is one of MONAI's own classes (a bundle's ``scripts/`` inferer is not): MONAI's others
    (``SaliencyInferer``) are known to hook the network's layers."""
    return type(inferer).__module__.split(".")[0] == "monai"


def describe(inferer: Any) -> str:
    """One line for the log: the inferer's class and its window settings."""
    if isinstance(inferer, SlidingWindowInferer):
        return (
            f"{type(inferer).__name__}(roi_size={inferer.roi_size}, sw_batch_size={inferer.sw_batch_size}, "
            f"overlap={inferer.overlap}, mode={inferer.mode}, sigma_scale={inferer.sigma_scale}, "
            f"padding_mode={inferer.padding_mode})"
        )
    return type(inferer).__name__
