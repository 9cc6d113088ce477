"""Where the model runs: the strategy, chosen by a spec string at run time."""

from .base import ArrayLike as ArrayLike
from .base import Backend as Backend
from .base import BackendState as BackendState
from .base import BaseBackend as BaseBackend
from .registry import available_backends as available_backends
from .registry import create_backend as create_backend
from .registry import parse_backend_spec as parse_backend_spec
from .registry import register_backend as register_backend

__all__ = [
    "ArrayLike",
    "Backend",
    "BackendState",
    "BaseBackend",
    "available_backends",
    "create_backend",
    "parse_backend_spec",
    "register_backend",
]
