"""Where the model runs: the strategy, chosen by a spec string at run time."""

from .arrays import ArrayFamily as ArrayFamily
from .arrays import ArrayLike as ArrayLike
from .base import BackendState as BackendState
from .base import BaseBackend as BaseBackend
from .base import InferRequest as InferRequest
from .options import BackendOptions as BackendOptions
from .options import parse_options as parse_options
from .registry import BackendSpec as BackendSpec
from .registry import available_backends as available_backends
from .registry import create_backend as create_backend
from .registry import parse_backend_spec as parse_backend_spec
from .registry import register_backend as register_backend

__all__ = [
    "ArrayFamily",
    "ArrayLike",
    "BackendOptions",
    "BackendSpec",
    "BackendState",
    "BaseBackend",
    "InferRequest",
    "available_backends",
    "create_backend",
    "parse_backend_spec",
    "parse_options",
    "register_backend",
]
