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
import secrets
import shutil
import tempfile
from collections.abc import Callable, Mapping
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING

from ..errors import ConfigError, RepositoryError
from ..signature import ModelSignature
from . import layout
from .config import ConfigOptions, options_from_config, parse_config, render_config, signature_from_config
from .describe import ModelDescription, describe
from .entry import EntryKeywords, EntryPlan, plan_entry
from .naming import libtorch_naming, rename
from .onnx_model import is_onnx_file
from .onnx_rewrite import rewrite_file

if TYPE_CHECKING:
    from typing_extensions import Unpack

logger = logging.getLogger(__name__)

RUNNER = Path(__file__).parent / "runner" / "model.py"
RUNNER_FILENAME = "model.py"
#: Beside an ONNX entry's runner config: the same model for Triton's own ONNX Runtime backend, which a server
#: with that backend selects with ``tritonserver --model-config-name=onnxruntime``.
ONNXRUNTIME_CONFIG = Path("configs") / "onnxruntime.pbtxt"
_STAGING_ATTEMPTS = 5


def generate_config(
    model_path: str | Path, name: str | None = None, **keywords: Unpack[EntryKeywords]
) -> tuple[ModelSignature, ConfigOptions, str]:
    """Describe ``model_path`` and render the ``config.pbtxt`` that serves it as model ``name``.

    Keywords (``EntryKeywords``): ``flavor`` (python or libtorch), ``input_shapes``/``input_dtypes``
    (probing), ``max_batch_size``, ``bundle_metadata``, ``dynamic_batching``, ``instance_groups``,
    ``instance_kind``, ``instance_count``, ``version_policy``, ``parameters``, ``model_filename``,
    ``input_names``, ``output_names`` and ``like`` (an existing ``config.pbtxt`` to take the rest
    from; ``name`` then defaults to its model name). Returns the signature, the options and the
    checked text.
    """
    plan = plan_entry(model_path, name, keywords)
    signature, text = render_entry(plan)
    return signature, plan.options, text


def render_entry(plan: EntryPlan) -> tuple[ModelSignature, str]:
    """The signature of the planned entry and its checked ``config.pbtxt`` text (it parses back to both)."""
    description = describe(plan.source)
    _check_servable(description, plan.options)
    signature = description.signature
    if plan.template is not None:
        signature = plan.template.apply(signature)
    if description.model_format == "onnx" and (plan.input_names or plan.output_names):
        raise ConfigError(
            f"model {signature.name!r}: an ONNX model's tensors keep the names of its graph "
            f"(inputs {list(signature.input_names)}, outputs {list(signature.output_names)}); rename them at export"
        )
    signature = rename(signature, plan.input_names, plan.output_names)
    if plan.options.flavor == "libtorch":
        for warning in libtorch_naming(signature, description.argument_names):
            logger.warning("%s", warning)
    text = render_config(signature, plan.options)
    check_config_text(text, signature, plan.options)
    return signature, text


def build_repository(
    model_path: str | Path,
    repository: str | Path,
    name: str | None = None,
    *,
    version: int = 1,
    force: bool = False,
    extra_files: Mapping[str, bytes] | None = None,
    **keywords: Unpack[EntryKeywords],
) -> Path:
    """Write model ``name`` into ``repository`` from the TorchScript file ``model_path``; returns its folder.

    Keywords as for ``generate_config``. ``extra_files`` (path relative to the model folder -> content) are
    written beside the version folders in the same all-or-nothing step (a bundle's ``configs/``). An existing
    ``<repository>/<name>`` is replaced (all its versions) only with ``force=True``. Folders and files are
    created with the process umask (as ``mkdir`` and ``cp`` would), so a server running as another user can
    read them.
    """
    plan = plan_entry(model_path, name, keywords)
    name, options = plan.source.name, plan.options
    if isinstance(version, bool) or not isinstance(version, int) or version < 1:
        raise ConfigError(f"model {name!r}: version must be an integer >= 1, got {version!r}")
    repo = Path(repository)
    if repo.exists() and not repo.is_dir():
        raise RepositoryError(f"model repository {str(repo)!r} exists and is not a folder")
    _check_free(repo / name, name, force)
    signature, text = render_entry(plan)

    def write(staging: Path) -> None:
        _write_entry(staging, Path(model_path), text, version, options, signature)
        for relative, content in (extra_files or {}).items():
            extra = staging / relative
            extra.parent.mkdir(parents=True, exist_ok=True)
            extra.write_bytes(content)
        check_config_text((staging / layout.CONFIG_FILENAME).read_text(encoding="utf-8"), signature, options)

    target = install_entry(repo, name, write, force=force)
    logger.info("wrote model %r version %d (%s flavour) to %s", name, version, options.flavor, target)
    return target


