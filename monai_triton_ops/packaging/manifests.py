"""The MAP's two manifests, its environment and its labels, as the MAP/HAP spec wants them.

Paths and names follow holoscan-cli 4.2.0's packager (what App SDK users know); where 4.2.0 breaks the
spec, the spec wins:

- ``app.json#type`` is written (``application``: the app runs to completion; 4.2.0 leaves it out);
- ``app.json#input.formats`` / ``output.formats`` come from ``app.yaml`` (4.2.0 reads keys our
  ``app.yaml`` does not use and writes ``null``);
- ``pkg.json#models`` is a list of ``{name, path}`` (4.2.0 writes an object);
- ``app.json#environment`` carries ``application.environment`` of ``app.yaml`` besides ``HOLOSCAN_*``
  (4.2.0 drops it). The image's ``ENV`` holds only the ``HOLOSCAN_*`` part: the app applies ``app.yaml``'s
  defaults itself at start (from ``HOLOSCAN_CONFIG_PATH``, where the environment lacks them), so that a
  variable given to the container is told apart from a default. Baked in as ``ENV``, the default
  ``MONAI_TRITON_BACKEND`` would be a real variable and hide ``-e TRITON_SERVER_NETLOC=HOST:PORT``.

Where the spec's tables and the packager disagree on a name (``HOLOSCAN_DOCS`` vs ``HOLOSCAN_DOCS_PATH``),
the packager's name is used, as the App SDK and ``holoscan run`` read it.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from .appconfig import AppConfig

#: Version of the manifest schema (4.2.0 writes the same).
API_VERSION = "1.0.0"
#: The app runs on one input and exits (a ``service`` would keep running and declare probes).
APP_TYPE = "application"
SDK = "monai-deploy"


@dataclass(frozen=True)
class MapLayout:
    """Where everything lives inside the image (holoscan-cli 4.2.0's defaults, the spec's table of paths)."""

    app_dir: str = "/opt/holoscan/app"
    models_dir: str = "/opt/holoscan/models"
    docs_dir: str = "/opt/holoscan/docs"
    work_dir: str = "/var/holoscan"
    input_dir: str = "/var/holoscan/input"
    output_dir: str = "/var/holoscan/output"
    logs_dir: str = "/var/holoscan/logs"
    config_path: str = "/var/holoscan/app.yaml"
    tools_path: str = "/var/holoscan/tools"
    app_json: str = "/etc/holoscan/app.json"
    pkg_json: str = "/etc/holoscan/pkg.json"
    export_dir: str = "/var/run/holoscan/export"
    venv: str = "/opt/venv"
    """The app's Python environment (not part of the spec: the packager's choice; 4.2.0 uses ``~/.local``)."""


LAYOUT = MapLayout()


def holoscan_environment(layout: MapLayout = LAYOUT, *, timeout_s: int = 0) -> dict[str, str]:
    """The ``HOLOSCAN_*`` variables and their defaults (the App SDK reads input, output, model and workdir)."""
    return {
        "HOLOSCAN_APPLICATION": layout.app_dir,
        "HOLOSCAN_INPUT_PATH": layout.input_dir,
        "HOLOSCAN_OUTPUT_PATH": layout.output_dir,
        "HOLOSCAN_WORKDIR": layout.work_dir,
        "HOLOSCAN_MODEL_PATH": layout.models_dir,
        "HOLOSCAN_CONFIG_PATH": layout.config_path,
        "HOLOSCAN_APP_MANIFEST_PATH": layout.app_json,
        "HOLOSCAN_PKG_MANIFEST_PATH": layout.pkg_json,
        "HOLOSCAN_DOCS_PATH": layout.docs_dir,
        "HOLOSCAN_LOGS_PATH": layout.logs_dir,
        "HOLOSCAN_TIMEOUT": str(timeout_s),
    }


def app_environment(config: AppConfig, layout: MapLayout = LAYOUT, *, timeout_s: int = 0) -> dict[str, str]:
    """Everything the app reads from its environment: ``HOLOSCAN_*``, then ``app.yaml``'s ``environment:``."""
    holoscan = holoscan_environment(layout, timeout_s=timeout_s)
    clash = sorted(set(holoscan) & set(config.environment))
    if clash:
        from ..errors import ConfigError

        raise ConfigError(f"{config.path}: application.environment sets {clash}, which the MAP layout fixes")
    return {**holoscan, **config.environment}


def image_environment(config: AppConfig, layout: MapLayout = LAYOUT, *, timeout_s: int = 0) -> dict[str, str]:
    """The image's ``ENV``: ``HOLOSCAN_*`` only (``app.yaml``'s defaults are the app's to apply, see above)."""
    app_environment(config, layout, timeout_s=timeout_s)  # the same checks as the manifest's
    return holoscan_environment(layout, timeout_s=timeout_s)


def app_manifest(
    config: AppConfig,
    *,
    command: Sequence[str],
    sdk_version: str,
    layout: MapLayout = LAYOUT,
    timeout_s: int = 0,
) -> dict[str, Any]:
    """``/etc/holoscan/app.json``. ``command`` is stored as 4.2.0 does: a JSON array in a string."""
    return {
        "apiVersion": API_VERSION,
        "type": APP_TYPE,
        "command": json.dumps(list(command)),
        "environment": app_environment(config, layout, timeout_s=timeout_s),
        "input": {"path": _relative(layout.input_dir, layout.work_dir), "formats": list(config.input_formats)},
        "output": {"path": _relative(layout.output_dir, layout.work_dir), "formats": list(config.output_formats)},
        "sdk": SDK,
        "sdkVersion": sdk_version,
        "timeout": timeout_s,
        "version": config.version,
        "workingDirectory": layout.work_dir,
    }


def package_manifest(config: AppConfig, models: Sequence[str], layout: MapLayout = LAYOUT) -> dict[str, Any]:
    """``/etc/holoscan/pkg.json``: each model a ``{name, path}`` with ``path`` relative to ``modelRoot``."""
    return {
        "apiVersion": API_VERSION,
        "applicationRoot": layout.app_dir,
        "modelRoot": layout.models_dir,
        "models": [{"name": name, "path": name} for name in models],
        "resources": dict(config.resources),
        "version": config.version,
    }


def image_labels(
    config: AppConfig, *, tag: str, base_image: str, holoscan_version: str, sdk_version: str
) -> dict[str, str]:
    """OCI title and version (equal to ``app.json#version``) plus 4.2.0's own labels."""
    return {
        "org.opencontainers.image.title": config.title,
        "org.opencontainers.image.version": config.version,
        "org.nvidia.holoscan": holoscan_version,
        "org.monai.deploy.app-sdk": sdk_version,
        "base": base_image,
        "tag": tag,
    }


def write_json(data: Mapping[str, Any]) -> str:
    """Manifests as written into the image: UTF-8 JSON, indented for ``show``."""
    return json.dumps(data, indent=2, ensure_ascii=False) + "\n"


def _relative(path: str, root: str) -> str:
    """``/var/holoscan/input`` under ``/var/holoscan`` -> ``input/`` (the spec's relative form)."""
    prefix = root.rstrip("/") + "/"
    return path[len(prefix) :].rstrip("/") + "/" if path.startswith(prefix) else path
