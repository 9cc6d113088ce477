"""The ``triton`` backend: Triton's core inside this process, through the C API binding.

The model repository is the app's model folder (``-m``), so the repository a remote fleet serves runs
here unchanged: same ``config.pbtxt``, same Triton scheduler, dynamic batcher and backends, no separate
server and no network hop. Every backend of the process shares one server (``shared`` counts the
holds; ``server.InProcessServer`` owns the server's life: load, drain, delete, exit).

A request goes to ``TRITONSERVER_ServerInferAsync``; the response callback reads the outputs, which the
binding's ``ArrayAllocator`` had Triton write straight into buffers lent by this backend's pool
(``leases``): views of those very buffers go to the caller, without a copy, and a buffer is reused only
once the caller has dropped every array of it (the contract's ownership rule; fresh memory per output
cost more than the copy it saves: the kernel zeroes every new page). A request is tracked once: one future,
its answer, completed by the response callback at the FINAL response (or failed by it, or at the landing
when the flight failed unanswered), and one registry of what is in flight, the server's ``flights``, which
owns the Triton request from submit until Triton lets go of it and deletes it then. A deadline cancels the
request in Triton, best effort (a Python-backend model already executing runs on).

    backend = create_backend("triton?log_verbose=1", "brain_tissue_seg", model_repository="model_repository")
"""

from __future__ import annotations

import contextlib
import logging
import struct
import time
from collections.abc import Callable, Mapping
from concurrent.futures import Future, InvalidStateError
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, cast

import numpy as np
import torch

from ...client import status
from ...errors import (
    BackendUnavailableError,
    ConfigError,
    InferenceError,
    ModelLoadError,
    MonaiTritonError,
    ServerNotFoundError,
)
from ...repository import layout
from ...repository.signatures import LocalEntry, local_entry
from ...signature import ModelSignature, TensorSpec
from ..arrays import ArrayLike, as_numpy
from ..base import CLOSE_TIMEOUT_S, Availability, BaseBackend, InferRequest
from ..leases import BufferPool
from ..options import BackendOptions
from . import shared

if TYPE_CHECKING:
    from ... import bindings

logger = logging.getLogger(__name__)


@dataclass(frozen=True, kw_only=True)
class TritonOptions(BackendOptions):
    """Options of the process's in-process server (the first backend to open starts it with them).

    ``log_verbose``: Triton's verbose log level (0 off); ``log_file``: where Triton logs (default a file
    in the server's temporary folder); ``exit_timeout_s``: how long stopping waits for requests in
    flight; ``shm_default_byte_size`` / ``shm_growth_byte_size``: the Python backend's shared-memory
    region per model instance; ``backend_config``: any other ``backend:setting=value`` (comma separated in
    a spec); thread counts of the buffer manager and model loading; ``library``: ``libtritonserver.so`` to
    load (default: ``TRITONSERVER_LIB``, ``TRITONSERVER_HOME``, ``/opt/tritonserver``, nvidia-pytriton).
    """

    log_verbose: int = 0
    log_file: Path | None = None
    exit_timeout_s: int = 15
    shm_default_byte_size: int | None = None
    shm_growth_byte_size: int | None = None
    backend_config: tuple[str, ...] = ()
    buffer_manager_thread_count: int | None = None
    model_load_thread_count: int | None = None
    library: Path | None = None

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.exit_timeout_s < 0:
            raise ConfigError(f"option exit_timeout_s must be >= 0 seconds, got {self.exit_timeout_s!r}")
        for name in ("buffer_manager_thread_count", "model_load_thread_count"):
            value = getattr(self, name)
            if value is not None and value < 1:
                raise ConfigError(f"option {name} must be >= 1, got {value!r}")
        self.backend_settings()  # refuse malformed entries now

    def backend_settings(self) -> tuple[tuple[str, str, str], ...]:
        """``(backend, setting, value)`` for every backend config option, the shm sizes included."""
        settings = []
        for size, setting in (
            (self.shm_default_byte_size, "shm-default-byte-size"),
            (self.shm_growth_byte_size, "shm-growth-byte-size"),
        ):
            if size is not None:
                settings.append(("python", setting, str(size)))
        for entry in self.backend_config:
            backend, colon, rest = entry.partition(":")
            setting, equals, value = rest.partition("=")
            if not (colon and equals and backend and setting):
                raise ConfigError(f"option backend_config entry {entry!r} is not 'backend:setting=value'")
            settings.append((backend, setting, value))
        return tuple(settings)

    def server_settings(self) -> shared.ServerSettings:
        return shared.ServerSettings(
            library_path=self.library,
            log_verbose=self.log_verbose,
            log_file=self.log_file,
            exit_timeout_s=self.exit_timeout_s,
            backend_config=self.backend_settings(),
            buffer_manager_thread_count=self.buffer_manager_thread_count,
            model_load_thread_count=self.model_load_thread_count,
        )


