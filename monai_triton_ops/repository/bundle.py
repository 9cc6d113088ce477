"""MONAI Bundles in a Triton model repository: ``repo build`` / ``describe`` / ``check`` on a bundle, and the cache.

``build_bundle`` reads the bundle as every backend reads it (``bundles.read_bundle``: a broken bundle is
refused before anything is written), turns its network into TorchScript carrying the bundle's metadata
(``models/model.ts`` as it is, or ``network_def`` + ``models/model.pt`` scripted), and writes the model
with tensor names, dtypes and dims from ``network_data_format``, in either flavour. The bundle's
``configs/`` (and ``scripts/``) are copied beside the version folders, so the model folder is itself a
bundle: a client of a remote server, or the operator's ``bundle_path``, can point at it.

``cached_repository`` is the same build into a cache keyed by the bundle's content, for the in-process
``triton`` backend: the operator builds the Triton model by itself, once per bundle content.
"""

from __future__ import annotations

import hashlib
import logging
import os
import re
import tempfile
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING

from ..bundles.source import DEFAULT_CONFIG_NAMES, is_bundle
from ..errors import BundleError, ConfigError, RepositoryError
from ..signature import ModelSignature
from . import layout
from .check import Description, EntryReport
from .metadata import signature_from_metadata
from .naming import rename

if TYPE_CHECKING:
    from typing_extensions import Unpack

    from ..bundles import Bundle
    from .entry import EntryKeywords

logger = logging.getLogger(__name__)

CACHE_ENV = "MONAI_TRITON_CACHE"
#: Changes when what ``build_bundle`` writes changes, so old cache entries are not reused.
CACHE_LAYOUT = "4"  # 4: an ONNX entry holds the rewritten graph, instance norms included (onnx_rewrite.py)


def model_name_of(bundle: Bundle, name: str | None = None) -> str:
    """``name``, else the metadata's ``name`` as a folder name (``Spleen CT segmentation`` ->
    ``spleen_ct_segmentation``, the model zoo's id), else the bundle's folder or file name."""
    if name:
        layout.check_model_name(name)
        return name
    raw = bundle.config.name or (bundle.path.stem if bundle.path.is_file() else bundle.path.name)
    derived = re.sub(r"[^0-9A-Za-z_.-]+", "_", raw.strip()).strip("_.").lower()
    if not derived:
        raise BundleError(
            f"gives no usable model name ({raw!r}); pass --name", file=bundle.config.metadata_file.label, item="name"
        )
    layout.check_model_name(derived)
    return derived


def build_bundle(
    bundle_path: str | Path,
    repository: str | Path,
    name: str | None = None,
    *,
    version: int = 1,
    force: bool = False,
    config_names: Sequence[str] = DEFAULT_CONFIG_NAMES,
    **keywords: Unpack[EntryKeywords],
) -> Path:
    """Write the bundle's network into ``repository`` as model ``name`` with its configs beside it; returns the folder.

    Keywords as for ``build_repository`` (``flavor="libtorch"`` for an NGC server); ``bundle_metadata`` is
    the bundle's own and cannot be given.
    """
    from ..bundles import export_torchscript, read_bundle  # MONAI whole: only where a bundle is read
    from ..bundles.network import network_module
    from .builder import build_repository  # torch: only where a network is written
    from .bundle_signature import served_metadata

    bundle = read_bundle(bundle_path, config_names)
    model_name = model_name_of(bundle, name)
    if keywords.get("bundle_metadata") is not None:
        raise BundleError("takes its metadata from the bundle; drop --bundle-metadata", file=bundle.label)
    if keywords.get("flavor") != "libtorch":  # the python runner serves any names: the bundle's own
        keywords["input_names"] = keywords.get("input_names") or bundle.input_names
    with tempfile.TemporaryDirectory(prefix="monai-triton-bundle-") as scratch:
        network = served_file(bundle, keywords)
        if network is None:
            module = network_module(bundle.config, bundle.scripted)
            served, outputs = served_metadata(bundle, module)
            if keywords.get("flavor") != "libtorch" and not keywords.get("output_names"):
                keywords["output_names"] = outputs
            network = export_torchscript(bundle.config, Path(scratch) / "model.pt", module, served)
        folder = build_repository(
            network,
            repository,
            model_name,
            version=version,
            force=force,
            extra_files=bundle_files(bundle),
            **keywords,
        )
    logger.info("bundle %s: model %r written to %s", bundle.label, model_name, folder)
    return folder


def served_file(bundle: Bundle, keywords: EntryKeywords) -> Path | None:
    """A converted ``models/model.pt2|.onnx`` (``monai-triton convert``), served as it is; ``None`` for a network
    that is written as TorchScript. An ONNX graph keeps the tensor names it was exported with (the bundle's)."""
    from ..bundles.source import SERVED_SUFFIXES

    if bundle.network.suffix not in SERVED_SUFFIXES:
        return None
    if bundle.network.suffix == ".onnx":
        keywords.pop("input_names", None)
        keywords.pop("output_names", None)
    elif keywords.get("flavor") != "libtorch" and not keywords.get("output_names"):
        keywords["output_names"] = bundle.output_names
    return bundle.network


