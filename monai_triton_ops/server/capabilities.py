"""What a Triton server started from an install on this machine can load, and why a load failed.

``Capabilities`` are the install's backends and the machine's GPUs; ``unservable`` says, from a model's
``config.pbtxt`` alone, why such a server cannot load it and names the fix. When a server fails to load a model,
``load_failure`` reads the model's ``config.pbtxt`` and the install (never Triton's message text) and, when the
configuration explains the failure, returns one ``ModelLoadError`` (``model 'x' failed to load in WHERE: its
config.pbtxt ...``) that names the fix::

    a backend the server lacks (libtorch on the wheel's server)   ->  repo build ... --flavor python
    KIND_GPU instances on a machine without a GPU                 ->  repo build ... --instance-kind cpu

Both are exit code 2 (``exits.py``), wherever they are raised: ``LocalTritonServer`` / ``monai-triton serve`` and
the in-process ``triton`` backend call ``load_failure`` where a load fails. It lives with the server, below the
repository tools, because the server's readiness check needs it; ``repository.servable`` builds ``repo check``'s
answers on it.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from types import MappingProxyType
from typing import TYPE_CHECKING, Any

from ..errors import ModelLoadError

if TYPE_CHECKING:
    from ..discovery import TritonInstall

#: The file Triton reads a model's configuration from (``repository.layout.CONFIG_FILENAME``).
CONFIG_FILENAME = "config.pbtxt"
#: Triton platforms served by a backend of another name.
_PLATFORM_BACKENDS: Mapping[str, str] = MappingProxyType(
    {
        "pytorch_libtorch": "pytorch",
        "onnxruntime_onnx": "onnxruntime",
        "tensorrt_plan": "tensorrt",
        "tensorflow_graphdef": "tensorflow",
        "tensorflow_savedmodel": "tensorflow",
    }
)
#: Platforms Triton runs without a backend library.
_BUILT_IN = frozenset({"ensemble"})
#: Where Linux lists the NVIDIA GPUs its driver sees (present only with the driver loaded).
_NVIDIA_GPUS = Path("/proc/driver/nvidia/gpus")

#: The fixes, word for word; every message that names one takes it from here.
FIX_FLAVOR = (
    "rebuild it for the Python backend with 'monai-triton repo build MODEL -o REPO --name {name} --flavor python'"
)
FIX_INSTANCE_KIND = (
    "rebuild it with 'monai-triton repo build ... --instance-kind cpu' (or set kind: KIND_CPU in its "
    "config.pbtxt instance_group), or serve it on a machine with a GPU"
)


@dataclass(frozen=True, kw_only=True)
class Capabilities:
    """What a Triton server on this machine can load: its backends, and whether there is a GPU."""

    backends: frozenset[str]
    gpus: int

    @classmethod
    def of_install(cls, install: TritonInstall | None) -> Capabilities:
        """The backends a local server or in-process Triton started from ``install`` has (``python`` if its stub)."""
        backends = set()
        if install is not None and install.backends_dir is not None:
            backends |= {p.name for p in install.backends_dir.iterdir() if p.is_dir() and p.name != "python"}
        if install is not None and install.python_backend_dir is not None and install.stub_path is not None:
            backends.add("python")
        return cls(backends=frozenset(backends), gpus=gpu_count())


def gpu_count(environ: Mapping[str, str] | None = None) -> int:
    """NVIDIA GPUs the driver lists, as ``CUDA_VISIBLE_DEVICES`` narrows them (no CUDA import)."""
    env = os.environ if environ is None else environ
    found = len(list(_NVIDIA_GPUS.iterdir())) if _NVIDIA_GPUS.is_dir() else 0
    visible = env.get("CUDA_VISIBLE_DEVICES")
    if visible is None:
        return found
    chosen = [v for v in visible.split(",") if v.strip() and v.strip() != "-1"]
    return min(found, len(chosen))


def backend_of(config: Any) -> str | None:
    """The backend library a configuration needs (``pytorch`` for ``pytorch_libtorch``), ``None`` for built-ins."""
    if config.backend:
        return str(config.backend)
    platform = str(config.platform)
    if platform in _BUILT_IN or not platform:
        return None
    return _PLATFORM_BACKENDS.get(platform, platform)


def wants_gpu(config: Any) -> bool:
    """Whether an instance group asks for ``KIND_GPU`` (Triton then refuses the model without a GPU)."""
    from tritonclient.grpc import model_config_pb2 as pb

    return any(group.kind == pb.ModelInstanceGroup.KIND_GPU for group in config.instance_group)


def unservable(config: Any, capabilities: Capabilities) -> list[str]:
    """Why a Triton server with ``capabilities`` cannot load a model configured so: "what config.pbtxt asks; fix"."""
    name = str(config.name)
    found = []
    backend = backend_of(config)
    if backend is not None and backend not in capabilities.backends:
        have = ", ".join(sorted(capabilities.backends)) or "none"
        what = f"platform {config.platform!r}" if config.platform else f"backend {backend!r}"
        fix = FIX_FLAVOR.format(name=name) if backend == "pytorch" else f"serve it on a Triton with {backend!r}"
        lacking = f"which this server does not have (it has: {have})"
        found.append(f"needs Triton's {backend!r} backend ({what}), {lacking}; {fix}")
    if wants_gpu(config) and capabilities.gpus == 0:
        found.append(f"asks for KIND_GPU instances and this machine has no GPU; {FIX_INSTANCE_KIND}")
    return found


def load_failure(
    model_dir: Path, install: TritonInstall | None, reason: str = "", *, where: str = "the Triton server"
) -> ModelLoadError | None:
    """The error to raise instead of a bare load failure of ``model_dir``, when its configuration explains it.

    ``reason`` is Triton's own message, kept at the end for the record; it is never parsed.
    ``None`` when the configuration does not explain the failure (raise the caller's own error).
    """
    config = _config_or_none(model_dir)
    if config is None:
        return None
    found = unservable(config, Capabilities.of_install(install))
    if not found:
        return None
    told = f" (Triton: {reason.strip().splitlines()[0]})" if reason.strip() else ""
    return ModelLoadError(f"model {config.name!r} failed to load in {where}: its config.pbtxt {found[0]}{told}")


def read_config(model_dir: Path) -> Any:
    """The folder's ``config.pbtxt`` parsed (a ``ModelConfig``; comments and spacing do not matter), or ``None``
    when it is missing, unreadable or invalid. The one parse of a config below ``repository/``."""
    from google.protobuf import text_format
    from tritonclient.grpc import model_config_pb2  # not repository.config: that one imports torch

    try:
        text = (model_dir / CONFIG_FILENAME).read_text(encoding="utf-8")
        return text_format.Parse(text, model_config_pb2.ModelConfig())
    except (OSError, UnicodeDecodeError, text_format.ParseError):
        return None


def _config_or_none(model_dir: Path) -> Any:
    """The folder's ``config.pbtxt`` parsed as Triton reads it (an omitted name is the folder's), or ``None``
    when it is missing, unreadable, invalid, or names another model: then the configuration explains nothing.
    """
    config = read_config(model_dir)
    if config is None:
        return None
    if not config.name:
        config.name = model_dir.name
    elif config.name != model_dir.name:
        return None
    return config
