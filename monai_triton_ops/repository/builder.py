"""Lay out one model in a Triton model repository, all or nothing.

``<repo>/<name>/config.pbtxt`` and ``<repo>/<name>/<version>/model.pt`` (+ the runner ``model.py``
for the python flavour) are written into a hidden temporary folder next to the target, checked by
parsing ``config.pbtxt`` back, and only then renamed into place. A failure at any step removes the
temporary folder and leaves the repository as it was; ``force`` swaps an existing entry out the
same way, so readers never see half of an entry.
"""

from __future__ import annotations

import logging
import os
import shutil
import tempfile
from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING

from ..errors import ConfigError, RepositoryError
from ..signature import ModelSignature
from . import layout
from .config import (
    ConfigOptions,
    DynamicBatching,
    InstanceGroup,
    VersionPolicy,
    check_libtorch_names,
    options_from_config,
    parse_config,
    render_config,
    signature_from_config,
)
from .describe import ExampleKeywords, ModelDescription, ModelSource, describe

if TYPE_CHECKING:
    from typing_extensions import Unpack

logger = logging.getLogger(__name__)

RUNNER = Path(__file__).parent / "runner" / "model.py"
RUNNER_FILENAME = "model.py"


class EntryKeywords(ExampleKeywords, total=False):
    """What describes a model and shapes its ``config.pbtxt``, as keywords (one declaration for both functions)."""

    flavor: str
    dynamic_batching: DynamicBatching | None
    instance_groups: Sequence[InstanceGroup]
    version_policy: VersionPolicy | None


def entry_parameters(model_path: str | Path, name: str, keywords: EntryKeywords) -> tuple[ModelSource, ConfigOptions]:
    """The keywords of ``generate_config`` / ``build_repository`` as the two parameter objects they stand for."""
    layout.check_model_name(name)
    source = ModelSource(
        path=Path(model_path),
        name=name,
        input_shapes=keywords.get("input_shapes"),
        input_dtypes=keywords.get("input_dtypes"),
        bundle_metadata=keywords.get("bundle_metadata"),
        max_batch_size=keywords.get("max_batch_size", 0),
    )
    options = ConfigOptions(
        flavor=keywords.get("flavor", "python"),
        dynamic_batching=keywords.get("dynamic_batching"),
        instance_groups=tuple(keywords.get("instance_groups", ())),
        version_policy=keywords.get("version_policy"),
    )
    return source, options


def generate_config(
    model_path: str | Path, name: str, **keywords: Unpack[EntryKeywords]
) -> tuple[ModelSignature, ConfigOptions, str]:
    """Describe ``model_path`` and render the ``config.pbtxt`` that serves it as model ``name``.

    Keywords: ``flavor`` (python or libtorch), ``input_shapes``/``input_dtypes`` (probing),
    ``max_batch_size``, ``bundle_metadata``, ``dynamic_batching``, ``instance_groups``,
    ``version_policy``. Returns the signature, the options and the checked text.
    """
    source, options = entry_parameters(model_path, name, keywords)
    signature, text = render_entry(source, options)
    return signature, options, text


def render_entry(source: ModelSource, options: ConfigOptions) -> tuple[ModelSignature, str]:
    """The signature of ``source`` and its checked ``config.pbtxt`` text (it parses back to both)."""
    description = describe(source)
    _check_servable(description, options)
    text = render_config(description.signature, options)
    check_config_text(text, description.signature, options)
    return description.signature, text


