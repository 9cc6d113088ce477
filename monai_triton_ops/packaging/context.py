"""The MAP build context: holoscan-cli 4.2.0's layout, written whole or not at all.

::

    <context>/
      Dockerfile          the Containerfile (containerfile.py)
      .dockerignore
      app/                the app folder (or the one .py file), caches left out   -> /opt/holoscan/app
      app.config          the app's app.yaml                                      -> /var/holoscan/app.yaml
      map/app.json        application manifest                                    -> /etc/holoscan/app.json
      map/pkg.json        package manifest                                        -> /etc/holoscan/pkg.json
      models/<name>/      each model folder of the model repository               -> /opt/holoscan/models/<name>/
      docs/               the app's README, if it has one                         -> /opt/holoscan/docs
      pip/                requirements.txt, constraints.txt, this project's wheel (requirements.py)
      tools               the entry point: run the app, show, export              -> /var/holoscan/tools

The context is assembled in a sibling folder and renamed into place, so an interrupted or failed run
leaves the previous context (or nothing). An existing folder is replaced only if an earlier run wrote it.
"""

from __future__ import annotations

import json
import re
import shutil
import tempfile
from collections.abc import Sequence
from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path

from ..errors import ConfigError, UsageError
from . import containerfile, manifests, requirements
from .appconfig import AppConfig, read_app_config
from .wheel import project_wheel

MARKER = ".monai-triton-map-context"
_IGNORED = shutil.ignore_patterns("__pycache__", "*.pyc", ".git", ".pytest_cache", ".mypy_cache", ".ruff_cache")
_DOCKERIGNORE = "**/__pycache__\n**/*.pyc\n**/.git\n" + MARKER + "\n"


@dataclass(frozen=True, kw_only=True)
class PackageRequest:
    """What ``monai-triton package`` was asked to package."""

    app: Path
    """A folder with ``__main__.py``, or one ``.py`` file."""
    models: Path | None = None
    """A model repository folder (one model per subfolder), or one model file."""
    output: Path
    """The build context folder to write."""
    config: Path | None = None
    """``app.yaml``; default: the app folder's."""
    requirements: Path | None = None
    """The app's ``requirements.txt``; default: the app folder's."""
    tag: str | None = None
    version: str | None = None
    wheel: Path | None = None
    constraints: tuple[Path, ...] = ()
    pin_environment: bool = True
    timeout_s: int = 0
    uid: int = 1000
    gid: int = 1000


@dataclass(frozen=True, kw_only=True)
class BuildContext:
    """A written context and what it holds."""

    path: Path
    tag: str
    config: AppConfig
    models: tuple[str, ...]
    app_manifest: dict[str, object] = field(repr=False)
    package_manifest: dict[str, object] = field(repr=False)


def app_folder(request: PackageRequest) -> Path:
    """The folder holding the app's ``app.yaml`` and ``requirements.txt``."""
    return request.app if request.app.is_dir() else request.app.parent


def write_context(request: PackageRequest, *, base_image: str) -> BuildContext:
    """Check everything, then write the whole context (see the module docstring)."""
    entry = _check_app(request.app)
    config = read_app_config(request.config or app_folder(request) / "app.yaml", version=request.version)
    models = _model_entries(request.models)
    tag = qualified_tag(request.tag or default_tag(request.app, config.version))
    _check_output(request.output)
    request.output.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(dir=request.output.parent, prefix=f".{request.output.name}.partial-"))
    try:
        built = _fill(staging, request, config, entry, models, tag=tag, base_image=base_image)
        if request.output.exists():
            shutil.rmtree(request.output)
        staging.replace(request.output)
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise
    return BuildContext(path=request.output, tag=tag, config=config, models=tuple(models), **built)


def _fill(
    root: Path,
    request: PackageRequest,
    config: AppConfig,
    entry: str,
    models: dict[str, Path],
    *,
    tag: str,
    base_image: str,
) -> dict[str, dict[str, object]]:
    wheel, server_files = _write_pip(root / "pip", request, config)
    sdk_version = requirements.installed_version("monai-deploy-app-sdk") or "0.0.0"
    holoscan_version = requirements.installed_version("holoscan-cu13", "holoscan-cu12", "holoscan") or "0.0.0"
    command = ["python3", f"{manifests.LAYOUT.app_dir}/{entry}".rstrip("/")]
    app_json = manifests.app_manifest(config, command=command, sdk_version=sdk_version, timeout_s=request.timeout_s)
    pkg_json = manifests.package_manifest(config, list(models))
    (root / "map").mkdir()
    (root / "map" / "app.json").write_text(manifests.write_json(app_json), encoding="utf-8")
    (root / "map" / "pkg.json").write_text(manifests.write_json(pkg_json), encoding="utf-8")
    has_docs = _copy_payload(root, request, config, models)
    labels = manifests.image_labels(
        config, tag=tag, base_image=base_image, holoscan_version=holoscan_version, sdk_version=sdk_version
    )
    spec = containerfile.ContainerSpec(
        base_image=base_image,
        environment=manifests.image_environment(config, timeout_s=request.timeout_s),
        labels=labels,
        wheel_name=wheel.name,
        server_files=server_files,
        uid=request.uid,
        gid=request.gid,
        has_docs=has_docs,
    )
    (root / "Dockerfile").write_text(containerfile.render(spec))
    (root / ".dockerignore").write_text(_DOCKERIGNORE)
    (root / MARKER).write_text(json.dumps({"tag": tag, "version": config.version}) + "\n")
    return {"app_manifest": app_json, "package_manifest": pkg_json}