def install_entry(repository: str | Path, name: str, write: Callable[[Path], None], *, force: bool) -> Path:
    """Put model folder ``name`` into ``repository``, all or nothing; returns the folder.

    ``write(staging)`` fills a hidden staging folder next to the target (and checks what it wrote); only
    then is it renamed into place. An existing folder is replaced only with ``force``; a failure leaves the
    repository as it was, without even the folders this call would have created.
    """
    repo = Path(repository)
    if repo.exists() and not repo.is_dir():
        raise RepositoryError(f"model repository {str(repo)!r} exists and is not a folder")
    target = repo / name
    _check_free(target, name, force)
    created = _repository_folder(repo)
    try:
        _stage_and_swap(repo, target, write, force)
    except BaseException:
        for folder in created:  # the folders this call made, deepest first
            shutil.rmtree(folder, ignore_errors=True)
        raise
    return target


def _stage_and_swap(repo: Path, target: Path, write: Callable[[Path], None], force: bool) -> None:
    """Write the entry into a hidden staging folder, check it, then rename it into place."""
    name = target.name
    staging = _staging_folder(repo, name)
    try:
        write(staging)
        _swap_in(staging, target, name, force)
    except OSError as exc:
        raise RepositoryError(f"cannot write model {name!r} into {str(repo)!r}: {exc}") from exc
    finally:
        shutil.rmtree(staging, ignore_errors=True)


def _staging_folder(repo: Path, name: str) -> Path:
    """A fresh hidden folder in ``repo``, made with ``mkdir``'s mode (umask applies; ``mkdtemp`` would give 0700)."""
    for _ in range(_STAGING_ATTEMPTS):
        staging = repo / f".{name}.staging-{secrets.token_hex(4)}"
        try:
            staging.mkdir()
        except FileExistsError:
            continue
        except OSError as exc:
            raise RepositoryError(f"cannot write into model repository {str(repo)!r}: {exc}") from exc
        return staging
    raise RepositoryError(f"cannot create a staging folder in {str(repo)!r}: every name tried exists")


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
    model = description.signature.name
    if description.model_format == "onnx":
        if options.flavor == "libtorch":
            raise ConfigError(
                f"model {model!r} is ONNX, which the libtorch backend cannot serve; build it with --flavor python "
                "(the runner serves it through ONNX Runtime; an onnxruntime config is written beside it)"
            )
        return
    if options.flavor == "onnxruntime":
        raise ConfigError(f"model {model!r}: the onnxruntime flavour serves ONNX files, got {description.model_format}")
    if description.model_format == "pt2" and options.flavor != "python":
        raise ConfigError(
            f"model {model!r} is a torch.export program (.pt2), which Triton's pytorch_libtorch backend cannot load "
            "(it reads TorchScript only); build it with --flavor python (the runner loads it with torch.export.load), "
            "or convert it with 'monai-triton convert MODEL --to onnx' for Triton's onnxruntime backend"
        )
    if description.model_format not in ("torchscript", "pt2"):
        raise ConfigError(
            f"model {model!r}: a repository entry needs TorchScript, .pt2 or ONNX, got a {description.model_format} "
            "file; export the network with torch.jit.script/trace (monai.data.save_net_with_metadata keeps its "
            "metadata)"
        )
    if options.flavor == "libtorch" and description.returns_dict:
        raise ConfigError(
            f"model {model!r} returns a dict of outputs {list(description.signature.output_names)}, which the "
            "libtorch backend cannot serve; build it with --flavor python, or return a tuple"
        )


def _repository_folder(repo: Path) -> list[Path]:
    """Create ``repo`` (and missing parents); returns the folders created, deepest first."""
    missing = [p for p in (repo, *repo.parents) if not p.exists()]
    try:
        repo.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        for folder in missing:
            shutil.rmtree(folder, ignore_errors=True)
        raise RepositoryError(f"cannot create model repository {str(repo)!r}: {exc}") from exc
    return missing


def _check_free(target: Path, name: str, force: bool) -> None:
    if (target.exists() or target.is_symlink()) and not force:
        raise RepositoryError(
            f"model {name!r} already exists in repository {str(target.parent)!r}; pass --force (force=True) "
            "to replace it"
        )
    if target.is_symlink() or (target.exists() and not target.is_dir()):
        raise RepositoryError(f"{str(target)!r} is not a model folder; remove it by hand")


def _write_entry(
    folder: Path, model_path: Path, text: str, version: int, options: ConfigOptions, signature: ModelSignature
) -> None:
    version_dir = folder / str(version)
    version_dir.mkdir()
    (folder / layout.CONFIG_FILENAME).write_text(text, encoding="utf-8")
    if is_onnx_file(options.model_filename):  # the entry's copy gets the exact rewrites (onnx_rewrite.py)
        rewrite_file(model_path, version_dir / options.model_filename)
    else:
        shutil.copyfile(model_path, version_dir / options.model_filename)
    if options.flavor == "python":
        shutil.copyfile(RUNNER, version_dir / RUNNER_FILENAME)
    if options.flavor == "python" and is_onnx_file(options.model_filename):
        onnxruntime = replace(options, flavor="onnxruntime")
        other = render_config(replace(signature, version=None), onnxruntime)
        check_config_text(other, signature, onnxruntime)
        (folder / ONNXRUNTIME_CONFIG).parent.mkdir(exist_ok=True)
        (folder / ONNXRUNTIME_CONFIG).write_text(other, encoding="utf-8")


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
