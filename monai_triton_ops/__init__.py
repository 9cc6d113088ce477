"""monai-triton-ops: one App SDK inference operator, the backend chosen at run time.

Heavy imports (the App SDK, Holoscan) load only when ``InferenceOperator`` is first used, so the
backends and tools work in plain Python processes.
"""

from typing import TYPE_CHECKING, Any

from .backends import BackendOptions as BackendOptions
from .backends import BaseBackend as BaseBackend
from .backends import available_backends as available_backends
from .backends import create_backend as create_backend
from .backends import register_backend as register_backend
from .errors import MonaiTritonError as MonaiTritonError
from .pipeline import InferenceSettings as InferenceSettings
from .pipeline import run_inference as run_inference
from .signature import ModelSignature as ModelSignature
from .signature import TensorSpec as TensorSpec

if TYPE_CHECKING:
    from .operators import InferenceOperator as InferenceOperator

__version__ = "0.1.0"
__all__ = [
    "BackendOptions",
    "BaseBackend",
    "InferenceOperator",
    "InferenceSettings",
    "ModelSignature",
    "MonaiTritonError",
    "TensorSpec",
    "available_backends",
    "create_backend",
    "register_backend",
    "run_inference",
]


def __getattr__(name: str) -> Any:
    if name == "InferenceOperator":
        from .operators import InferenceOperator

        return InferenceOperator
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
