"""monai-triton-ops: one App SDK inference operator, the backend chosen at run time.

Every name below is imported on first use (PEP 562), so ``import monai_triton_ops`` and the
``monai-triton`` command start without torch, MONAI, the App SDK or Holoscan; the backends and
tools still work in plain Python processes.
"""

import importlib
from typing import TYPE_CHECKING, Any

from . import cuda_runtime as _cuda_runtime
from .errors import MonaiTritonError as MonaiTritonError

# Holoscan (imported by `import monai`) needs libcudart.so.13; load the declared wheel's copy first (cuda_runtime.py).
_cuda_runtime.preload()

if TYPE_CHECKING:
    from .backends import BackendOptions as BackendOptions
    from .backends import BaseBackend as BaseBackend
    from .backends import available_backends as available_backends
    from .backends import create_backend as create_backend
    from .backends import register_backend as register_backend
    from .interrupts import install_signal_handlers as install_signal_handlers
    from .operators import Ensemble as Ensemble
    from .operators import EnsembleInferenceOperator as EnsembleInferenceOperator
    from .operators import InferenceOperator as InferenceOperator
    from .operators import Member as Member
    from .pipeline import InferenceSettings as InferenceSettings
    from .pipeline import run_inference as run_inference
    from .signature import ModelSignature as ModelSignature
    from .signature import TensorSpec as TensorSpec

__version__ = "0.1.0"
__all__ = [
    "BackendOptions",
    "BaseBackend",
    "Ensemble",
    "EnsembleInferenceOperator",
    "InferenceOperator",
    "Member",
    "InferenceSettings",
    "ModelSignature",
    "MonaiTritonError",
    "TensorSpec",
    "available_backends",
    "create_backend",
    "register_backend",
    "install_signal_handlers",
    "run_inference",
]

#: Public name -> the submodule that defines it.
_LAZY = {
    "BackendOptions": "backends",
    "BaseBackend": "backends",
    "available_backends": "backends",
    "create_backend": "backends",
    "register_backend": "backends",
    "install_signal_handlers": "interrupts",
    "Ensemble": "operators",
    "EnsembleInferenceOperator": "operators",
    "InferenceOperator": "operators",
    "Member": "operators",
    "InferenceSettings": "pipeline",
    "run_inference": "pipeline",
    "ModelSignature": "signature",
    "TensorSpec": "signature",
}


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(f".{module}", __name__), name)
    globals()[name] = value
    return value
