"""Dictionary transforms, as the App SDK's ``MonaiSegInferenceOperator`` runs them, without Holoscan.

App SDK apps and MONAI bundles describe pre- and post-processing with dictionary transforms
(``LoadImaged``, ``EnsureChannelFirstd``, ``Orientationd``, ``Spacingd``, ``Invertd``, ``SaveImaged``...)
keyed by ``input_key`` (default ``"image"``) and ``pred_key`` (default ``"pred"``). The steps are the
App SDK operator's, so a chain moves over unchanged and gives the same result:

1. ``pre_transforms({input_key: source})``: ``source`` is what ``LoadImaged`` reads (the App SDK passes the
   image's name and binds the image to an ``InMemImageReader``), or the image already loaded when the
   chain has no loader;
2. the item is collated into a batch of one (``list_data_collate``, as the App SDK's ``DataLoader`` does);
3. the inferer runs the backend on ``batch[input_key]`` and the prediction goes under ``pred_key``;
4. the batch is decollated and ``post_transforms`` run on the item, so ``Invertd(keys=pred_key,
   orig_keys=input_key, transform=pre_transforms)`` finds the operations the pre-transforms applied.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable, Mapping
from typing import Any

import numpy as np
import torch
from monai.data import decollate_batch, list_data_collate
from monai.transforms import Compose, LoadImaged, MapTransform

from ..backends.base import BaseBackend
from ..errors import ConfigError
from .ensemble import EnsemblePredictor
from .run import Transform, check_spatial_rank, predict
from .settings import InferenceSettings

logger = logging.getLogger(__name__)

#: The App SDK's default keys (``MonaiSegInferenceOperator.input_dataset_key`` / ``pred_dataset_key``).
INPUT_KEY = "image"
PRED_KEY = "pred"


def is_dictionary_transform(transform: Transform | None) -> bool:
    """Whether ``transform`` works on dictionaries: a ``MapTransform``, or a ``Compose`` holding one."""
    if transform is None:
        return False
    if isinstance(transform, MapTransform):
        return True
    return any(is_dictionary_transform(t) for t in _children(transform))


def has_loader(transform: Transform | None) -> bool:
    """Whether the chain loads its own input (``LoadImaged``), as App SDK chains bound to an image do."""
    if isinstance(transform, LoadImaged):
        return True
    return any(has_loader(t) for t in _children(transform))


def _children(transform: Transform | None) -> Iterable[Transform]:
    return list(transform.transforms) if isinstance(transform, Compose) else []


def run_dictionary_inference(
    data: Mapping[str, Any],
    backend: BaseBackend,
    settings: InferenceSettings,
    *,
    pre_transforms: Callable[[Any], Any] | None,
    post_transforms: Callable[[Any], Any] | None,
    input_key: str = INPUT_KEY,
    pred_key: str = PRED_KEY,
    predictor: EnsemblePredictor | None = None,
) -> torch.Tensor:
    """Pre-transforms, inferer over ``backend``, post-transforms on one item; returns ``item[pred_key]``.

    The result is channel first, ``(C, *spatial)``, on the grid the post-transforms leave it on
    (the input's, after ``Invertd``).
    """
    item = _apply(pre_transforms, dict(data), "pre", input_key, pred_key, backend)
    _check_item(item, input_key, "the pre-transforms' result", backend)
    batch = list_data_collate([item])
    images = batch[input_key]
    check_spatial_rank(images[0], backend)
    logger.info("inferring %s image of shape %s with %r", settings.inferer, tuple(images.shape[1:]), backend)
    with torch.no_grad():
        batch[pred_key] = predict(images, backend, settings, predictor)
    if not isinstance(batch[pred_key], torch.Tensor):
        raise ConfigError("the inferer returned several outputs; pick one with the backend's output_name option")
    items = [_apply(post_transforms, i, "post", input_key, pred_key, backend) for i in decollate_batch(batch)]
    _check_item(items[0], pred_key, "the post-transforms' result", backend)
    result = items[0][pred_key]
    return result if isinstance(result, torch.Tensor) else torch.as_tensor(result)


def _apply(
    transform: Callable[[Any], Any] | None,
    item: dict[str, Any],
    stage: str,
    input_key: str,
    pred_key: str,
    backend: Any,
) -> Any:
    """Run a chain on ``item``; MONAI's error (often a missing key) gets the keys the operator used."""
    if transform is None:
        return item
    try:
        return transform(item)
    except (KeyError, RuntimeError) as exc:
        raise ConfigError(
            f"model {backend.model_name!r}: the {stage}-transforms failed on a dictionary with keys "
            f"{sorted(map(str, item))} (input_dataset_key {input_key!r}, pred_dataset_key {pred_key!r}): "
            f"{str(exc).splitlines()[0]}"
        ) from exc


def _check_item(item: Any, key: str, what: str, backend: BaseBackend) -> None:
    if not isinstance(item, Mapping):
        raise ConfigError(
            f"model {backend.model_name!r}: {what} is a {type(item).__name__}, not a dictionary; "
            "dictionary transforms must return the dictionary"
        )
    if key not in item:
        raise ConfigError(
            f"model {backend.model_name!r}: {what} has no key {key!r} (keys: {sorted(map(str, item))}); set the "
            "operator's input_dataset_key / pred_dataset_key to the keys the transforms use"
        )


def as_labels(array: np.ndarray) -> np.ndarray:
    """A label map as uint8 (``MonaiSegInferenceOperator`` does the same); anything else unchanged."""
    if array.dtype == np.uint8 or array.size == 0:
        return array
    if np.issubdtype(array.dtype, np.integer) or np.issubdtype(array.dtype, np.floating):
        low, high = float(array.min()), float(array.max())
        if low >= 0 and high <= 255 and np.array_equal(array, np.round(array)):
            return array.astype(np.uint8)
    return array
