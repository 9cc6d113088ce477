"""One bundle inference, step by step as the App SDK's ``MonaiBundleInferenceOperator.compute`` does it.

1. each input becomes a ``MetaTensor`` (``images.py``);
2. pre-processing runs on ``{name: tensor}`` (dictionary transforms) or on each tensor (array transforms);
3. the first input, batched, goes to the bundle's inferer with ``network`` (any backend, as a ``MetaNetwork``);
4. post-processing gets ``{output_name: prediction}`` together with the pre-processed inputs, which is what
   ``Invertd`` inverts;
5. each output is handed back with the pre-processed input's metadata (its ``meta``).

Pure: no Holoscan, no backend; the operator and the tests call ``run_bundle`` with any network.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

import torch
from monai.data import decollate_batch
from monai.utils import CommonKeys, ensure_tuple

from ..errors import BundleError, MonaiTritonError
from .network import MetaNetwork
from .reader import Bundle
from .transforms import is_map_compose

Network = Callable[[torch.Tensor], Any]
#: What MONAI's inferers are: ``inferer(inputs=batch, network=network)``.
Inferer = Callable[..., Any]


def run_bundle(
    bundle: Bundle, inputs: Mapping[str, torch.Tensor], network: Network, inferer: Inferer | None = None
) -> tuple[dict[str, Any], dict[str, Any]]:
    """Pre-processing, the bundle's inferer over ``network``, post-processing.

    ``inferer`` replaces the bundle's own: a network that runs the bundle's sliding window itself (a
    whole-volume model on a server) takes the whole image, through ``SimpleInferer``. Returns
    ``({output_name: value}, metadata)`` where ``metadata`` is the pre-processed first input's (what the App
    SDK gives the output ``Image``).
    """
    infer = bundle.inferer if inferer is None else inferer
    first_name = bundle.input_names[0]
    net = _as_meta(network, bundle)
    if bundle.detector is not None:  # the detector's network is the backend, whatever its inferer passes on
        bundle.detector.network = net
    with torch.no_grad():
        data = _stage(bundle, "preprocessing", lambda: _pre(bundle, dict(inputs)))
        kept = data[first_name]
        batch = data.pop(first_name)[None]
        outputs = _stage(bundle, "inferer", lambda: infer(inputs=batch, network=net))
        data[first_name] = kept
        result = _stage(bundle, "postprocessing", lambda: _post(bundle, outputs, data))
    named = _named(bundle, result)
    meta = dict(getattr(kept, "meta", {}) or {})
    return named, meta


def _as_meta(network: Network, bundle: Bundle) -> MetaNetwork:
    if isinstance(network, MetaNetwork):
        return network
    item = bundle.items.inferer
    return MetaNetwork(network, item=item, file=bundle.config.file_of(item))


def _pre(bundle: Bundle, data: dict[str, Any]) -> dict[str, Any]:
    if is_map_compose(bundle.pre):
        result = bundle.pre(data)
        if not isinstance(result, Mapping):
            raise BundleError(
                f"returned a {type(result).__name__}, not the dictionary", item=bundle.items.preprocessing
            )
        return dict(result)
    return {key: bundle.pre(value) for key, value in data.items()}


def _post(bundle: Bundle, outputs: Any, inputs: dict[str, Any]) -> Any:
    """The first image's prediction through the post-processing.

    A dictionary post-processing gets a tensor as ``{first output: prediction}`` (the App SDK's way), the heads
    of a network that returns a dict as ``{"pred": {head: map}}`` (MONAI's engines' way, which the model zoo's
    multi-head bundles flatten with ``FlattenSubKeysd``), and a detector's result (one dict per image) with its
    keys at the top level (``box``, ``label``, ``label_scores``: the zoo's detection post-processing) -- each
    together with the pre-processed inputs, which ``Invertd`` and ``AffineBoxToWorldCoordinated`` read.
    """
    heads = isinstance(outputs, Mapping)
    prediction = decollate_batch(outputs, detach=False)[0] if heads else ensure_tuple(outputs)[0]
    if not is_map_compose(bundle.post):
        return bundle.post(prediction)
    item: dict[str, Any]
    if heads:
        item = {str(CommonKeys.PRED): prediction}
    elif isinstance(prediction, Mapping):
        item = dict(prediction)
    else:
        item = {bundle.output_names[0]: prediction}
    item.update(inputs)
    return bundle.post(item)


def _named(bundle: Bundle, result: Any) -> dict[str, Any]:
    if isinstance(result, list | tuple):
        return dict(zip(bundle.output_names, result, strict=False))
    if isinstance(result, dict):
        missing = [name for name in bundle.output_names if name not in result]
        if missing == bundle.output_names and len(missing) == 1 and not _is_image(bundle, missing[0]):
            return {missing[0]: result}  # one object output (a detector's boxes, labels and scores): all of it
        if missing:
            raise BundleError(
                f"the post-processing's result has no key(s) {missing} (keys: {sorted(map(str, result))}); the "
                "outputs of network_data_format must be keys of it",
                file=bundle.config.file_of(bundle.items.postprocessing),
                item=bundle.items.postprocessing,
            )
        return {name: result[name] for name in bundle.output_names}
    return {bundle.output_names[0]: result}


def _is_image(bundle: Bundle, name: str) -> bool:
    return str(bundle.config.outputs[name].get("type", "image")) == "image"


def _stage(bundle: Bundle, stage: str, step: Callable[[], Any]) -> Any:
    """Run a transform chain or the inferer; a failure names the bundle's item and file (a backend's is its own)."""
    item = {"preprocessing": bundle.items.preprocessing, "inferer": bundle.items.inferer}.get(
        stage, bundle.items.postprocessing
    )
    try:
        return step()
    except MonaiTritonError:
        raise
    except (RuntimeError, KeyError, ValueError, TypeError, AttributeError, IndexError) as exc:
        raise BundleError(
            f"failed on this image: {' '.join(str(exc).split())[:300]}", file=bundle.config.file_of(item), item=item
        ) from exc