class _Answer:
    """One request's answer: the future the contract gets, and the outputs read so far.

    It never refers to the Triton request (the request holds it as its response callback's object, and a
    cycle would keep the future, hence the outputs and the buffers they were lent, until the garbage
    collector runs).
    """

    __slots__ = ("_translate", "future", "outputs")

    def __init__(self, translate: Callable[[BaseException], BaseException]) -> None:
        self.future: Future[Mapping[str, ArrayLike]] = Future()
        self.outputs: dict[str, ArrayLike] | None = {}  # None once failed
        self._translate = translate

    def deliver(self) -> None:
        """The FINAL response was read without error: the outputs go to the caller now, not at the request's
        release (Triton releases it a little later; the request keeps the inputs alive until then)."""
        outputs, self.outputs = self.outputs, None
        if outputs is not None:
            with contextlib.suppress(InvalidStateError):
                self.future.set_result(outputs)

    def fail(self, error: BaseException) -> None:
        """Fail the answer with ``error`` in the project's terms, unless it has its outcome already.

        Its traceback is kept as text (``detached``): frames would keep the outputs read so far, and the
        buffers they were lent, alive for as long as the caller keeps the error.
        """
        from ...bindings.flight import detached

        self.outputs = None
        if not self.future.done():
            detached(error)
            with contextlib.suppress(InvalidStateError):
                self.future.set_exception(self._translate(error))


class InProcessBackend(BaseBackend):
    """Runs a model of the app's repository on the process's in-process Triton server."""

    kind = "triton"
    options_type = TritonOptions

    @classmethod
    def availability(cls, scheme: str) -> Availability:
        """Runs where ``libtritonserver`` loads from a Triton install (its backends and stub are found from it)."""
        from ... import bindings

        try:
            library = bindings.load_library()
        except (ServerNotFoundError, OSError) as exc:
            return Availability(False, f"no Triton server library: {exc}")
        if library.install is None:
            return Availability(False, f"{library.path} is not inside a Triton install; set TRITONSERVER_HOME")
        return Availability(True, f"Triton's core in the app's process ({library.path})")

    def describe(self) -> str:
        return "triton (Triton server core in this process, C API)"

    def __init__(self, model_name: str, **kwargs: Any) -> None:
        super().__init__(model_name, **kwargs)
        if self.model_repository is None:
            raise ConfigError("the 'triton' backend needs the model repository folder (model_repository=..., or -m)")
        if self.urls:
            raise ConfigError(f"the 'triton' backend runs in this process and takes no server URL, got {self.urls}")
        self._repository = self.model_repository.resolve()
        self._server: shared.InProcessServer | None = None
        self._allocator: bindings.ArrayAllocator | None = None
        self._buffers = BufferPool()
        self._close_by: float | None = None  # close()'s deadline, which the server's end keeps too

    @property
    def server(self) -> shared.InProcessServer:
        """The shared server this backend holds (open backends only)."""
        if self._server is None:
            raise ConfigError(f"{self!r} holds no server (not open)")
        return self._server

    def _open(self) -> ModelSignature:
        from ... import bindings as b

        version, version_dir = layout.resolve_version(self._repository, self.model_name, self.version)
        entry = local_entry(self._repository, self.model_name)
        # Triton loads whatever the config names (model.py, model.pt, ...); the file is read only without a config.
        signature = entry.signature(version, path=version_dir / entry.model_filename)
        _refuse_bytes_in_a_numpy2_stub(signature, entry)
        options = cast(TritonOptions, self.options)
        try:
            self._server = shared.acquire(options.server_settings(), self._repository, self.model_name, self)
        except b.TritonError as exc:
            raise self._error(exc, loading=True) from exc
        self._allocator = b.ArrayAllocator("numpy", buffers=self._buffers.lend)
        logger.info("model %r loaded in the in-process Triton server", self.model_name)
        return signature

    def _submit(self, request: InferRequest) -> Future[Mapping[str, ArrayLike]]:
        answer = _Answer(self._error)
        try:  # from here the server owns the Triton request: it deletes it when refused or once landed
            self.server.submit(self._triton_request(request, answer), request, answer)
        except Exception as exc:  # refused synchronously: a closing server, an input Triton rejects
            raise self._error(exc) from exc
        return answer.future

    def _triton_request(self, request: InferRequest, answer: _Answer) -> bindings.TRITONSERVER_InferenceRequest:
        from ... import bindings as b

        allocator = self._allocator
        if allocator is None:
            raise InferenceError(f"{self!r}: no response allocator (not open)")
        triton_request = b.TRITONSERVER_InferenceRequest(self.server.server, self.model_name, self.version or -1)
        try:
            signature = self.signature
            for name, value in request.inputs.items():
                spec = signature.input(name)
                data = _input_data(spec, value)
                shape = tuple(int(d) for d in value.shape)
                triton_request.add_input(name, b.TRITONSERVER_DataType[spec.dtype], shape)
                triton_request.append_input_data(name, data)
            for name in request.outputs:
                triton_request.add_requested_output(name)
            triton_request.set_response_callback(allocator, None, _on_response, answer)
        except BaseException:  # never Triton's: deleted now, or it pins its model until collected
            triton_request.delete()
            raise
        return triton_request

    def _error(self, error: BaseException, *, loading: bool = False) -> BaseException:
        """The one translation of what the in-process server raised: Triton's errors through the status table
        all Triton backends share (``client/status.py``), as remotely; a load failure as the load's own error."""
        from ... import bindings as b

        model = self.model_name
        if loading:
            if isinstance(error, b.UnavailableError):  # a stub that cannot start or died: the environment
                return BackendUnavailableError(str(error))
            return ModelLoadError(f"model {model!r} failed to load in the in-process Triton server: {error}")
        if isinstance(error, b.TritonError):
            public: BaseException = status.to_public(
                status.from_triton_code(error.code.name, str(error)), model=model, url=status.IN_PROCESS
            )
        elif isinstance(error, MonaiTritonError):
            return error
        else:
            public = InferenceError(f"model {model!r}: reading Triton's answer failed: {error!r}")
        public.__cause__ = error
        return public

    def statistics(self) -> dict[str, Any]:
        """Triton's inference statistics for this model (executions, requests, batch sizes), as remotely."""
        from ... import bindings as b

        try:
            message = self.server.server.model_statistics(self.model_name, self.version or -1)
        except b.TritonError as exc:
            raise self._error(exc) from exc
        try:
            stats: dict[str, Any] = message.json()
        finally:
            message.delete()
        return stats

    def _cancel(self, request: InferRequest) -> None:
        server = self._server
        if server is not None:
            server.cancel(request)

    def close(self, timeout_s: float | None = None) -> None:
        """The contract's ``close``; the server, when this is its last holder, ends by the same deadline."""
        self._close_by = time.monotonic() + (CLOSE_TIMEOUT_S if timeout_s is None else max(0.0, timeout_s))
        super().close(timeout_s)

    def _close(self) -> None:
        self._buffers.clear()  # results still held by callers keep their own buffers
        if self._server is not None:
            self._server = None
            left = None if self._close_by is None else max(0.0, self._close_by - time.monotonic())
            shared.release(self.model_name, self, left)