def _copy_payload(root: Path, request: PackageRequest, config: AppConfig, models: dict[str, Path]) -> bool:
    """``app.config``, ``app/``, ``models/``, ``docs/`` and ``tools``; returns whether there are docs."""
    shutil.copyfile(config.path, root / "app.config")
    _copy_app(request.app, root / "app")
    _copy_models(models, root / "models")
    tools = root / "tools"
    tools.write_text(resources.files(__package__).joinpath("tools.sh").read_text(encoding="utf-8"))
    tools.chmod(0o755)
    return _copy_docs(app_folder(request), root / "docs")


def _write_pip(folder: Path, request: PackageRequest, config: AppConfig) -> tuple[Path, str | None]:
    """``pip/``: the wheel, requirements and constraints; returns the wheel and the server files' pin (or None)."""
    wheel = project_wheel(folder, request.wheel)
    app_file = request.requirements or app_folder(request) / "requirements.txt"
    wanted = [*requirements.app_requirements(app_file, config.pip_packages), *requirements.wheel_requirements(wheel)]
    (folder / "requirements.txt").write_text("\n".join(wanted) + "\n")
    server_version = requirements.installed_version(requirements.SERVER_FILES)
    server_files = f"{requirements.SERVER_FILES}=={server_version}" if server_version else None
    pinned = [*wanted, *([requirements.SERVER_FILES] if server_files else [])]
    pins = requirements.environment_pins(pinned) if request.pin_environment else {}
    (folder / "constraints.txt").write_text(requirements.constraints_text(pins, request.constraints))
    return wheel, server_files


def qualified_tag(tag: str) -> str:
    """``name:tag`` -> ``localhost/name:tag``; a name whose first part is a registry (``host.domain``,
    ``host:port``, ``localhost``) is kept.

    buildah resolves a short name against the images it already has: ``-t seg:1`` re-tagged an existing
    ``localhost/other/seg:1`` instead of making ``localhost/seg:1``. A qualified name means one image.
    """
    first, slash, _ = tag.partition("/")
    if slash and ("." in first or ":" in first or first == "localhost"):
        return tag
    return f"localhost/{tag}"


def default_tag(app: Path, version: str) -> str:
    """``apps/brain_tissue_seg`` at 0.1.0 -> ``brain-tissue-seg:0.1.0`` (a valid image name)."""
    stem = app.stem if app.is_file() else app.resolve().name
    name = re.sub(r"[^a-z0-9.-]+", "-", stem.lower()).strip("-.") or "map"
    return f"{name}:{version}"


def _check_app(app: Path) -> str:
    """The app's entry below ``/opt/holoscan/app``: ``""`` for a folder with ``__main__.py``, else the file name."""
    if app.is_dir():
        if not (app / "__main__.py").is_file():
            raise UsageError(f"app folder {str(app)!r} has no __main__.py (python3 runs the folder in the MAP)")
        return ""
    if app.is_file() and app.suffix == ".py":
        return app.name
    raise UsageError(f"app {str(app)!r} is neither a folder with __main__.py nor a .py file")


def _model_entries(models: Path | None) -> dict[str, Path]:
    """Model name -> its folder (or file): each subfolder of a repository, or one model file."""
    if models is None:
        return {}
    if models.is_file():
        return {models.stem: models}
    if not models.is_dir():
        raise ConfigError(f"model path {str(models)!r} does not exist (-m: a model repository folder or a model file)")
    if (models / "configs").is_dir() and not (models / "config.pbtxt").is_file():  # a MONAI bundle folder: one model
        return {models.name: models}
    entries = {
        p.name: p
        for p in sorted(models.iterdir())
        if p.is_dir() and not p.name.startswith(".") and p.name != "__pycache__"
    }
    if not entries:
        raise ConfigError(f"model repository {str(models)!r} holds no model folders")
    for name in entries:
        if len(name.encode()) > 128 or re.search(r"\s", name):
            raise ConfigError(f"model name {name!r}: the MAP spec allows no whitespace and at most 128 bytes")
    return entries


def _check_output(output: Path) -> None:
    ours = (output / MARKER).is_file()
    if output.exists() and not ours and (not output.is_dir() or any(output.iterdir())):
        raise UsageError(f"output {str(output)!r} exists and was not written by 'monai-triton package'; choose another")


def _copy_app(app: Path, dest: Path) -> None:
    if app.is_dir():
        shutil.copytree(app, dest, ignore=_IGNORED, symlinks=False)
    else:
        dest.mkdir()
        shutil.copy2(app, dest / app.name)


def _copy_models(models: dict[str, Path], dest: Path) -> None:
    dest.mkdir()
    for name, source in models.items():
        if source.is_dir():
            shutil.copytree(source, dest / name, ignore=_IGNORED, symlinks=False)
        else:
            (dest / name).mkdir()
            shutil.copy2(source, dest / name / source.name)


def _copy_docs(folder: Path, dest: Path, names: Sequence[str] = ("README.md", "LICENSE", "NOTICE")) -> bool:
    found = [folder / n for n in names if (folder / n).is_file()]
    if found:
        dest.mkdir()
        for path in found:
            shutil.copy2(path, dest / path.name)
    return bool(found)
