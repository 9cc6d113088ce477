"""In-process TorchScript (or a ``torch.export`` ``.pt2`` program): the default backend, no server needed.

Reads the same Triton repository layout as the server backends (``<repo>/<name>/<version>/model.pt``)
and the same signature, so switching to Triton later changes nothing but the spec string.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, cast

import torch

from ..errors import BackendStateError, ConfigError, DeviceUnavailableError, InferenceError
from ..repository import layout
from ..repository.metadata import load_served_module
from ..repository.onnx_model import DEFAULT_ONNX_FILENAME, is_onnx_file
from ..repository.runner.model import name_results
from ..repository.signatures import local_entry
from ..signature import ModelSignature
from .arrays import ArrayLike, as_torch
from .base import Availability, BaseBackend, InferRequest
from .options import BackendOptions

logger = logging.getLogger(__name__)


@dataclass(frozen=True, kw_only=True)
class TorchScriptOptions(BackendOptions):
    """``device``: where the module runs (``cpu``, ``cuda``, ``cuda:1``)."""

    device: str = "cpu"

    def __post_init__(self) -> None:
        super().__post_init__()
        try:
            torch.device(self.device)
        except RuntimeError as exc:
            raise ConfigError(f"option device={self.device!r} is not a torch device: {exc}") from exc


class TorchScriptBackend(BaseBackend):
    """Runs ``model.pt`` with ``torch.jit`` (a ``.pt2`` through ``torch.export.load``) under ``torch.inference_mode``
    on the base's worker pool.

    A loaded TorchScript module may be called from several threads at once; inference mode is
    entered per call (it is thread-local), so no lock serialises requests. Every call returns
    tensors allocated for it, so results are the caller's to keep without a copy.
    """

    kind = "torch"
    options_type = TorchScriptOptions

    @classmethod
    def availability(cls, scheme: str) -> Availability:
        """Runs wherever torch imports; says whether ``device=cuda`` can be chosen here."""
        cuda = "device=cuda available" if torch.cuda.is_available() else "CPU only here (no CUDA device)"
        return Availability(True, f"TorchScript in the app's process; {cuda}")

    def describe(self) -> str:
        return f"torch (TorchScript in this process, {cast(TorchScriptOptions, self.options).device})"

    def __init__(self, model_name: str, **kwargs: Any) -> None:
        super().__init__(model_name, **kwargs)
        if self.model_repository is None:
            raise ConfigError("the 'torch' backend needs a local model repository folder (model_repository=...)")
        if self.urls:
            raise ConfigError(f"the 'torch' backend takes no server URL, got {list(self.urls)}")
        self._repository: Path = self.model_repository
        self.device = _device(cast(TorchScriptOptions, self.options).device)
        self._module: torch.nn.Module | None = None

    def _open(self) -> ModelSignature:
        version, version_dir = layout.resolve_version(self._repository, self.model_name, self.version)
        entry = local_entry(self._repository, self.model_name)
        refuse_onnx(self.model_name, version_dir / entry.model_filename)
        path = layout.model_file(version_dir, self.model_name, entry.model_filename)
        module, names = load_served_module(path, self.model_name, self.device)
        signature = entry.signature(version, path=path, schema_names=names)
        bytes_tensors = [t.name for t in (*signature.inputs, *signature.outputs) if t.dtype == "BYTES"]
        if bytes_tensors:
            raise ConfigError(
                f"model {self.model_name!r}: tensors {bytes_tensors} are BYTES, which TorchScript tensors cannot "
                "hold; serve this model with Triton (a python-backend model) instead of the 'torch' backend"
            )
        self._module = module
        logger.info("loaded %s on %s", path, self.device)
        return signature

    def _infer(self, request: InferRequest) -> Mapping[str, ArrayLike]:
        module = self._module
        if module is None:  # close() cut this request off and released the module before it started
            raise BackendStateError(f"{self!r}: the model was released by close()")
        signature = self.signature
        args = [as_torch(request.inputs[name]).to(self.device) for name in signature.input_names]
        try:
            with torch.inference_mode():
                result = module(*args)
        except RuntimeError as exc:
            raise InferenceError(f"model {self.model_name!r} failed: {exc}") from exc
        outputs = name_outputs(signature, result)
        return {name: outputs[name] for name in request.outputs}

    def _close(self) -> None:
        self._module = None


def refuse_onnx(name: str, path: Path) -> None:
    """A ``ConfigError`` when the model file is ONNX (``config.pbtxt`` names ``model.onnx``, or a version folder
    without a config holds ``model.onnx`` and no ``model.pt``): this backend cannot run it, ``onnx`` can."""
    found = path if is_onnx_file(path) else path.with_name(DEFAULT_ONNX_FILENAME)
    if not (is_onnx_file(path) or (not path.is_file() and found.is_file())):
        return
    raise ConfigError(
        f"model {name!r}: its network is ONNX ({str(found)!r}), which the 'torch' backend (TorchScript and "
        "torch.export .pt2) cannot run; use --backend onnx (ONNX Runtime in this process) or --backend triton"
    )


def name_outputs(signature: ModelSignature, result: Any) -> dict[str, torch.Tensor]:
    """Give a model's raw result its signature names.

    One rule with the Triton runner (``runner/model.py``, which must stay standalone inside the
    server), so a model's outputs get the same names in-process and on Triton.
    """
    try:
        return name_results(signature.name, signature.output_names, result)
    except TypeError as exc:
        raise InferenceError(str(exc)) from exc


def _device(device: str) -> torch.device:
    dev = torch.device(device)
    if dev.type == "cuda" and not torch.cuda.is_available():
        raise DeviceUnavailableError(f"device {device!r} requested but CUDA is not available on this machine")
    return dev
