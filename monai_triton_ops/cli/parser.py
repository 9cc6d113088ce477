"""What every ``monai-triton`` command's parser shares: usage errors as one line, and the ``-l`` flag."""

from __future__ import annotations

import argparse
from typing import Any

from .. import console
from ..errors import UsageError


class Parser(argparse.ArgumentParser):
    """Usage errors as one ``UsageError`` line (exit 2) instead of argparse's usage text."""

    def error(self, message: str) -> Any:
        raise UsageError(f"{self.prog}: {message} (see '{self.prog} --help')")


def add_log_level(p: argparse.ArgumentParser, default: str = console.DEFAULT_LEVEL) -> None:
    p.add_argument(
        "-l", "--log-level", type=str.upper, choices=console.LEVELS, metavar="LEVEL",
        help=f"DEBUG (everything: Holoscan's log, tracebacks), INFO, WARN, ERROR or CRITICAL (default: {default})",
    )  # fmt: skip
    p.set_defaults(default_level=default)
