"""Where a MONAI Bundle's files are: a bundle folder, or one TorchScript file with its configs embedded.

A bundle folder is the model zoo's layout::

    <bundle>/configs/metadata.json           required: the network's inputs and outputs (network_data_format)
    <bundle>/configs/inference.json|yaml|yml the config items (preprocessing, inferer, postprocessing, network_def)
    <bundle>/models/model.ts                 TorchScript, or
    <bundle>/models/model.pt                 weights for the config's network_def, or
    <bundle>/models/model.pt2|model.onnx     the network converted (``monai-triton convert``), served as it is
    <bundle>/scripts/                        the bundle's own Python code, importable as ``scripts``

``monai-triton repo build`` writes the same ``configs/`` folder beside a Triton model's version folders,
so a repository model folder is a bundle folder too (its network is ``1/model.pt``, ``.pt2`` or ``.onnx``).

A TorchScript file written by ``monai.bundle.ckpt_export`` (what the App SDK packages) carries
``metadata.json`` and every config as JSON "extra files" (``<archive>/extra/<name>.json``); they are read
from the zip archive, as the App SDK reads them. Nothing here parses a config: that is ``config.py``.
"""

from __future__ import annotations

import json
import zipfile
from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath
from typing import Any

import yaml

from ..errors import BundleError

#: The config a bundle runs when no other is named: ``configs/inference.(json|yaml)``, as the App SDK reads it.
DEFAULT_CONFIG_NAMES = ("inference",)

#: The config file suffixes a bundle may use, in the order they are looked for (the App SDK's order).
SUFFIXES = (".json", ".yaml", ".yml")
METADATA = "metadata"
#: Where a bundle folder keeps its network, in the order they are looked for.
MODEL_FILES = ("models/model.ts", "models/model.pt", "models/model.pt2", "models/model.onnx")
#: A bundle network that is already what a backend loads (``monai-triton convert`` writes them): served as it is.
SERVED_SUFFIXES = (".pt2", ".onnx")
#: A repository model folder's network (``repo build``'s layout), TorchScript or converted.
REPOSITORY_MODELS = ("1/model.pt", "1/model.pt2", "1/model.onnx")


@dataclass(frozen=True)
class BundleFile:
    """One config file of a bundle: its name as errors show it and its text."""

    label: str
    text: str
    suffix: str

    def load(self) -> dict[str, Any]:
        """The file's content as a dict; a syntax error names the file and the line."""
        try:
            content = json.loads(self.text) if self.suffix == ".json" else yaml.safe_load(self.text)
        except json.JSONDecodeError as exc:
            raise BundleError(
                f"is not valid JSON: {exc.msg} at line {exc.lineno} column {exc.colno}", file=self.label
            ) from None
        except yaml.YAMLError as exc:
            raise BundleError(f"is not valid YAML: {str(exc).splitlines()[0]}", file=self.label) from None
        if content is None:
            return {}
        if not isinstance(content, dict):
            raise BundleError(f"must hold an object of config items, got a {type(content).__name__}", file=self.label)
        return content


