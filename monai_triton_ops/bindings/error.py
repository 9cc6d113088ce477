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

The caller owns an error a function returns and must delete it; an error read from a response belongs to
the response. :func:`raise_error` handles both, and :func:`new_error` turns an exception raised in a Python
callback into the ``TRITONSERVER_Error*`` that Triton expects back.
"""

from __future__ import annotations

from typing import ClassVar, NoReturn

from ..errors import MonaiTritonError
from .enums import TRITONSERVER_Error_Code


class TritonError(MonaiTritonError, RuntimeError):
    """An error reported by Triton; the subclass follows :attr:`code`."""

    code: ClassVar[TRITONSERVER_Error_Code] = TRITONSERVER_Error_Code.UNKNOWN

    @property
    def code_string(self) -> str:
        """Triton's name for the code, e.g. ``"Not found"``."""
        return _CODE_STRINGS.get(self.code, self.code.name)


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
_CODE_STRINGS: dict[TRITONSERVER_Error_Code, str] = {}


def error_class(code: int) -> type[TritonError]:
    """The exception class of a ``TRITONSERVER_Error_Code`` (unknown codes: :class:`UnknownError`)."""
    try:
        return ERROR_CLASSES[TRITONSERVER_Error_Code(code)]
    except ValueError:
        return UnknownError


def read_error(error: int, *, owned: bool) -> TritonError:
    """The exception for ``error`` (a ``TRITONSERVER_Error*``); deletes it when the caller owns it."""
    from ._library import lib

    library = lib()
    try:
        code = int(library.TRITONSERVER_ErrorCode(error))
        message = (library.TRITONSERVER_ErrorMessage(error) or b"").decode(errors="replace")
        code_string = (library.TRITONSERVER_ErrorCodeString(error) or b"").decode(errors="replace")
    finally:
        if owned:
            library.TRITONSERVER_ErrorDelete(error)
    cls = error_class(code)
    _CODE_STRINGS.setdefault(cls.code, code_string)
    return cls(message)


def raise_error(error: int, *, owned: bool, cause: BaseException | None = None) -> NoReturn:
    """Raise the exception for ``error``, chained to ``cause`` (an exception a callback raised) if given."""
    raise read_error(error, owned=owned) from cause


def new_error(exc: BaseException) -> int:
    """A new ``TRITONSERVER_Error*`` describing ``exc``, for a callback to return to Triton (which deletes it)."""
    from ._library import lib

    code = exc.code if isinstance(exc, TritonError) else TRITONSERVER_Error_Code.UNKNOWN
    message = f"{type(exc).__name__}: {exc}".encode(errors="replace")
    return int(lib().TRITONSERVER_ErrorNew(int(code), message))
