"""The on-disk layout every backend reads: ``<repo>/<name>/[config.pbtxt]`` and ``<repo>/<name>/<version>/<file>``.

This is Triton's model repository layout, so one folder serves the TorchScript backend, the
local server and an NGC Triton container alike.
"""

from __future__ import annotations

import re
from pathlib import Path

from ..errors import ConfigError, ModelNotFoundError

#: A model name that is safe as one folder name everywhere (no separators, no '..', no spaces).
SAFE_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,127}$")
DEFAULT_MODEL_FILENAME = "model.pt"
#: A ``torch.export`` program's file in a version folder (the runner loads it by this suffix).
PT2_SUFFIX = ".pt2"
DEFAULT_PT2_FILENAME = "model.pt2"
CONFIG_FILENAME = "config.pbtxt"


def check_model_name(name: str) -> str:
    """Return ``name`` if it is a safe folder name, else raise a ``ConfigError`` that says why."""
    if not SAFE_NAME.match(name) or ".." in name:
        raise ConfigError(
            f"model name {name!r} is not a safe folder name: use letters, digits, '_', '-', '.', "
            "start with a letter or digit, at most 128 characters"
        )
    return name


def model_dir(repository: str | Path, name: str) -> Path:
    """The model's folder in ``repository``; a clear error lists what is there when it is missing."""
    repo = Path(repository)
    if not repo.is_dir():
        raise ModelNotFoundError(f"model repository {str(repo)!r} does not exist or is not a folder")
    folder = repo / check_model_name(name)
    if not folder.is_dir():
        available = sorted(p.name for p in repo.iterdir() if p.is_dir() and not p.name.startswith("."))
        raise ModelNotFoundError(
            f"model {name!r} not found in repository {str(repo)!r} (available: {', '.join(available) or 'none'})"
        )
    return folder


def versions(folder: Path) -> list[int]:
    """Numeric version folders of a model, ascending."""
    return sorted(int(p.name) for p in folder.iterdir() if p.is_dir() and p.name.isdigit())


def resolve_version(repository: str | Path, name: str, version: int | None = None) -> tuple[int, Path]:
    """``(version, version folder)``: the given version, or the highest one when ``None``."""
    folder = model_dir(repository, name)
    found = versions(folder)
    if version is None:
        if not found:
            raise ModelNotFoundError(f"model {name!r} in {str(folder)!r} has no numeric version folder (e.g. '1/')")
        version = found[-1]
    elif version not in found:
        raise ModelNotFoundError(
            f"model {name!r} has no version {version} in {str(folder)!r} (available: {found or 'none'})"
        )
    return version, folder / str(version)


def model_file(version_dir: Path, name: str, filename: str = DEFAULT_MODEL_FILENAME) -> Path:
    """The model file inside a version folder."""
    path = version_dir / filename
    if not path.is_file():
        present = sorted(p.name for p in version_dir.iterdir())
        raise ModelNotFoundError(
            f"model {name!r} version {version_dir.name}: no {filename!r} in {str(version_dir)!r} "
            f"(found: {', '.join(present) or 'nothing'})"
        )
    return path
