"""``TRITONSERVER_Metrics``: the server's metrics, formatted as Prometheus text."""

from __future__ import annotations

import ctypes

from ._library import lib
from ._object import TritonObject
from .enums import TRITONSERVER_MetricFormat


class TRITONSERVER_Metrics(TritonObject):
    """A snapshot of the metrics; ``TRITONSERVER_Server.metrics()`` returns one."""

    _c_delete = "TRITONSERVER_MetricsDelete"

    def formatted(self, format: TRITONSERVER_MetricFormat = TRITONSERVER_MetricFormat.PROMETHEUS) -> str:
        """``TRITONSERVER_MetricsFormatted``: the text, copied out while the metrics object lives."""
        base, size = ctypes.c_void_p(), ctypes.c_size_t()
        lib().TRITONSERVER_MetricsFormatted(self._ptr(), int(format), ctypes.byref(base), ctypes.byref(size))
        return ctypes.string_at(base.value or 0, size.value).decode() if size.value else ""
