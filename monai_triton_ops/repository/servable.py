"""Where a model folder can be used, and why a Triton server could not load it: the one place for those texts.

Users have several kinds of model folders (``kind_of``): what ``repo build`` writes (TorchScript with
the python runner, or for libtorch), a hand-written Python-backend model, the App SDK's client-side
folder (``config.pbtxt`` and no version folder), a bare model file with MONAI metadata, or another
platform's model. ``uses`` says what each can be used for here: the ``torch`` backend, the ``triton``
backend and ``monai-triton serve`` (this machine's Triton), the remote backends, an NGC container.

When a Triton server fails to load a model, ``load_failure`` reads the model's ``config.pbtxt`` and
the server's install (never Triton's message text) and, when the configuration explains it, returns
one ``ModelLoadError`` (``model 'x' failed to load in WHERE: its config.pbtxt ...``) that names the fix::

    a backend the server lacks (libtorch on the wheel's server)   ->  repo build ... --flavor python
    KIND_GPU instances on a machine without a GPU                 ->  repo build ... --instance-kind cpu

Both are exit code 2 (``exits.py``), wherever they are raised: the in-process ``triton`` backend and
``LocalTritonServer`` / ``monai-triton serve`` call ``load_failure`` where a load fails.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from types import MappingProxyType
from typing import TYPE_CHECKING, Any

from ..errors import ModelLoadError, MonaiTritonError
from . import layout

if TYPE_CHECKING:
    from ..server.discovery import TritonInstall

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

# Folder kinds, as ``repo check`` prints them.
TORCHSCRIPT = "torchscript"
LIBTORCH = "torchscript/libtorch"
PYTHON_MODEL = "python model"
WHOLE_VOLUME = "whole volume"
CLIENT_SIDE = "client-side"
MODEL_FILE = "model file"


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


def _config_or_none(model_dir: Path) -> Any:
    from .config import read_config

    path = model_dir / layout.CONFIG_FILENAME
    if not path.is_file():
        return None
    try:
        return read_config(path, name=model_dir.name)
    except MonaiTritonError:
        return None


def kind_of(config: Any, has_versions: bool) -> str:
    """What a model folder holds: one of the kinds above, or the configuration's platform/backend."""
    if config is None:
        return MODEL_FILE
    if not has_versions:
        return CLIENT_SIDE
    from .config import TORCHSCRIPT_PARAMETER

    backend = backend_of(config)
    if backend == "python":
        if TORCHSCRIPT_PARAMETER in config.parameters:
            return TORCHSCRIPT
        return WHOLE_VOLUME if wrapped_network(config) else PYTHON_MODEL
    if backend == "pytorch":
        return LIBTORCH
    return str(config.platform or config.backend or "none")


def wrapped_network(config: Any) -> str | None:
    """The network a whole-volume model (``repo wrap``) calls; ``None`` for any other configuration."""
    from .config import METADATA_PARAMETER
    from .metadata import parse_metadata_text
    from .volume import VolumeSpec

    if config is None or METADATA_PARAMETER not in config.parameters:
        return None
    try:
        metadata = parse_metadata_text(config.parameters[METADATA_PARAMETER].string_value, source=str(config.name))
        spec = VolumeSpec.of(metadata)
    except MonaiTritonError:
        return None
    return None if spec is None else spec.network


def uses(kind: str, config: Any, capabilities: Capabilities | None) -> tuple[list[str], list[str]]:
    """``(what the folder can be used for, what not and why)``; ``capabilities`` of this machine's Triton, if any."""
    yes, no = [], []
    if kind in (TORCHSCRIPT, LIBTORCH, MODEL_FILE):
        yes.append("the torch backend")
    else:
        no.append("the torch backend (no TorchScript file)")
    if kind == CLIENT_SIDE:
        no.append("serving (no version folder)")
    elif kind == MODEL_FILE:
        no.append("Triton (no config.pbtxt: monai-triton repo build writes one)")
    elif capabilities is None:
        no.append("the triton backend and monai-triton serve (no Triton install found here)")
    else:
        problems = unservable(config, capabilities)
        if problems:
            no.append(f"the triton backend and monai-triton serve: config.pbtxt {problems[0].split('; ', 1)[0]}")
        else:
            yes.append("the triton backend and monai-triton serve")
    if kind == WHOLE_VOLUME:
        network = wrapped_network(config)
        yes.append(f"remote backends (grpc://, http://) in mode=volume, for the network {network!r}")
        yes.append("NGC Triton containers with what its model.py imports (torch, MONAI) installed")
        return yes, no
    if config is not None:
        yes.append("remote backends (grpc://, http://) and the App SDK's TritonRemoteModel, as its client-side config")
    if kind == LIBTORCH:
        yes.append("NGC Triton containers")
    elif kind in (TORCHSCRIPT, PYTHON_MODEL):
        yes.append("NGC Triton containers with what its model.py imports (torch) installed")
    return yes, no
