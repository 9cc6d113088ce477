"""Where a model folder can be used, and why a Triton server could not load it: the one place for those texts.

Users have several kinds of model folders (``kind_of``): what ``repo build`` writes (TorchScript with
the python runner, or for libtorch), a hand-written Python-backend model, the App SDK's client-side
folder (``config.pbtxt`` and no version folder), a bare model file with MONAI metadata, or another
platform's model. ``uses`` says what each can be used for here: the ``torch`` backend, the ``triton``
backend and ``monai-triton serve`` (this machine's Triton), the remote backends, an NGC container.

Why a Triton server could not load a folder (``Capabilities``, ``unservable``, ``load_failure`` and the fix
texts) is ``server/capabilities.py``'s, re-exported here: the server's readiness check uses it, and ``server/``
imports nothing from ``repository/``.
"""

from __future__ import annotations

from typing import Any

from ..errors import MonaiTritonError
from ..server.capabilities import FIX_FLAVOR as FIX_FLAVOR
from ..server.capabilities import FIX_INSTANCE_KIND as FIX_INSTANCE_KIND
from ..server.capabilities import Capabilities as Capabilities
from ..server.capabilities import backend_of as backend_of
from ..server.capabilities import gpu_count as gpu_count
from ..server.capabilities import load_failure as load_failure
from ..server.capabilities import unservable as unservable
from ..server.capabilities import wants_gpu as wants_gpu

# Folder kinds, as ``repo check`` prints them.
TORCHSCRIPT = "torchscript"
ONNX = "onnx"  # an ONNX file served by the python runner (ONNX Runtime inside it)
ONNXRUNTIME = "onnxruntime_onnx"  # Triton's own ONNX Runtime backend
LIBTORCH = "torchscript/libtorch"
PYTHON_MODEL = "python model"
WHOLE_VOLUME = "whole volume"
CLIENT_SIDE = "client-side"
MODEL_FILE = "model file"


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
            filename = str(config.parameters[TORCHSCRIPT_PARAMETER].string_value)
            return ONNX if filename.lower().endswith(".onnx") else TORCHSCRIPT
        return WHOLE_VOLUME if wrapped_network(config) else PYTHON_MODEL
    if backend == "pytorch":
        return LIBTORCH
    return str(config.platform or config.backend or "none")


def wrapped_network(config: Any) -> str | None:
    """The network a whole-volume model (``repo wrap``) calls; ``None`` for any other configuration."""
    from ..volume_spec import VolumeSpec
    from .config import METADATA_PARAMETER
    from .metadata import parse_metadata_text

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
    if kind in (ONNX, ONNXRUNTIME):
        yes.append("the onnx backend")
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
    elif kind == ONNX:
        yes.append("NGC Triton containers: tritonserver --model-config-name=onnxruntime (configs/onnxruntime.pbtxt)")
    elif kind == ONNXRUNTIME:
        yes.append("NGC Triton containers (Triton's onnxruntime backend)")
    return yes, no
