"""``TRITONSERVER_Error`` as Python exceptions, chosen by error code (never by message).

::

    MonaiTritonError (monai_triton_ops.errors)
    ├── TritonError (RuntimeError)               a TRITONSERVER_Error; .code, .code_string
    │   ├── UnknownError                         TRITONSERVER_ERROR_UNKNOWN
    │   ├── InternalError                        TRITONSERVER_ERROR_INTERNAL
    │   ├── NotFoundError (LookupError)          TRITONSERVER_ERROR_NOT_FOUND
    │   ├── InvalidArgumentError (ValueError)    TRITONSERVER_ERROR_INVALID_ARG
    │   ├── UnavailableError                     TRITONSERVER_ERROR_UNAVAILABLE
    │   ├── UnsupportedError                     TRITONSERVER_ERROR_UNSUPPORTED
    │   ├── AlreadyExistsError                   TRITONSERVER_ERROR_ALREADY_EXISTS
    │   └── CancelledError                       TRITONSERVER_ERROR_CANCELLED
    ├── OwnershipError (RuntimeError)            a wrapper used while Triton owns it, or after its delete
    └── TritonLibraryError (ImportError)         libtritonserver cannot be loaded or has another API version

Classes only: turning a ``TRITONSERVER_Error*`` into one of them (and back, for a callback) is a C call, made
by the library loader (``_library.read_error``, ``raise_error``, ``new_error``), which imports this module.
"""

from __future__ import annotations

from typing import ClassVar

from ..errors import MonaiTritonError
from .enums import TRITONSERVER_Error_Code


class TritonError(MonaiTritonError, RuntimeError):
    """An error reported by Triton; the subclass follows :attr:`code`."""

    code: ClassVar[TRITONSERVER_Error_Code] = TRITONSERVER_Error_Code.UNKNOWN

    @property
    def code_string(self) -> str:
        """Triton's name for the code, e.g. ``"Not found"``."""
        return CODE_STRINGS.get(self.code, self.code.name)


class UnknownError(TritonError):
    code = TRITONSERVER_Error_Code.UNKNOWN


class InternalError(TritonError):
    code = TRITONSERVER_Error_Code.INTERNAL


class NotFoundError(TritonError, LookupError):
    code = TRITONSERVER_Error_Code.NOT_FOUND


class InvalidArgumentError(TritonError, ValueError):
    code = TRITONSERVER_Error_Code.INVALID_ARG


class UnavailableError(TritonError):
    code = TRITONSERVER_Error_Code.UNAVAILABLE


class UnsupportedError(TritonError):
    code = TRITONSERVER_Error_Code.UNSUPPORTED


class AlreadyExistsError(TritonError):
    code = TRITONSERVER_Error_Code.ALREADY_EXISTS


class CancelledError(TritonError):
    code = TRITONSERVER_Error_Code.CANCELLED


class OwnershipError(MonaiTritonError, RuntimeError):
    """A wrapper was used while Triton owns its object (handed over), or after the object was deleted."""


class TritonLibraryError(MonaiTritonError, ImportError):
    """``libtritonserver`` cannot be loaded, or implements an API version these declarations do not."""


ERROR_CLASSES: dict[TRITONSERVER_Error_Code, type[TritonError]] = {
    cls.code: cls
    for cls in (
        UnknownError,
        InternalError,
        NotFoundError,
        InvalidArgumentError,
        UnavailableError,
        UnsupportedError,
        AlreadyExistsError,
        CancelledError,
    )
}
#: Triton's name of each code met so far (``TRITONSERVER_ErrorCodeString``), recorded by ``_library.read_error``.
CODE_STRINGS: dict[TRITONSERVER_Error_Code, str] = {}


def error_class(code: int) -> type[TritonError]:
    """The exception class of a ``TRITONSERVER_Error_Code`` (unknown codes: :class:`UnknownError`)."""
    try:
        return ERROR_CLASSES[TRITONSERVER_Error_Code(code)]
    except ValueError:
        return UnknownError
