"""Triton's log: whether a level is on, and writing a message through it."""

from __future__ import annotations

from ._library import lib
from .enums import TRITONSERVER_LogLevel


def TRITONSERVER_LogIsEnabled(level: TRITONSERVER_LogLevel) -> bool:
    return bool(lib().TRITONSERVER_LogIsEnabled(int(level)))


def TRITONSERVER_LogMessage(level: TRITONSERVER_LogLevel, filename: str, line: int, msg: str) -> None:
    lib().TRITONSERVER_LogMessage(int(level), filename.encode(), int(line), msg.encode())