def build_repository(
    model_path: str | Path,
    repository: str | Path,
    name: str,
    *,
    version: int = 1,
    force: bool = False,
    **keywords: Unpack[EntryKeywords],
) -> Path:
    """Write model ``name`` into ``repository`` from the TorchScript file ``model_path``; returns its folder.

    Keywords as for ``generate_config``. An existing ``<repository>/<name>`` is replaced (all its
    versions) only with ``force=True``.
    """
    source, options = entry_parameters(model_path, name, keywords)
    if isinstance(version, bool) or not isinstance(version, int) or version < 1:
        raise ConfigError(f"model {name!r}: version must be an integer >= 1, got {version!r}")
    repo = _repository_folder(repository)
    target = repo / name
    _check_free(target, name, force)
    signature, text = render_entry(source, options)
    try:
        staging = Path(tempfile.mkdtemp(prefix=f".{name}.staging-", dir=repo))
    except OSError as exc:
        raise RepositoryError(f"cannot write into model repository {str(repo)!r}: {exc}") from exc
    try:
        _write_entry(staging, Path(model_path), text, version, options)
        check_config_text((staging / layout.CONFIG_FILENAME).read_text(encoding="utf-8"), signature, options)
        _swap_in(staging, target, name, force)
    except OSError as exc:
        raise RepositoryError(f"cannot write model {name!r} into {str(repo)!r}: {exc}") from exc
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    logger.info("wrote model %r version %d (%s flavour) to %s", name, version, options.flavor, target)
    return target


def check_config_text(text: str, signature: ModelSignature, options: ConfigOptions) -> None:
    """Raise ``RepositoryError`` unless ``text`` parses back to exactly ``signature`` and ``options``."""
    config = parse_config(text, source=f"generated config of {signature.name!r}", name=signature.name)
    parsed = (signature_from_config(config), options_from_config(config))
    expected = (replace(signature, version=None), options)
    if parsed != expected:
        raise RepositoryError(
            f"model {signature.name!r}: the generated config.pbtxt does not parse back to what was generated "
            f"(expected {expected}, got {parsed})"
        )


def _check_servable(description: ModelDescription, options: ConfigOptions) -> None:
    signature = description.signature
    if description.model_format != "torchscript":
        raise ConfigError(
            f"model {signature.name!r}: a repository entry needs TorchScript, got a {description.model_format} file; "
            "export the network with torch.jit.script/trace (monai.data.save_net_with_metadata keeps its metadata)"
        )
    if options.flavor == "libtorch":
        check_libtorch_names(signature, description.argument_names)


def _repository_folder(repository: str | Path) -> Path:
    repo = Path(repository)
    if repo.exists() and not repo.is_dir():
        raise RepositoryError(f"model repository {str(repo)!r} exists and is not a folder")
    try:
        repo.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise RepositoryError(f"cannot create model repository {str(repo)!r}: {exc}") from exc
    return repo


def _check_free(target: Path, name: str, force: bool) -> None:
    if (target.exists() or target.is_symlink()) and not force:
        raise RepositoryError(
            f"model {name!r} already exists in repository {str(target.parent)!r}; pass --force (force=True) "
            "to replace it"
        )
    if target.is_symlink() or (target.exists() and not target.is_dir()):
        raise RepositoryError(f"{str(target)!r} is not a model folder; remove it by hand")


def _write_entry(folder: Path, model_path: Path, text: str, version: int, options: ConfigOptions) -> None:
    version_dir = folder / str(version)
    version_dir.mkdir()
    (folder / layout.CONFIG_FILENAME).write_text(text, encoding="utf-8")
    shutil.copyfile(model_path, version_dir / options.model_filename)
    if options.flavor == "python":
        shutil.copyfile(RUNNER, version_dir / RUNNER_FILENAME)


def _swap_in(staging: Path, target: Path, name: str, force: bool) -> None:
    """Rename ``staging`` to ``target``; an existing target is moved aside first and restored on failure."""
    _check_free(target, name, force)
    if not target.exists():
        _rename(staging, target, name)
        return
    retired = Path(tempfile.mkdtemp(prefix=f".{name}.retired-", dir=target.parent))
    os.replace(target, retired / name)
    try:
        _rename(staging, target, name)
    except RepositoryError:
        os.replace(retired / name, target)  # put the old entry back before reporting
        retired.rmdir()
        raise
    shutil.rmtree(retired, ignore_errors=True)


def _rename(source: Path, target: Path, name: str) -> None:
    try:
        os.rename(source, target)
    except OSError as exc:
        raise RepositoryError(f"cannot move model {name!r} into place at {str(target)!r}: {exc}") from exc
