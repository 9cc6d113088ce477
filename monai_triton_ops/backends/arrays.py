"""Array families and the conversions every backend shares (numpy <-> torch, devices, split and join).

A request carries its inputs as the caller gave them (numpy, or torch on its device) and the
family the caller wants back, so a backend converts only when its transport needs to: the
TorchScript backend wants torch, a shared-memory region wants numpy, the C API takes either. Torch is imported only
where a torch value is asked for (``lazy_torch.py``): a caller that passes numpy never loads it.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Literal, TypeAlias

import numpy as np

from ..lazy_torch import is_tensor

if TYPE_CHECKING:
    import torch

#: What callers pass and get back: a numpy array or a torch tensor.
ArrayLike: TypeAlias = "np.ndarray | torch.Tensor"


@dataclass(frozen=True)
class ArrayFamily:
    """What a caller gets back: numpy, or torch on ``device``."""

    kind: Literal["numpy", "torch"]
    device: torch.device | None = None

    @classmethod
    def of(cls, value: ArrayLike) -> ArrayFamily:
        """The family of one array: torch on its device, else numpy."""
        if is_tensor(value):
            return cls("torch", value.device)
        return _NUMPY


_NUMPY = ArrayFamily("numpy")


def as_torch(value: ArrayLike) -> torch.Tensor:
    """A plain torch tensor, zero-copy where possible (numpy shares memory; MetaTensor is unwrapped)."""
    import torch

    if isinstance(value, torch.Tensor):
        return value if type(value) is torch.Tensor else value.as_subclass(torch.Tensor)
    return torch.from_numpy(np.ascontiguousarray(value))


def as_numpy(value: ArrayLike) -> np.ndarray:
    """A numpy array; a CPU tensor shares its memory, a GPU tensor is copied to the host."""
    if is_tensor(value):
        return value.detach().cpu().numpy()
    return np.asarray(value)


def to_numpy(value: ArrayLike) -> np.ndarray:
    """A C-contiguous numpy array of a caller's input (torch on any device, numpy, or a MetaTensor)."""
    if is_tensor(value):  # torch is imported only by a caller that has a tensor
        import torch

        tensor = value.detach()
        if type(tensor) is not torch.Tensor:
            tensor = tensor.as_subclass(torch.Tensor)
        if tensor.device.type != "cpu":
            tensor = tensor.cpu()
        if tensor.dtype == torch.bfloat16:
            tensor = tensor.view(torch.uint16)
        return np.ascontiguousarray(tensor.numpy())
    return np.ascontiguousarray(value)


def to_family(value: ArrayLike, family: ArrayFamily) -> ArrayLike:
    """``value`` in ``family``; tensors made under ``inference_mode`` come back as normal tensors.

    MONAI's sliding window blends in place, which an inference tensor refuses, so those are cloned.
    """
    if family.kind == "numpy":
        return as_numpy(value)
    tensor = as_torch(value)
    if family.device is not None and tensor.device != family.device:
        tensor = tensor.to(family.device)
    return tensor.clone() if tensor.is_inference() else tensor


def batch_of(inputs: Mapping[str, ArrayLike]) -> int:
    """The leading dim of the first input (inputs are validated to agree)."""
    return int(next(iter(inputs.values())).shape[0])


def split(inputs: Mapping[str, ArrayLike], size: int) -> list[dict[str, ArrayLike]]:
    """Views of ``inputs`` in chunks of at most ``size`` along axis 0, in order."""
    total = batch_of(inputs)
    return [{name: value[start : start + size] for name, value in inputs.items()} for start in range(0, total, size)]


def join(parts: Sequence[Mapping[str, ArrayLike]]) -> dict[str, ArrayLike]:
    """Concatenate per-request outputs along axis 0 in request order (one part: returned as is)."""
    if len(parts) == 1:
        return dict(parts[0])
    joined: dict[str, ArrayLike] = {}
    for name, first in parts[0].items():
        values = [part[name] for part in parts]
        if is_tensor(first):
            import torch

            joined[name] = torch.cat([as_torch(v) for v in values], dim=0)
        else:
            joined[name] = np.concatenate([as_numpy(v) for v in values], axis=0)
    return joined
