"""An App SDK ``app.yaml``: what a MAP's manifests and image take from it, checked before anything is written.

The file the App SDK and ``monai-deploy package`` read::

    application:
      title: My app                       required: the image's title label
      version: 0.1.0                      required (or --version): app.json, pkg.json and the version label
      inputFormats: ["file"]              also accepted as input-formats (what holoscan-cli 4.2.0 reads)
      outputFormats: ["file"]             also accepted as output-formats
      environment:                        the app's environment variables and their defaults: listed in
        MONAI_TRITON_BACKEND: torch       app.json (4.2.0 drops them), applied by the app at start
      pip-packages: [...]                 optional: more requirements for the image
    resources:                            copied into pkg.json (cpu, gpu, memory, gpuMemory, sharedMemory, *Limit)
      cpu: 2
      memory: 4Gi

Every problem is a ``ConfigError`` naming the file and the key, so nothing is written for a file that
cannot make a valid MAP.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..errors import ConfigError

#: Resource keys of the HAP spec's package manifest; counts are decimals, sizes are ``<number>Mi|Gi``.
COUNT_RESOURCES = ("cpu", "cpuLimit", "gpu", "gpuLimit")
SIZE_RESOURCES = ("memory", "memoryLimit", "gpuMemory", "gpuMemoryLimit", "sharedMemory", "sharedMemoryLimit")
_SIZE = re.compile(r"^\d+(\.\d+)?(Mi|Gi)$")
_ENV_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
_SEMVER = re.compile(r"^\d+\.\d+\.\d+([-+][0-9A-Za-z.+-]+)?$")
#: The spellings of the formats keys: ours (the App SDK examples') and holoscan-cli 4.2.0's.
_FORMAT_KEYS = {"input": ("inputFormats", "input-formats"), "output": ("outputFormats", "output-formats")}


@dataclass(frozen=True, kw_only=True)
class AppConfig:
    """The parts of ``app.yaml`` a MAP needs, validated."""

    path: Path
    title: str
    version: str
    input_formats: tuple[str, ...]
    output_formats: tuple[str, ...]
    environment: Mapping[str, str] = field(default_factory=dict)
    """Variable -> default value, in file order."""
    resources: Mapping[str, Any] = field(default_factory=dict)
    pip_packages: tuple[str, ...] = ()


def read_app_config(path: str | Path, *, version: str | None = None) -> AppConfig:
    """Read and check ``app.yaml``; ``version`` (``--version``) replaces ``application.version``."""
    import yaml

    source = Path(path)
    try:
        data = yaml.safe_load(source.read_text(encoding="utf-8"))
    except FileNotFoundError as exc:
        raise ConfigError(f"app configuration {str(source)!r} does not exist (an App SDK app.yaml)") from exc
    except yaml.YAMLError as exc:
        raise ConfigError(f"{source}: not valid YAML: {exc}") from exc
    application = _section(data, "application", source)
    resources = _section(data, "resources", source)
    return AppConfig(
        path=source,
        title=_title(application, source),
        version=_version(version if version is not None else application.get("version"), source),
        input_formats=_formats(application, "input", source),
        output_formats=_formats(application, "output", source),
        environment=_environment(application.get("environment"), source),
        resources=_resources(resources, source),
        pip_packages=_strings(application.get("pip-packages") or [], f"{source}: application.pip-packages"),
    )


def _section(data: Any, key: str, source: Path) -> dict[str, Any]:
    if not isinstance(data, dict) or not isinstance(data.get(key), dict):
        raise ConfigError(f"{source}: no '{key}:' mapping (an App SDK app.yaml has 'application:' and 'resources:')")
    section: dict[str, Any] = data[key]
    return section


def _title(application: dict[str, Any], source: Path) -> str:
    title = application.get("title")
    if not isinstance(title, str) or not title.strip():
        raise ConfigError(f"{source}: application.title is missing or empty (the image's title label)")
    return title.strip()


def _version(value: Any, source: Path) -> str:
    text = str(value).strip() if value is not None else ""
    if not _SEMVER.match(text):
        raise ConfigError(
            f"{source}: application.version must be a semantic version like 1.2.3 (the MAP's version), got {value!r}"
        )
    return text


def _formats(application: dict[str, Any], direction: str, source: Path) -> tuple[str, ...]:
    ours, theirs = _FORMAT_KEYS[direction]
    if ours in application and theirs in application and application[ours] != application[theirs]:
        raise ConfigError(f"{source}: application.{ours} and application.{theirs} disagree; keep one")
    value = application.get(ours, application.get(theirs))
    if value is None:
        raise ConfigError(
            f"{source}: application.{ours} is missing: the MAP spec requires the {direction} formats "
            f'(for example {ours}: ["file"])'
        )
    formats = _strings(value if isinstance(value, list) else [value], f"{source}: application.{ours}")
    if not formats:
        raise ConfigError(f"{source}: application.{ours} is empty: the MAP spec requires at least one format")
    return formats


def _environment(value: Any, source: Path) -> dict[str, str]:
    if value is None:
        return {}
    if not isinstance(value, dict):
        raise ConfigError(f"{source}: application.environment must map variable names to values")
    environment: dict[str, str] = {}
    for name, default in value.items():
        if not isinstance(name, str) or not _ENV_NAME.match(name):
            raise ConfigError(f"{source}: application.environment: {name!r} is not a valid variable name")
        if isinstance(default, dict | list) or default is None:
            raise ConfigError(f"{source}: application.environment.{name} must be a string, number or boolean")
        environment[name] = str(default).lower() if isinstance(default, bool) else str(default)
    return environment


def _resources(resources: dict[str, Any], source: Path) -> dict[str, Any]:
    for key, value in resources.items():
        where = f"{source}: resources.{key}"
        if key in COUNT_RESOURCES:
            if isinstance(value, bool) or not isinstance(value, int | float) or value < 0:
                raise ConfigError(f"{where} must be a non-negative number, got {value!r}")
        elif key in SIZE_RESOURCES:
            if not isinstance(value, str) or not _SIZE.match(value):
                raise ConfigError(f"{where} must be a size like 512Mi or 1.5Gi, got {value!r}")
        elif key != "fragments":
            known = ", ".join((*COUNT_RESOURCES, *SIZE_RESOURCES, "fragments"))
            raise ConfigError(f"{where} is not a resource of the MAP spec ({known})")
    return dict(resources)


def _strings(values: list[Any], where: str) -> tuple[str, ...]:
    if not isinstance(values, list) or not all(isinstance(v, str) and v.strip() for v in values):
        raise ConfigError(f"{where} must be a list of non-empty strings, got {values!r}")
    return tuple(v.strip() for v in values)
