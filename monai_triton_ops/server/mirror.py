"""A mirror of the model repository made of symlinks, so that serving never writes into the user's folder.

The Python backend's stub runs an isolated interpreter (it ignores ``PYTHONDONTWRITEBYTECODE`` and
every other ``PYTHON*`` variable) and imports each model's ``model.py``, which writes ``__pycache__``
next to it. The server is therefore pointed at a mirror in its own temporary folder: real folders,
every file a symlink to the user's. The server reads the user's files and writes its bytecode into
the mirror, which goes when the server stops. Files edited in place are seen through the links;
models added to the repository after the start are not (restart the server).
"""

from __future__ import annotations

import os
from pathlib import Path

_SKIPPED = {"__pycache__"}


def mirror_repository(source: Path, dest: Path) -> Path:
    """Fill ``dest`` (absent or empty) with ``source``'s folders and links to its files; returns ``dest``."""
    root = source.resolve()
    for dirpath, dirnames, filenames in os.walk(root, followlinks=True):
        dirnames[:] = sorted(d for d in dirnames if d not in _SKIPPED)
        folder = dest / Path(dirpath).relative_to(root)
        folder.mkdir(parents=True, exist_ok=True)
        for name in filenames:
            (folder / name).symlink_to(Path(dirpath) / name)
    return dest
