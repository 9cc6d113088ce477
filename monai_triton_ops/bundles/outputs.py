"""What a bundle operator emits for each output: an App SDK ``Image``, or a plain result. The one place this is decided.

The decision comes from the output's ``network_data_format`` entry (``output_spec``), checked against the
``IOMapping`` type the app declares for the port (``check_port``), and made for each value after the
post-processing (``emit``):

- **image** (``OutputKind.IMAGE``): ``type`` ``"image"`` with a spatial shape (a segmentation, a generated
  image). Emitted as an App SDK ``Image`` exactly as the App SDK's bundle operator makes one
  (``images.tensor_to_image``); an ``np.ndarray`` port gets the array as it is.
- **class scores** (``OutputKind.SCORES``): one score per class and item. The model zoo writes these
  as ``type`` ``"probabilities"``/``"probability"``, ``format`` ``"classes"``/``"classification"``, or (its
  ``breast_density_classification``) ``type "image"`` with ``spatial_shape [1, num_channels]``: the zoo's way of
  saying "a ``(batch, classes)`` tensor". The Triton tensor is ``[-1, num_channels]`` (``tensor_dims``). Class
  names are the ``channel_def`` values when every channel has one, else ``class_<i>``. The plain result is
  ``classification_result``: ``{"probabilities": {name: score}, "predicted_class": name, "confidence": score}``
  (the App SDK pipeline generator's JSON shape).
- **any other result** (``OutputKind.RESULT``): any other ``type`` (``"tuples"``, ``"series"``, ``"boxes"``...),
  or a value the post-processing made that is not a tensor (a dict of heads, boxes and labels). The plain result
  is a dict of named arrays or numbers (``plain_result``); ``results.to_json`` makes any of them JSON.

The plain result reaches the port in the type its ``IOMapping`` declares (any type the App SDK allows):
``dict`` / ``Dict[...]`` / ``Mapping`` / ``Any`` / ``object`` the dict; ``str`` its JSON text (what the App SDK's
``DICOMTextSRWriterOperator`` writes into a DICOM SR); ``list`` / ``tuple`` the scores (or the value) as a list;
``float`` the top score; ``np.ndarray`` / ``torch.Tensor`` the post-processed value as the App SDK hands it on.
An ``Image`` port for a non-image output, or a type none of these, is refused when the operator is made
(``check_port``), naming the metadata file and the output. Other engineers' output kinds (several heads,
detection) go through ``emit`` too: a dict the post-processing makes is a ``RESULT`` whatever the metadata says.

Imports nothing heavy at module level: ``repository.metadata`` asks ``tensor_dims`` for every bundle signature.
"""

from __future__ import annotations

import enum
import json
import typing
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from ..errors import BundleError, InputDataError

#: ``type`` values of ``network_data_format`` outputs that hold one score per class.
SCORE_TYPES = frozenset({"probabilities", "probability", "classes", "classification", "scores", "logits"})
#: ``format`` values that say the same.
SCORE_FORMATS = frozenset({"classes", "classification", "probabilities"})


class OutputKind(enum.Enum):
    """What a bundle output is: a spatial image, class scores, or any other (JSON-ready) result."""

    IMAGE = "image"
    SCORES = "scores"
    RESULT = "result"


@dataclass(frozen=True)
class OutputSpec:
    """One ``network_data_format`` output as the operator reads it; ``where`` names it in errors."""

    name: str
    kind: OutputKind
    channels: int | None
    class_names: tuple[str, ...]
    file: str = ""

    @property
    def item(self) -> str:
        return f"network_data_format#outputs#{self.name}"


def _channels(desc: Mapping[str, Any]) -> int | None:
    try:
        value = int(desc.get("num_channels", -1))
    except (TypeError, ValueError):
        return None
    return value if value > 0 else None


def is_scores(desc: Mapping[str, Any]) -> bool:
    """Whether a ``network_data_format`` output is one score per class (a ``(batch, classes)`` tensor)."""
    kind = str(desc.get("type", "image")).lower()
    fmt = str(desc.get("format", "")).lower()
    if kind in SCORE_TYPES or fmt in SCORE_FORMATS:
        return True
    spatial = [str(d).strip() for d in desc.get("spatial_shape") or ()]
    channels = _channels(desc)
    return channels is not None and spatial == ["1", str(channels)]  # the zoo's "[1, classes]"


def output_kind(desc: Mapping[str, Any]) -> OutputKind:
    """The kind a ``network_data_format`` output entry declares (before any value is seen)."""
    if is_scores(desc):
        return OutputKind.SCORES
    return OutputKind.IMAGE if str(desc.get("type", "image")).lower() == "image" else OutputKind.RESULT