@dataclass(frozen=True)
class BundleSource:
    """The files of one bundle, found but not yet parsed.

    ``root`` is the bundle folder (``None`` for a TorchScript file), ``model_file`` the network file
    (``models/model.ts``, ``models/model.pt``, ``1/model.pt`` of a repository folder, or the ``.ts`` itself)
    and ``embedded`` the configs read out of a TorchScript file.
    """

    path: Path
    root: Path | None
    model_file: Path | None
    embedded: dict[str, BundleFile] = field(default_factory=dict)

    @property
    def label(self) -> str:
        return str(self.path)

    def config_file(self, name: str) -> BundleFile:
        """Config ``name`` (``inference``, ``inference.json``...); a missing one says which configs exist."""
        base = _base_name(name)
        if self.root is None:
            if base in self.embedded:
                return self.embedded[base]
            raise BundleError(
                f"has no embedded config {base!r} (it holds {sorted(self.embedded)}); "
                "check bundle_config_names (--config-name), or export the bundle with ckpt_export --config_file "
                "naming it",
                file=self.label,
            )
        folder = self.root / "configs"
        for suffix in SUFFIXES:
            path = folder / f"{base}{suffix}"
            if path.is_file():
                return BundleFile(label=str(path), text=_read(path), suffix=suffix)
        present = sorted(p.stem for p in folder.glob("*") if p.suffix in SUFFIXES) if folder.is_dir() else []
        raise BundleError(
            f"has no config {base!r} ({base}.json, .yaml or .yml; configs present: {present}); "
            "check bundle_config_names (--config-name)",
            file=str(folder),
        )

    def metadata_file(self) -> BundleFile:
        """``configs/metadata.json`` (or the embedded ``metadata.json``); required, as for the App SDK."""
        try:
            return self.config_file(METADATA)
        except BundleError:
            where = str(self.root / "configs" / "metadata.json") if self.root else f"{self.label}:extra/metadata.json"
            raise BundleError(
                "is missing: a bundle needs its metadata (network_data_format names the network's inputs and outputs)",
                file=where,
            ) from None

    def files(self) -> list[Path]:
        """Every file that makes up the bundle (for a content key): configs, model, scripts."""
        if self.root is None:
            return [self.path]
        found = sorted(p for p in (self.root / "configs").rglob("*") if p.is_file())
        scripts = self.root / "scripts"
        if scripts.is_dir():
            found += sorted(p for p in scripts.rglob("*.py") if p.is_file())
        if self.model_file is not None:
            found.append(self.model_file)
        return found


def find_bundle(path: str | Path) -> BundleSource:
    """The bundle at ``path``: a folder with ``configs/metadata.json``, or a TorchScript file with embedded configs."""
    given = Path(path).expanduser()
    if given.is_dir():
        return _folder(given)
    if given.is_file():
        return _archive(given)
    raise BundleError("does not exist: give a bundle folder (configs/, models/) or a bundle .ts file", file=str(given))


def is_bundle(path: str | Path) -> bool:
    """Whether ``path`` is a bundle: a folder with ``configs/``, or TorchScript with configs beside its metadata."""
    given = Path(path)
    if given.is_dir():
        return (given / "configs" / "metadata.json").is_file() or (given / "configs" / "inference.json").is_file()
    if given.is_file() and zipfile.is_zipfile(given):  # metadata alone is a model file with MONAI metadata
        return bool(set(_embedded(given)) - {METADATA})
    return False


def _folder(root: Path) -> BundleSource:
    if not (root / "configs").is_dir():
        raise BundleError(
            "has no configs/ folder: a bundle folder holds configs/metadata.json and configs/inference.json",
            file=str(root),
        )
    candidates = [root / name for name in (*MODEL_FILES, *REPOSITORY_MODELS)]
    model = next((p for p in candidates if p.is_file()), None)
    return BundleSource(path=root, root=root.resolve(), model_file=model)


def _archive(path: Path) -> BundleSource:
    if not zipfile.is_zipfile(path):
        raise BundleError("is neither a bundle folder nor a TorchScript file", file=str(path))
    embedded = _embedded(path)
    if not embedded:
        raise BundleError(
            "is TorchScript without embedded bundle configs; export it with monai.bundle ckpt_export "
            "(which embeds metadata.json and the configs), or give the bundle folder",
            file=str(path),
        )
    return BundleSource(path=path, root=None, model_file=path, embedded=embedded)


def _embedded(path: Path) -> dict[str, BundleFile]:
    """The configs stored as ``<archive>/extra/<name>.<suffix>`` in a TorchScript zip archive."""
    found: dict[str, BundleFile] = {}
    with zipfile.ZipFile(path) as archive:
        for member in archive.namelist():
            parts = PurePosixPath(member)
            if parts.parent.name != "extra" or parts.suffix not in SUFFIXES:
                continue
            text = archive.read(member).decode("utf-8", errors="replace")
            found.setdefault(parts.stem, BundleFile(label=f"{path}:extra/{parts.name}", text=text, suffix=parts.suffix))
    return found


def _base_name(name: str) -> str:
    base = str(name).strip()
    for suffix in SUFFIXES:
        if base.endswith(suffix):
            base = base[: -len(suffix)]
    if not base or "/" in base or "\\" in base or ".." in base:
        raise BundleError(f"config name {name!r} is not a plain name such as 'inference'")
    return base


def _read(path: Path) -> str:
    try:
        return path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise BundleError(f"cannot be read: {exc}", file=str(path)) from exc
