"""In-process TorchScript: the default backend, no server needed.

Reads the same Triton repository layout as the server backends (``<repo>/<name>/<version>/model.pt``)
and the same signature, so switching to Triton later changes nothing but the spec string.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import torch

from ..errors import ConfigError, InferenceError, ModelLoadError
from ..repository import layout
from ..repository.metadata import forward_input_names
from ..repository.runner.model import name_results
from ..repository.signatures import local_entry
from ..signature import ModelSignature
from .base import BaseBackend

logger = logging.getLogger(__name__)


class TorchScriptBackend(BaseBackend):
    """Runs ``model.pt`` with ``torch.jit`` under ``torch.inference_mode``.

    A loaded TorchScript module may be called from several threads at once; inference mode is
    entered per call (it is thread-local), so no lock serialises requests.
    """

    kind = "torch"

    def __init__(
        self,
        *,
        model_repository: str | Path | None,
        model_name: str,
        version: int | None = None,
        device: str = "cpu",
        output_name: str | None = None,
    ) -> None:
        super().__init__(model_name, output_name=output_name)
        if model_repository is None:
            raise ConfigError("the 'torch' backend needs a local model repository folder")
        self.model_repository = Path(model_repository)
        self.version = version
        self.device = _device(device)
        self._module: torch.jit.ScriptModule | None = None

    def _open(self) -> ModelSignature:
        version, version_dir = layout.resolve_version(self.model_repository, self.model_name, self.version)
        entry = local_entry(self.model_repository, self.model_name)
        path = layout.model_file(version_dir, self.model_name, entry.model_filename)
        module = _load(path, self.device, self.model_name)
        signature = entry.signature(version, path=path, schema_names=forward_input_names(module))
        self._module = module
        logger.info("loaded TorchScript %s on %s", path, self.device)
        return signature

    def _infer(self, inputs: dict[str, torch.Tensor]) -> Mapping[str, torch.Tensor]:
        module = self._module
        if module is None:  # closed by another thread between the state check and here
            raise InferenceError(f"model {self.model_name!r} was released")
        signature = self.signature
        args = [inputs[name].to(self.device) for name in signature.input_names]
        try:
            with torch.inference_mode():
                result = module(*args)
        except RuntimeError as exc:
            raise InferenceError(f"model {self.model_name!r} failed: {exc}") from exc
        return name_outputs(signature, result)

    def _close(self) -> None:
        self._module = None


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
    try:
        dev = torch.device(device)
    except RuntimeError as exc:
        raise ConfigError(f"invalid device {device!r}: {exc}") from exc
    if dev.type == "cuda" and not torch.cuda.is_available():
        raise ConfigError(f"device {device!r} requested but CUDA is not available on this machine")
    return dev


def _load(path: Path, device: torch.device, name: str) -> torch.jit.ScriptModule:
    try:
        module: torch.jit.ScriptModule = torch.jit.load(str(path), map_location=device)  # type: ignore[no-untyped-call]
    except Exception as exc:  # torch raises RuntimeError, ValueError or zip errors for a bad file
        raise ModelLoadError(f"model {name!r}: {str(path)!r} is not a loadable TorchScript file: {exc}") from exc
    module.eval()
    return module