def tensor_dims(desc: Mapping[str, Any]) -> tuple[int, ...] | None:
    """The Triton dims (without the batch) of a class-score output, ``(num_channels,)``; ``None`` for other kinds
    (their dims are ``(num_channels, *spatial_shape)``, ``repository.metadata``'s rule)."""
    if not is_scores(desc):
        return None
    channels = _channels(desc)
    return (channels if channels is not None else -1,)


def class_names(name: str, desc: Mapping[str, Any], *, file: str = "") -> tuple[str, ...]:
    """The class names of a score output: ``channel_def`` values for channels ``0..C-1``, else ``class_<i>``.

    A ``channel_def`` that names some channels but not the ones ``num_channels`` gives is an error: the
    results would be labelled with the wrong classes.
    """
    channels = _channels(desc)
    defined = desc.get("channel_def") or {}
    if not isinstance(defined, Mapping) or not defined:
        return tuple(f"class_{i}" for i in range(channels or 0))
    keys = sorted(str(k) for k in defined)
    wanted = [str(i) for i in range(channels)] if channels is not None else keys
    if keys != sorted(wanted):
        raise BundleError(
            f"channel_def names {len(defined)} classes {keys} but num_channels is {channels} (channels "
            f"{wanted}); give one name per class, keyed '0'..'{len(wanted) - 1}'",
            file=file,
            item=f"network_data_format#outputs#{name}",
        )
    return tuple(str(defined[key]) for key in wanted)


def output_spec(name: str, desc: Mapping[str, Any], *, file: str = "") -> OutputSpec:
    """``name``'s entry in ``network_data_format#outputs`` read and checked (class names of a score output)."""
    kind = output_kind(desc)
    if kind is OutputKind.SCORES and _channels(desc) is None:
        raise BundleError(
            f"output {name!r} holds class scores (type {desc.get('type')!r}) but gives no num_channels (how many "
            f"classes: the tensor is [batch, num_channels]), got {desc.get('num_channels')!r}",
            file=file,
            item=f"network_data_format#outputs#{name}",
        )
    names = class_names(name, desc, file=file) if kind is OutputKind.SCORES else ()
    return OutputSpec(name=name, kind=kind, channels=_channels(desc), class_names=names, file=file)


def describe(outputs: Mapping[str, Mapping[str, Any]]) -> str:
    """One line for ``repo describe``: each output and what the operator emits for it."""
    parts = []
    for name, desc in outputs.items():
        spec = output_spec(name, desc)
        if spec.kind is OutputKind.SCORES:
            parts.append(f"{name}: class scores ({', '.join(spec.class_names)}), emitted as a result")
        else:
            parts.append(f"{name}: {'an Image' if spec.kind is OutputKind.IMAGE else 'a result'}")
    return "; ".join(parts)


# -- the port's declared type -------------------------------------------------------------------------------------
def port_form(data_type: Any) -> str:
    """An ``IOMapping.data_type`` as one of ``image``, ``dict``, ``text``, ``list``, ``number``, ``array``, ``tensor``
    (``""``: a type no form fits)."""
    from monai.deploy.core import Image

    origin = typing.get_origin(data_type) or data_type
    forms: list[tuple[Any, str]] = [
        (Image, "image"),
        (str, "text"),
        (float, "number"),
        (np.ndarray, "array"),
    ]
    if data_type is Any or data_type is object or data_type is None:
        return "dict"
    for kind, form in forms:
        if origin is kind:
            return form
    if isinstance(origin, type):
        if issubclass(origin, Mapping | dict):
            return "dict"
        if issubclass(origin, list | tuple) or origin is Sequence:
            return "list"
        if origin.__module__.startswith("torch") and origin.__name__ == "Tensor":
            return "tensor"
    return ""


def check_port(spec: OutputSpec, data_type: Any) -> str:
    """The form the port of ``spec`` takes (``port_form``), or a ``BundleError`` naming the metadata file and output."""
    form = port_form(data_type)
    type_name = getattr(data_type, "__name__", None) or str(data_type)
    if form == "image" and spec.kind is not OutputKind.IMAGE:
        raise BundleError(
            f"output {spec.name!r} is {spec.kind.value} (not a spatial image), but the operator's output_mapping "
            f"declares it an Image port; declare it IOMapping({spec.name!r}, dict, IOType.IN_MEMORY) (or str, list)",
            file=spec.file,
            item=spec.item,
        )
    if not form:
        raise BundleError(
            f"output_mapping declares output {spec.name!r} as {type_name}, which the operator cannot make; use "
            "Image (image outputs), dict, str, list, float, np.ndarray or torch.Tensor",
            file=spec.file,
            item=spec.item,
        )
    return form