def bundle_files(bundle: Bundle) -> dict[str, bytes]:
    """The files a client needs beside the model: ``configs/*`` (and ``scripts/``), embedded configs as files."""
    source = bundle.config.source
    if source.root is None:
        return {f"configs/{name}.json": item.text.encode() for name, item in source.embedded.items()}
    found: dict[str, bytes] = {}
    for sub in ("configs", "scripts"):
        folder = source.root / sub
        if folder.is_dir():
            for path in sorted(p for p in folder.rglob("*") if p.is_file() and "__pycache__" not in p.parts):
                found[path.relative_to(source.root).as_posix()] = path.read_bytes()
    return found


def content_key(bundle: Bundle, flavor: str) -> str:
    """A digest of everything that makes the Triton model: the bundle's files, config names, flavour, layout."""
    digest = hashlib.sha256(f"{CACHE_LAYOUT}|{flavor}|{','.join(bundle.config.config_names)}".encode())
    source = bundle.config.source
    base = source.root or source.path.parent
    for path in source.files():
        digest.update(str(path.relative_to(base) if path.is_relative_to(base) else path.name).encode())
        digest.update(hashlib.sha256(path.read_bytes()).digest())
    return digest.hexdigest()[:24]


def cache_root() -> Path:
    """``$MONAI_TRITON_CACHE/bundles``, else ``$XDG_CACHE_HOME/monai-triton/bundles`` (``~/.cache/...``)."""
    base = os.environ.get(CACHE_ENV) or os.path.join(
        os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache"), "monai-triton"
    )
    return Path(base) / "bundles"


def cached_repository(bundle: Bundle, name: str, *, flavor: str = "python") -> tuple[Path, str]:
    """A model repository holding the bundle's network, built once per bundle content; returns it and the model name.

    The name is ``<name>-<content key>``: the one in-process server of a process holds models by name, so two
    bundles of one name but different content (two versions of a model in one app) must not share one.
    """
    key = content_key(bundle, flavor)
    repository, served = cache_root() / key, f"{name}-{key[:10]}"
    if (repository / served / layout.CONFIG_FILENAME).is_file():
        logger.info("bundle %s: cached Triton model %s", bundle.label, repository / served)
        return repository, served
    try:
        build_bundle(bundle.path, repository, served, config_names=bundle.config.config_names, flavor=flavor)
    except RepositoryError:
        if not (repository / served / layout.CONFIG_FILENAME).is_file():  # another process built it meanwhile
            raise
    return repository, served


def bundle_target(path: str | Path) -> bool:
    """Whether a ``repo`` command's path is a bundle to read as one: a bundle that is not a repository model folder."""
    given = Path(path)
    return is_bundle(given) and not (given / layout.CONFIG_FILENAME).is_file()


def served_signature(bundle: Bundle) -> ModelSignature:
    """The signature of the Triton model ``repo build`` writes: the network's outputs as it returns them."""
    from ..bundles.network import network_module
    from ..bundles.source import SERVED_SUFFIXES
    from .bundle_signature import served_metadata  # torch: only where a bundle is read, not for a model folder

    if bundle.network.suffix in SERVED_SUFFIXES:  # converted with the bundle's own tensor names
        metadata = signature_from_metadata(model_name_of(bundle), bundle.metadata)
        return rename(metadata, bundle.input_names, bundle.output_names)
    served, outputs = served_metadata(bundle, network_module(bundle.config, bundle.scripted))
    return rename(signature_from_metadata(model_name_of(bundle), served), bundle.input_names, outputs)


def describe_bundle(path: str | Path, config_names: Sequence[str] = DEFAULT_CONFIG_NAMES) -> Description:
    """What ``repo describe`` says of a bundle: the signature its Triton model has, and what it runs."""
    from ..bundles import read_bundle
    from .heads import LAYOUT_KEY

    bundle = read_bundle(path, config_names)
    signature = served_signature(bundle)
    from ..bundles.outputs import describe as describe_outputs

    notes = (
        f"outputs: {describe_outputs(bundle.config.outputs)}",
        f"inferer: {type(bundle.inferer).__name__}",
        f"network: {bundle.network.name} ({_network_kind(bundle)})",
        *((f"detector: {type(bundle.detector).__name__} (beside the app; the network on the backend)",)
          if bundle.detector is not None else ()),
        *((f"outputs: the network's {len(signature.outputs)} tensors, rebuilt into its own structure for the "
           "inferer",) if LAYOUT_KEY in signature.metadata else ()),
    )  # fmt: skip
    return Description(signature=signature, source="bundle network_data_format", kind="MONAI bundle", uses=notes)


def check_bundle(path: str | Path, config_names: Sequence[str] = DEFAULT_CONFIG_NAMES) -> EntryReport:
    """``repo check`` on a bundle: everything built as a run builds it, the network loaded and run; problems listed."""
    from ..bundles import read_bundle

    try:
        bundle = read_bundle(path, config_names)
        name = model_name_of(bundle)
        signature = served_signature(bundle)
    except (BundleError, ConfigError) as exc:
        return EntryReport(name=Path(path).name, versions=(), signature=None, source="-", problems=(str(exc),))
    return EntryReport(
        name=name,
        versions=(),
        signature=signature,
        source="bundle",
        kind="MONAI bundle",
        uses=("monai-triton repo build (either flavour); InferenceOperator(bundle_path=...) on every backend",),
    )


def _network_kind(bundle: Bundle) -> str:
    if bundle.network_is_torchscript:
        return "TorchScript"
    return {".pt2": "torch.export program", ".onnx": "ONNX"}.get(bundle.network.suffix, "network_def weights")
