"""The local ``tritonserver`` launcher: the real server from the nvidia-pytriton wheel, on loopback."""

from ..discovery import TritonInstall as TritonInstall
from ..discovery import TritonLibrary as TritonLibrary
from ..discovery import find_triton_library as find_triton_library
from ..discovery import find_tritonserver as find_tritonserver
from .local import LocalTritonServer as LocalTritonServer
from .local import ServerState as ServerState
from .options import Ports as Ports
from .options import ServerOptions as ServerOptions

__all__ = [
    "LocalTritonServer",
    "Ports",
    "ServerOptions",
    "ServerState",
    "TritonInstall",
    "TritonLibrary",
    "find_triton_library",
    "find_tritonserver",
]
