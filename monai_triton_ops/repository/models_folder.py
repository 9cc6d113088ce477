"""A models folder (the App SDK's ``-m MODELS``, one model per folder) as one Triton model repository.

``repo build MODELS -o REPO`` writes every model of the folder under its folder's name, all or nothing: each
is built into a staging folder beside ``REPO`` first, and only when all are built do they move in. What a
child folder may be (``docs/ensembles.md``): a Triton model folder (``config.pbtxt``: copied as it is), a
MONAI bundle folder, or a folder holding one ``model.ts`` / ``model.pt`` (a bundle archive, or plain
TorchScript). ``repo describe MODELS --ensemble A,B`` says whether those models can form an ensemble.
"""

from __future__ import annotations

import logging
import os
import shutil
import tempfile
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from ..errors import ConfigError, ModelNotFoundError, RepositoryError
from . import layout

logger = logging.getLogger(__name__)

#: The model files an App SDK models folder holds per model, in the order they are looked for.
MODEL_FILES = ("model.ts", "model.pt")


def is_models_folder(path: str | Path) -> bool:
    """A folder that is neither a model folder nor a bundle: a folder of models."""
    from .bundle import bundle_target

    folder = Path(path)
    return folder.is_dir() and not (folder / layout.CONFIG_FILENAME).is_file() and not bundle_target(folder)


def models_in(folder: str | Path) -> dict[str, tuple[str, Path]]:
    """``{name: (kind, path)}`` for every model of ``folder``; kind ``triton``, ``bundle`` or ``torchscript``."""
    from .bundle import bundle_target

    root = Path(folder)
    if not root.is_dir():
        raise ModelNotFoundError(f"models folder {str(root)!r} does not exist or is not a folder")
    found: dict[str, tuple[str, Path]] = {}
    for child in sorted(p for p in root.iterdir() if p.is_dir() and not p.name.startswith(".")):
        files = [child / f for f in MODEL_FILES if (child / f).is_file()]
        if (child / layout.CONFIG_FILENAME).is_file():
            found[child.name] = ("triton", child)
        elif bundle_target(child):
            found[child.name] = ("bundle", child)
        elif files:
            found[child.name] = ("bundle" if bundle_target(files[0]) else "torchscript", files[0])
        else:
            raise ConfigError(
                f"models folder {str(root)!r}: {child.name!r} is not a model (no config.pbtxt, bundle configs, "
                f"or {' / '.join(MODEL_FILES)})"
            )
    if not found:
        raise ModelNotFoundError(f"models folder {str(root)!r} holds no model folders")
    return found


def build_models_folder(
    folder: str | Path, repository: str | Path, *, force: bool = False, **keywords: Any
) -> list[Path]:
    """Every model of ``folder`` into ``repository`` (all or nothing); returns the model folders written."""
    from .builder import build_repository
    from .bundle import build_bundle

    models = models_in(folder)
    out = Path(repository)
    if out.exists() and not out.is_dir():
        raise RepositoryError(f"model repository {str(out)!r} exists and is not a folder")
    taken = [name for name in models if (out / name).exists()]
    if taken and not force:
        raise RepositoryError(f"model repository {str(out)!r} already holds {taken}; pass --force to replace them")
    out.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f".{out.name}.staging-", dir=out.parent))
    try:
        for name, (kind, path) in models.items():
            if kind == "triton":
                shutil.copytree(path, staging / name)
            elif kind == "bundle":
                build_bundle(path, staging, name, **keywords)
            else:
                build_repository(path, staging, name, **keywords)
        out.mkdir(exist_ok=True)
        written = []
        for name in models:
            if (out / name).exists():
                shutil.rmtree(out / name)
            os.replace(staging / name, out / name)
            written.append(out / name)
        return written
    finally:
        shutil.rmtree(staging, ignore_errors=True)


def describe_ensemble(folder: str | Path, members: Sequence[str]) -> str:
    """Each member's signature as ``repo describe`` gives it, and whether they fit together as an ensemble."""
    from .check import describe_path, render_description

    models = models_in(folder)
    missing = [m for m in members if m not in models]
    if missing:
        raise ModelNotFoundError(
            f"ensemble member(s) {missing} not in models folder {str(folder)!r}; it holds {sorted(models)}"
        )
    lines, channels = [], {}
    for name in members:
        kind, path = models[name]
        description = _describe(kind, path, describe_path)
        lines.append(f"member {name!r} ({kind}):\n{render_description(description)}")
        output = description.signature.outputs[0]
        shape = output.full_shape(description.signature.max_batch_size)
        channels[name] = shape[1] if len(shape) > 1 else None
    known = {c for c in channels.values() if c is not None and c >= 0}
    if len(known) > 1:
        raise ConfigError(
            "ensemble members predict different channels: "
            + ", ".join(f"{n!r} {c}" for n, c in channels.items())
            + "; the members of an ensemble must predict the same channels"
        )
    count = f"{known.pop()} output channels each" if known else "output channels not fixed by the signatures"
    if all(models[name][0] == "bundle" for name in members):
        count += f"; {_same_flow([models[name][1] for name in members], members)}"
    lines.append(f"ensemble of {len(members)} members {list(members)}: {count}; they fit together")
    return "\n".join(lines) + "\n"


def _same_flow(paths: Sequence[Path], members: Sequence[str]) -> str:
    """Bundle members run the first's pre-processing, inferer and post-processing (``operators/ensemble_bundles.py``):
    refuse members whose configs differ, as the operator does."""
    from ..bundles import config_difference, read_bundle

    bundles = [read_bundle(path) for path in paths]
    for name, bundle in zip(members[1:], bundles[1:], strict=True):
        found = config_difference(bundles[0], bundle)
        if found is not None:
            raise ConfigError(
                f"ensemble member {name!r} has {found.actual} as item {found.item!r} ({found.file}), member "
                f"{members[0]!r} has {found.expected}: the members of a bundle ensemble share one pre-processing, "
                "inferer and post-processing (the first member's)"
            )
    return "one pre-processing, inferer and post-processing (the bundles' configs are the same)"


def _describe(kind: str, path: Path, describe_path: Any) -> Any:
    if kind == "bundle":
        from .bundle import describe_bundle

        return describe_bundle(path)
    return describe_path(path)