# -- values -------------------------------------------------------------------------------------------------------
def scores_of(value: Any) -> np.ndarray:
    """A ``(classes,)`` float array from a post-processed score tensor ``(1, C)``, ``(C,)`` or ``(1, C, 1...)``."""
    array = value.detach().cpu().numpy() if hasattr(value, "detach") else np.asarray(value)
    while array.ndim > 1 and array.shape[0] == 1:
        array = array[0]
    return np.asarray(array, dtype=np.float64).reshape(-1)


def classification_result(scores: np.ndarray, names: Sequence[str]) -> dict[str, Any]:
    """``{"probabilities": {name: score}, "predicted_class": name, "confidence": score}`` (JSON-ready)."""
    labels = list(names) if len(names) == scores.size else [f"class_{i}" for i in range(scores.size)]
    best = int(np.argmax(scores)) if scores.size else 0
    return {
        "probabilities": {label: float(score) for label, score in zip(labels, scores, strict=True)},
        "predicted_class": labels[best] if labels else None,
        "confidence": float(scores[best]) if scores.size else None,
    }


def plain_result(name: str, value: Any) -> dict[str, Any]:
    """Any other value as a dict of named arrays or numbers: a dict stays (tensors as arrays), else ``{name: value}``"""
    if isinstance(value, Mapping):
        return {str(key): _plain(item) for key, item in value.items()}
    return {name: _plain(value)}


def _plain(value: Any) -> Any:
    if hasattr(value, "detach"):
        value = value.detach().cpu().numpy()
    if isinstance(value, np.ndarray) and value.ndim == 0:
        return value.item()
    if isinstance(value, Mapping):
        return {str(key): _plain(item) for key, item in value.items()}
    if isinstance(value, list | tuple):
        return [_plain(item) for item in value]
    return value


def to_json(value: Any) -> Any:
    """A result with its arrays as (nested) lists and numpy scalars as numbers: ``json.dumps`` takes it."""
    if isinstance(value, Mapping):
        return {str(key): to_json(item) for key, item in value.items()}
    if isinstance(value, list | tuple):
        return [to_json(item) for item in value]
    if hasattr(value, "detach"):
        value = value.detach().cpu().numpy()
    elif hasattr(value, "__array_interface__") and not isinstance(value, np.ndarray | np.generic):
        value = np.asarray(value)  # a Holoscan Tensor: emit() hands a dict's arrays on as those
    if isinstance(value, np.ndarray):
        return value.tolist()
    if isinstance(value, np.generic):
        return value.item()
    return value


def result_of(spec: OutputSpec, value: Any) -> dict[str, Any]:
    """The plain result of one output's post-processed value."""
    if spec.kind is OutputKind.SCORES and not isinstance(value, Mapping):
        return classification_result(scores_of(value), spec.class_names)
    return plain_result(spec.name, value)


def emit(spec: OutputSpec, form: str, value: Any, meta: dict[str, Any]) -> Any:
    """What the port of ``spec`` (of ``form``, from ``check_port``) gets for ``value`` after the post-processing."""
    if form == "array":  # as the App SDK's operator hands an np.ndarray port on
        return value.detach().cpu().numpy() if hasattr(value, "detach") else np.asarray(value)
    if form == "tensor":
        import torch

        return value if isinstance(value, torch.Tensor) else torch.as_tensor(np.asarray(value))
    if form == "image":
        if isinstance(value, Mapping) or np.ndim(value) < 3:  # (batch or channel, W, H) at least
            raise InputDataError(
                f"output {spec.name!r}: the post-processing made a {_shape_of(value)}, not an image; declare the "
                f"port with a non-Image type ({spec.file}, item {spec.item!r})"
            )
        from .images import tensor_to_image

        return tensor_to_image(value, meta)
    result = result_of(spec, value)
    if form == "dict":
        return result
    if form == "text":
        return json.dumps(to_json(result))
    if form == "number":
        if spec.kind is not OutputKind.SCORES:
            raise InputDataError(f"output {spec.name!r}: a float port takes class scores, got {_shape_of(value)}")
        return float(result["confidence"])
    if spec.kind is OutputKind.SCORES and not isinstance(value, Mapping):  # "list"
        return [float(score) for score in scores_of(value)]
    return to_json(_plain(value))


def _shape_of(value: Any) -> str:
    if isinstance(value, Mapping):
        return f"dict with keys {sorted(map(str, value))}"
    return f"value of shape {list(np.shape(value))}"


__all__ = [
    "OutputKind",
    "OutputSpec",
    "check_port",
    "class_names",
    "classification_result",
    "describe",
    "emit",
    "is_scores",
    "output_kind",
    "output_spec",
    "plain_result",
    "port_form",
    "result_of",
    "scores_of",
    "tensor_dims",
    "to_json",
]
