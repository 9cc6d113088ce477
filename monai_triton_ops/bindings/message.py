"""``TRITONSERVER_Message``: JSON documents (server and model metadata, statistics, config, index)."""

from __future__ import annotations

import ctypes
import json
from typing import Any

from ._library import lib
from ._object import TritonObject


class TRITONSERVER_Message(TritonObject):
    """A JSON message. The server's getters return one; :meth:`from_serialized_json` makes one."""

    _c_delete = "TRITONSERVER_MessageDelete"

    @classmethod
    def from_serialized_json(cls, text: str | bytes) -> TRITONSERVER_Message:
        """``TRITONSERVER_MessageNewFromSerializedJson`` (Triton copies the text)."""
        data = text.encode() if isinstance(text, str) else text
        pointer = ctypes.c_void_p()
        lib().TRITONSERVER_MessageNewFromSerializedJson(ctypes.byref(pointer), data, len(data))
        return cls(pointer.value or 0)

    def serialize_to_json(self) -> str:
        """``TRITONSERVER_MessageSerializeToJson``: the text, copied out while the message lives."""
        base, size = ctypes.c_void_p(), ctypes.c_size_t()
        lib().TRITONSERVER_MessageSerializeToJson(self._ptr(), ctypes.byref(base), ctypes.byref(size))
        return ctypes.string_at(base.value or 0, size.value).decode() if size.value else ""

    def json(self) -> Any:
        """The message parsed (``json.loads(serialize_to_json())``)."""
        return json.loads(self.serialize_to_json())
