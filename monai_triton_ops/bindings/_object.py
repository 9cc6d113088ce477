"""The wrapper every Triton struct shares: who owns the C object now, and the handles C gets for Python objects.

Ownership states follow the C API::

    OWNED     Python owns the object: usable; deleted by delete() or when the last reference goes
    LENT      handed to Triton (e.g. a request after TRITONSERVER_ServerInferAsync): any use raises, deleting
              frees nothing; Triton gives it back through a release callback (-> OWNED)
    BORROWED  a view Triton passed to a callback, valid only during it; never deleted by Python
    DELETED   gone: any use raises; nothing is deleted twice

The state lives on the one wrapper object, so every Python reference to it sees a transfer. A lent
wrapper is also held by the handle registry, so ``del`` of every user reference frees nothing while C may
still use it; the registry lets go at the release callback, and the last reference then deletes.

Handles: C sees Python objects only as ``void*`` user data. :func:`new_handle` gives such an object an
integer (never an address), :func:`handle_object` finds it again from a callback, :func:`drop_handle` ends it.
"""

from __future__ import annotations

import enum
import itertools
import logging
from typing import Any, ClassVar

from ._library import lib
from .error import OwnershipError

logger = logging.getLogger(__name__)

_handles: dict[int, Any] = {}
_next_handle = itertools.count(1).__next__  # atomic under the GIL; 0 stays NULL


def new_handle(obj: Any) -> int:
    """A non-zero integer C may carry as ``void*`` user data; ``obj`` stays alive until :func:`drop_handle`."""
    handle = _next_handle()
    _handles[handle] = obj
    return handle


def reserve_handle() -> int:
    """A handle number with no object yet (:func:`set_handle` gives it one while C may use it)."""
    return _next_handle()


def set_handle(handle: int, obj: Any) -> None:
    """Make ``handle`` stand for ``obj`` (alive until :func:`drop_handle`)."""
    _handles[handle] = obj


def handle_object(handle: int | None) -> Any:
    """The object of a live handle (``None`` for NULL or an ended handle)."""
    return _handles.get(handle) if handle else None


def drop_handle(handle: int | None) -> Any:
    """End a handle; returns its object (``None`` if it was not live)."""
    return _handles.pop(handle, None) if handle else None


def live_handles() -> int:
    """How many handles are live: in-flight requests, lent traces, output buffers Triton still holds."""
    return len(_handles)


class State(enum.Enum):
    OWNED = "owned by Python"
    LENT = "owned by Triton"
    BORROWED = "borrowed from a callback"
    DELETED = "deleted"


class TritonObject:
    """Base of the struct wrappers: holds the pointer, enforces the ownership state."""

    _c_delete: ClassVar[str | None] = None
    """Name of the C function that deletes the struct (``None``: Python never deletes it)."""
    _lent_by = "Triton"
    """What took the object, for the error message (instances set their own)."""

    def __init__(self, pointer: int, *, state: State = State.OWNED) -> None:
        if not pointer:
            raise OwnershipError(f"{type(self).__name__}: Triton returned a NULL object")
        self._pointer = pointer
        self._state = state
        self._deleted_because = ""

    # -- state -------------------------------------------------------------------------------------
    @property
    def owner_state(self) -> State:
        """Who owns the C object now (see the module docstring)."""
        return self._state

    @property
    def pointer(self) -> int:
        """The C pointer, for callers that pass it to C themselves; raises unless usable now."""
        return self._ptr()

    def _ptr(self) -> int:
        state = self._state
        if state is State.OWNED or state is State.BORROWED:
            return self._pointer
        raise OwnershipError(self._unusable_message())

    def _unusable_message(self) -> str:
        name = type(self).__name__
        if self._state is State.LENT:
            return (
                f"{name} belongs to Triton since {self._lent_by} and until its release callback; it cannot be used now"
            )
        reason = f" ({self._deleted_because})" if self._deleted_because else ""
        return f"{name} was deleted{reason}; it cannot be used any more"

    # -- deletion ----------------------------------------------------------------------------------
    def delete(self) -> None:
        """Delete the C object now.

        Raises:
            OwnershipError: Triton owns it, it is a borrowed view, or it was deleted already.
        """
        if self._state is State.BORROWED:
            raise OwnershipError(f"{type(self).__name__} was borrowed from a callback; Triton deletes it")
        self._ptr()
        self._delete_now("delete() was called")

    def _delete_now(self, because: str) -> None:
        """Delete the C object (must be OWNED); the state changes first so nothing deletes it twice."""
        pointer = self._pointer
        self._state = State.DELETED
        self._deleted_because = because
        self._pointer = 0
        self._before_delete()
        if self._c_delete is not None:
            getattr(lib(), self._c_delete)(pointer)

    def _expire(self) -> None:
        """End a borrowed view when its callback returns (Triton keeps the object)."""
        self._state = State.DELETED
        self._deleted_because = "a view borrowed by a callback expires when the callback returns"
        self._pointer = 0

    def _before_delete(self) -> None:
        """Hook: release what the object holds for C, before the C delete."""

    def __del__(self) -> None:
        # The last reference went while Python owned the object: delete it. A lent object is never here
        # (the handle registry holds it); a borrowed one is Triton's.
        if getattr(self, "_state", None) is State.OWNED:
            try:
                self._delete_now("its last reference was dropped")
            except Exception:
                logger.exception("deleting %s failed", type(self).__name__)

    def __repr__(self) -> str:
        return f"<{type(self).__name__} {self._state.name.lower()} at {self._pointer:#x}>"
