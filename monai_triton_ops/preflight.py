"""Checks that can run before the graph does, so that a run that cannot succeed fails in a second.

``app_args.init_app_context`` checks the backend, the input, the model path and the output folder
while it parses the command line; ``InferenceOperator`` checks its model entry (version folder,
``config.pbtxt``, model file) when the app composes its graph; the NIfTI operators check their
file and folder. Each failure is one of ``errors.py``'s types with the path named, and nothing is
written.
"""

from __future__ import annotations

import importlib
import os
import tempfile
from collections.abc import Sequence
from pathlib import Path

from .errors import BackendUnavailableError, ConfigError, InputDataError, ModelNotFoundError


def check_backend(spec: str) -> None:
    """The spec parses and its scheme's backend module imports (not built here, or a package missing: unavailable).

    Asks the registry, so a scheme that a later release (or a plugin) fills passes here unchanged.
    """
    from .backends.registry import available_backends, parse_backend_spec

    parsed = parse_backend_spec(spec)  # BackendSpecError for typos and malformed URLs
    entry = available_backends()[parsed.scheme]
    hint = f" ({entry.hint})" if entry.hint else ""
    try:
        importlib.import_module(entry.target.partition(":")[0])
    except ImportError as exc:
        raise BackendUnavailableError(f"backend {spec!r} cannot be imported ({exc}){hint}") from exc


def is_remote(spec: str) -> bool:
    """Whether the backend reaches the model over the network (its spec carries URLs), not in a local folder."""
    from .backends.registry import parse_backend_spec

    return bool(parse_backend_spec(spec).urls)


def check_input(path: str | os.PathLike[str]) -> Path:
    """The input file or folder exists and can be read."""
    source = Path(path)
    if not source.exists():
        raise InputDataError(f"input {str(source)!r} does not exist")
    try:
        if source.is_dir():
            with os.scandir(source) as entries:
                next(entries, None)
        else:
            with open(source, "rb") as handle:
                handle.read(1)
    except OSError as exc:
        raise InputDataError(f"input {str(source)!r} cannot be read: {exc.strerror or exc}") from exc
    return source


def check_model_path(path: str | os.PathLike[str]) -> Path:
    """The ``-m`` path exists (a model repository folder, or a model file for the App SDK's own loaders)."""
    models = Path(path)
    if not models.exists():
        raise ModelNotFoundError(f"model repository {str(models)!r} does not exist (check -m)")
    return models


def check_model_configs(path: str | os.PathLike[str]) -> None:
    """Every ``<repo>/<name>/config.pbtxt`` parses, names its folder's model, and declares tensors.

    The App SDK parses them all when it creates the app context, and a malformed one would end
    there in a ``ValueError`` with no reason; here it is a ``ConfigError`` naming the file and the line.
    """
    repo = Path(path)
    if not repo.is_dir():
        return
    from .repository.config import read_config, signature_from_config

    for folder in sorted(p for p in repo.iterdir() if p.is_dir() and not p.name.startswith(".")):
        config = folder / "config.pbtxt"
        if config.is_file():
            signature_from_config(read_config(config, name=folder.name))


def check_output_folder(path: str | os.PathLike[str]) -> Path:
    """The output folder exists (created if missing) and a file can be written into it."""
    folder = Path(path)
    if folder.exists() and not folder.is_dir():
        raise InputDataError(f"output {str(folder)!r} exists and is not a folder")
    try:
        folder.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise InputDataError(f"output folder {str(folder)!r} cannot be created: {exc.strerror or exc}") from exc
    try:
        handle, probe = tempfile.mkstemp(dir=folder, prefix=".write-check-")
        os.close(handle)
        os.unlink(probe)
    except OSError as exc:
        raise InputDataError(f"output folder {str(folder)!r} is not writable: {exc.strerror or exc}") from exc
    return folder


def check_holoscan_options(argv: Sequence[str]) -> None:
    """Holoscan's own ``--config FILE`` exists (Holoscan reports a missing one as a bare ``RuntimeError``)."""
    args = list(argv)
    for i, arg in enumerate(args):
        value = args[i + 1] if arg == "--config" and i + 1 < len(args) else None
        if arg.startswith("--config="):
            value = arg.split("=", 1)[1]
        if value is not None and not Path(value).is_file():
            raise InputDataError(f"Holoscan configuration file {value!r} (--config) does not exist")


def check_model_entry(spec: str, repository: str | os.PathLike[str] | None, name: str, version: int | None) -> None:
    """For a backend that reads a local repository: the model folder, version, ``config.pbtxt`` and model file."""
    check_backend(spec)
    if is_remote(spec):
        return
    from .repository import layout
    from .repository.signatures import local_entry

    if repository is None:
        raise ConfigError(f"model {name!r}: no model repository given; pass -m MODELS (the folder that holds {name}/)")
    repository = Path(repository)
    try:
        _, version_dir = layout.resolve_version(repository, name, version)
    except ModelNotFoundError as exc:
        if repository.is_dir() and not (repository / name).is_dir():
            raise ModelNotFoundError(f"{exc}; model_name must be the model's folder name in the repository") from exc
        raise
    entry = local_entry(repository, name)  # ConfigError for a config.pbtxt that does not parse
    layout.model_file(version_dir, name, entry.model_filename)
