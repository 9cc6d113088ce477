"""The CUDA 13 runtime that Holoscan loads, from the ``nvidia-cuda-runtime`` wheel this project depends on.

The App SDK's Holoscan build (``holoscan-cu13``) links ``libcudart.so.13`` but neither ships nor declares it:
an environment works only where a CUDA toolkit happens to be installed system-wide (``ImportError:
libcudart.so.13`` on a fresh machine or image, even without a GPU). This project declares the runtime as a
dependency and makes it findable, in the order that reaches the most processes:

- a container image: ``ld.so.conf.d`` names the wheel's folder (the MAP's Containerfile, via ``--lib-dir``);
- the development venv: ``make setup`` writes a ``.pth`` hook (``--write-site-hook``) that loads the library
  when any interpreter of the venv starts, before anything can import Holoscan;
- anywhere else: ``import monai_triton_ops`` loads it (:func:`preload`), so an app that imports this package
  before ``monai`` works unchanged.

Loading a library whose soname is already loaded satisfies every later dependency on that soname, which is
why loading it once, early, is enough. Nothing here raises: without the wheel, the system's library (if any)
is used as before.

    python -m monai_triton_ops.packaging.runtime_libs --lib-dir          # the folder holding libcudart.so.13
    python -m monai_triton_ops.packaging.runtime_libs --write-site-hook  # the .pth hook into this site-packages
"""

from __future__ import annotations

import ctypes
import importlib.util
import sysconfig
from pathlib import Path

#: The library Holoscan's shared objects name (``readelf -d libholoscan_core.so``: NEEDED).
SONAME = "libcudart.so.13"
#: Where the ``nvidia-cuda-runtime`` 13.x wheel puts it, below the ``nvidia`` namespace package.
WHEEL_SUBDIR = Path("cu13") / "lib"
#: The hook ``--write-site-hook`` writes; a ``.pth`` line that starts with ``import`` runs at interpreter start.
HOOK_NAME = "monai_triton_ops_cuda_runtime.pth"

_loaded: list[ctypes.CDLL] = []  # keeps the handle: the library stays loaded for the life of the process


def wheel_library() -> Path | None:
    """``.../site-packages/nvidia/cu13/lib/libcudart.so.13`` if the wheel is installed, else ``None``."""
    try:
        spec = importlib.util.find_spec("nvidia")
    except (ImportError, ValueError):
        return None
    for folder in (spec.submodule_search_locations or []) if spec is not None else []:
        candidate = Path(folder) / WHEEL_SUBDIR / SONAME
        if candidate.is_file():
            return candidate
    return None


def preload() -> Path | None:
    """Load the wheel's ``libcudart.so.13`` into this process (once); returns its path, or ``None`` without it."""
    library = wheel_library()
    if library is None:
        return None
    if not _loaded:
        try:
            _loaded.append(ctypes.CDLL(str(library), mode=ctypes.RTLD_GLOBAL))
        except OSError:
            return None
    return library


def site_hook_line(library: Path) -> str:
    """The one ``.pth`` line that loads ``library`` without importing this package (nor anything else of ours)."""
    path = repr(str(library))
    return f"import ctypes, os; os.path.isfile({path}) and ctypes.CDLL({path}, mode=ctypes.RTLD_GLOBAL)\n"


def write_site_hook(site_dir: Path | None = None) -> Path | None:
    """Write the ``.pth`` hook into ``site_dir`` (default: this site-packages); ``None`` without the wheel."""
    library = wheel_library()
    if library is None:
        return None
    target = Path(site_dir or sysconfig.get_paths()["purelib"]) / HOOK_NAME
    target.write_text(site_hook_line(library))
    return target