def _refuse_bytes_in_a_numpy2_stub(signature: ModelSignature, entry: LocalEntry) -> None:
    """BYTES into a 2.51 Python-backend stub running numpy 2 crashes the stub (pitfall B1): say so at open."""
    config = entry.config
    if config is None or config.backend != "python" or "EXECUTION_ENV_PATH" in config.parameters:
        return
    if int(np.__version__.split(".")[0]) < 2:
        return
    bytes_inputs = [t.name for t in signature.inputs if t.dtype == "BYTES"]
    if bytes_inputs:
        raise ConfigError(
            f"model {signature.name!r}: inputs {bytes_inputs} are BYTES, which the Python backend stub of the "
            f"Triton library here (built against numpy 1) misreads under numpy {np.__version__} and crashes on; "
            "give the model an EXECUTION_ENV_PATH environment with numpy<2, or serve it from the NGC image"
        )


def _input_data(spec: TensorSpec, value: ArrayLike) -> Any:
    """What the request holds for one input: a contiguous CPU array or tensor, BYTES serialized."""
    if spec.dtype == "BYTES":
        return serialize_bytes(as_numpy(value))
    if isinstance(value, torch.Tensor):
        return value.detach().cpu().contiguous()
    return np.ascontiguousarray(value)


def _on_response(response: Any, flags: Any, answer: _Answer) -> None:
    """Keep each requested output (the allocator's own array); at FINAL, deliver them unless one failed.

    An error (the response's own, or reading it) fails the answer here, at once; nothing is raised into the
    binding (the flight's future then fails only for what happened outside this callback).
    """
    from ... import bindings as b

    outputs = answer.outputs
    try:
        if response is not None:
            try:
                if outputs is not None:  # not failed by an earlier response
                    for index in range(response.output_count):  # raises the response's error first
                        out = response.output(index)
                        if out.datatype is b.TRITONSERVER_DataType.BYTES:
                            outputs[out.name] = deserialize_bytes(out.buffer_user_object, out.byte_size, out.shape)
                        else:
                            outputs[out.name] = response.output_array(index, out)
            finally:
                response.delete()
    except Exception as exc:
        answer.fail(exc)
        return
    if flags & b.TRITONSERVER_ResponseCompleteFlag.FINAL:
        answer.deliver()


def serialize_bytes(array: np.ndarray) -> bytes:
    """Triton's BYTES layout: per element a little-endian uint32 length, then the bytes (no padding)."""
    parts = []
    for item in array.reshape(-1):
        data = item.encode() if isinstance(item, str) else bytes(item)
        parts.append(struct.pack("<I", len(data)))
        parts.append(data)
    return b"".join(parts)


def deserialize_bytes(buffer: Any, byte_size: int, shape: tuple[int, ...]) -> np.ndarray:
    """The inverse of :func:`serialize_bytes`: an object array of ``bytes`` shaped ``shape``."""
    raw = np.asarray(buffer, dtype=np.uint8)[:byte_size].tobytes() if byte_size else b""
    items, offset = [], 0
    while offset < len(raw):
        (length,) = struct.unpack_from("<I", raw, offset)
        items.append(raw[offset + 4 : offset + 4 + length])
        offset += 4 + length
    result = np.empty(len(items), dtype=np.object_)
    result[:] = items
    return result.reshape(shape)
