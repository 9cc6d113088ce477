"""The one exception tree of monai-triton-ops.

Misuse (the caller passed something wrong) is kept apart from the environment (a file, a server or
a package is missing or broken), and each error also subclasses the matching built-in so that
``except ValueError`` or ``except TimeoutError`` keeps working for callers that do not know us::

    MonaiTritonError
    ├── UsageError (ValueError)                  the caller asked for something invalid
    │   ├── BackendSpecError                     unknown or malformed backend spec string
    │   ├── InputValidationError                 a tensor does not match the model signature
    │   ├── ConfigError                          invalid option, config.pbtxt or metadata
    │   │   └── BundleError                      a MONAI Bundle that cannot be read or run: names file and item
    │   ├── InputDataError                       an image, file or folder the app cannot use
    │   └── ConversionError                      a model that cannot be converted, or whose conversion differs
    ├── BackendStateError (RuntimeError)         used before open() or after close()
    ├── BackendUnavailableError (ImportError)    backend not built yet, or its package missing
    ├── DeviceUnavailableError (RuntimeError)    a requested device (CUDA) is not on this machine
    ├── ServerUnavailableError (ConnectionError) a remote Triton server cannot be reached or is not ready
    ├── ModelNotFoundError (FileNotFoundError)   model folder, version or file missing (locally or on a server)
    ├── ModelLoadError (RuntimeError)            the model file exists but cannot be loaded
    ├── InferenceError (RuntimeError)            the model failed while running
    │   ├── InferenceTimeoutError (TimeoutError) no answer within the deadline
    │   └── ServerInternalError                  the server reported an internal error for a request
    ├── RepositoryError (RuntimeError)           the model repository cannot be written
    ├── PackagingError (RuntimeError)            a MAP image cannot be built: a program missing or failing
    └── ServerError (RuntimeError)               the local tritonserver failed
        ├── ServerNotFoundError (FileNotFoundError)
        ├── PortInUseError (OSError)
        └── ServerStartError                     did not become ready; carries the log tail
"""

from __future__ import annotations


class MonaiTritonError(Exception):
    """Base of every error raised by monai-triton-ops."""


class UsageError(MonaiTritonError, ValueError):
    """The caller passed a value that can never work; fix the call."""


class BackendSpecError(UsageError):
    """The backend spec string is unknown or malformed."""


class InputValidationError(UsageError):
    """A tensor does not match the model signature (name, dtype, rank, shape, batch)."""


class ConfigError(UsageError):
    """An option, ``config.pbtxt`` or model metadata is invalid or contradicts the model."""


class BundleError(ConfigError):
    """A MONAI Bundle cannot be read or run; the message names the bundle's file and its config item.

    ``file`` is the bundle file at fault (``configs/inference.json``, ``models/model.pt``, or a config
    embedded in a TorchScript file as ``model.ts:extra/inference.json``), ``item`` the config item
    (``preprocessing``, ``network_def``...) or ``""`` when the whole file is at fault.
    """

    def __init__(self, message: str, *, file: str = "", item: str = "") -> None:
        where = ", ".join(part for part in (file and f"file {file}", item and f"item {item!r}") if part)
        super().__init__(f"bundle {where}: {message}" if where else f"bundle: {message}")
        self.file = file
        self.item = item


class InputDataError(UsageError):
    """An input image, file or folder cannot be used (empty, no series, wrong rank)."""


class ConversionError(UsageError):
    """A model cannot be converted (``monai-triton convert``): it cannot be exported, or the result differs."""


class BackendStateError(MonaiTritonError, RuntimeError):
    """A backend was used before ``open()`` or after ``close()``."""


class BackendUnavailableError(MonaiTritonError, ImportError):
    """The backend is not available: not built yet, or an optional package is missing."""


class DeviceUnavailableError(MonaiTritonError, RuntimeError):
    """A requested device (``cuda``) is not available here: the environment, not the call, is wrong."""


class ServerUnavailableError(MonaiTritonError, ConnectionError):
    """A remote Triton server did not answer, or was not ready, within the deadline (after bounded retries)."""


class ModelNotFoundError(MonaiTritonError, FileNotFoundError):
    """The model folder, version folder or model file does not exist."""


class ModelLoadError(MonaiTritonError, RuntimeError):
    """The model file exists but cannot be loaded (corrupt, not TorchScript, wrong format)."""


class InferenceError(MonaiTritonError, RuntimeError):
    """The model raised or returned something unusable while running."""


class InferenceTimeoutError(InferenceError, TimeoutError):
    """An inference did not complete within its deadline."""


class ServerInternalError(InferenceError):
    """The server (or the model it runs) failed on a request: Triton ``INTERNAL``, gRPC ``INTERNAL``, HTTP 500 and
    the other codes the status table reads as internal (``client/status.py``). The server says it failed, not
    that the input is wrong, so it has an exit code of its own (``exits.SERVER_FAILED``); its log says why."""


class RepositoryError(MonaiTritonError, RuntimeError):
    """A model repository entry cannot be written (exists, unsafe name, failed check)."""


class PackagingError(MonaiTritonError, RuntimeError):
    """A MAP cannot be built: a program it needs (buildah, mmdebstrap, pip in the build) is missing or failed."""


class ServerError(MonaiTritonError, RuntimeError):
    """The local Triton server failed."""


class ServerNotFoundError(ServerError, FileNotFoundError):
    """No ``tritonserver`` binary was found."""


class PortInUseError(ServerError, OSError):
    """A requested port is already bound by another process."""


class ServerStartError(ServerError):
    """The server exited or did not become ready in time; the message carries its log tail."""

    def __init__(self, message: str, *, log_tail: str = "") -> None:
        super().__init__(f"{message}\n--- tritonserver log tail ---\n{log_tail}" if log_tail else message)
        self.log_tail = log_tail
