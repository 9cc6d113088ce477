"""The last resort of a remote backend (``fallback=torch``): the model in this process, from the local repository.

When no server can take a request (every server down, or a request's attempts spent on failures of the
servers, never on an error the model reported) the request runs on the in-process ``torch`` backend over
the model repository the app was given (``<repo>/<name>/<version>/model.pt``). The first time, one
WARNING says so and why; the servers stay the first choice, so requests go back to them as soon as a
probe finds one ready. The TorchScript module is loaded at the first fallback (at open when no server is
ready then); its file is checked at construction, so a fallback that could never run fails at once.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Mapping
from pathlib import Path

from ...errors import ConfigError, InferenceTimeoutError, MonaiTritonError
from ...repository import layout
from ...signature import ModelSignature
from ..base import ArrayLike, InferRequest
from ..registry import create_backend

logger = logging.getLogger(__name__)


class TorchFallback:
    """The in-process backend a remote one falls back to; thread-safe, opened once, closed with the remote one."""

    def __init__(self, model: str, repository: str | Path | None, version: int | None, *, max_in_flight: int) -> None:
        if repository is None:
            raise ConfigError(
                f"model {model!r}: fallback=torch needs the local model repository (model_repository=..., an app's -m)"
            )
        try:
            layout.resolve_version(Path(repository), model, version)
        except MonaiTritonError as exc:
            raise ConfigError(f"model {model!r}: fallback=torch cannot use {str(repository)!r}: {exc}") from exc
        self.model = model
        # Through the registry, as an app asks for it: the remote backend does not import another backend.
        self._backend = create_backend(
            "torch", model, model_repository=repository, version=version, max_in_flight=max_in_flight
        )
        self._lock = threading.Lock()
        self._said = False

    def open(self, reason: str) -> ModelSignature:
        """Load the model (once) and say, once, why requests run here."""
        with self._lock:
            if not self._said:
                self._said = True
                logger.warning(
                    "%s; model %r falls back to the in-process torch backend on %s (fallback=torch) until a server "
                    "is ready again",
                    reason,
                    self.model,
                    self._backend.model_repository,
                )
            self._backend.open()
        return self._backend.signature

    def run(self, request: InferRequest, reason: str) -> Mapping[str, ArrayLike]:
        """Run one request in this process, within what is left of its deadline."""
        remaining = request.remaining_s()
        if remaining is not None and remaining <= 0:
            raise InferenceTimeoutError(f"model {self.model!r}: the deadline passed before the fallback could run")
        self.open(reason)
        return self._backend.infer(request.inputs, outputs=request.outputs, timeout_s=remaining)

    def close(self) -> None:
        self._backend.close()
