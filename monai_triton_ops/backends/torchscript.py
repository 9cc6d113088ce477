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

    A tensor is the first output; a tuple/list maps by position; a dict maps by key when the keys
    are the signature's names, else by insertion order (TorchScript dicts keep it).
    """
    names = signature.output_names
    if isinstance(result, torch.Tensor):
        values: list[Any] = [result]
    elif isinstance(result, Mapping):
        if set(result) == set(names):
            return {n: result[n] for n in names}
        values = list(result.values())
    elif isinstance(result, tuple | list):
        values = list(result)
    else:
        raise InferenceError(f"model {signature.name!r} returned {type(result).__name__}, expected tensors")
    if len(values) != len(names) or not all(isinstance(v, torch.Tensor) for v in values):
        raise InferenceError(
            f"model {signature.name!r} returned {len(values)} value(s), its signature declares {len(names)} "
            f"output tensor(s) {list(names)}"
        )
    return dict(zip(names, values, strict=True))


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
