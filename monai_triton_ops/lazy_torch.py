"""Torch only for callers that already have it: a process that never touches torch never imports it.

``import torch`` costs about 2.5 s of CPU. A remote backend fed numpy, ``monai-triton repo check`` or ``backends``
need none of it, so the modules on their path ask here instead of importing torch: a value can only be a tensor (or a
torch dtype) if torch is already in ``sys.modules``, since something had to import it to make one.
"""

from __future__ import annotations

import sys
from typing import TYPE_CHECKING, Any, TypeGuard

if TYPE_CHECKING:
    import torch


def is_tensor(value: Any) -> TypeGuard[torch.Tensor]:
    """Whether ``value`` is a torch tensor (a MetaTensor included), without importing torch."""
    module = sys.modules.get("torch")
    return module is not None and isinstance(value, module.Tensor)


def is_dtype(value: Any) -> TypeGuard[torch.dtype]:
    """Whether ``value`` is a torch dtype, without importing torch."""
    module = sys.modules.get("torch")
    return module is not None and isinstance(value, module.dtype)
