"""The MAP/HAP spec's requirements, written down from the spec (not from our code) for the tests to check against.

Sources: Project-MONAI/monai-deploy ``guidelines/monai-application-package.md`` and nvidia-holoscan/holoscan-sdk
``docs/cli/hap.md``. Names the spec's tables spell differently from holoscan-cli 4.2.0 follow the packager
(``HOLOSCAN_DOCS_PATH``, ``HOLOSCAN_LOGS_PATH``), as ``docs/packaging.md`` says.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import yaml

#: The spec's table of environment variables with their defaults (the paths of the table of important paths).
ENVIRONMENT = {
    "HOLOSCAN_INPUT_PATH": "/var/holoscan/input",
    "HOLOSCAN_OUTPUT_PATH": "/var/holoscan/output",
    "HOLOSCAN_WORKDIR": "/var/holoscan",
    "HOLOSCAN_MODEL_PATH": "/opt/holoscan/models",
    "HOLOSCAN_CONFIG_PATH": "/var/holoscan/app.yaml",
    "HOLOSCAN_APP_MANIFEST_PATH": "/etc/holoscan/app.json",
    "HOLOSCAN_PKG_MANIFEST_PATH": "/etc/holoscan/pkg.json",
    "HOLOSCAN_DOCS_PATH": "/opt/holoscan/docs",
    "HOLOSCAN_LOGS_PATH": "/var/holoscan/logs",
}
#: Files and folders every MAP has, by the table of important paths.
PATHS = ("/etc/holoscan/app.json", "/etc/holoscan/pkg.json", "/opt/holoscan/app", "/opt/holoscan/models",
         "/var/holoscan", "/var/holoscan/input", "/var/holoscan/output", "/var/holoscan/app.yaml")  # fmt: skip
SEMVER = re.compile(r"^\d+\.\d+\.\d+([-+][0-9A-Za-z.+-]+)?$")
SIZE = re.compile(r"^\d+(\.\d+)?(Mi|Gi)$")


def app_yaml(path: Path) -> dict[str, Any]:
    data: dict[str, Any] = yaml.safe_load(path.read_text())
    return data


def check_app_manifest(app: dict[str, Any], config: dict[str, Any]) -> None:
    """``/etc/holoscan/app.json`` against the spec and the app's ``app.yaml``."""
    application = config["application"]
    assert app["type"] in ("service", "application")  # MUST; holoscan-cli 4.2.0 leaves it out
    command = json.loads(app["command"]) if app["command"].lstrip().startswith("[") else app["command"].split()
    assert command
    assert all(isinstance(word, str) for word in command)
    assert isinstance(app["input"]["formats"], list)
    assert app["input"]["formats"] == application["inputFormats"]  # 4.2.0 writes null
    assert app["output"]["formats"] == application["outputFormats"]
    assert SEMVER.match(app["apiVersion"])
    assert SEMVER.match(app["sdkVersion"])
    assert app["version"] == application["version"]
    assert app["workingDirectory"].startswith("/")
    assert isinstance(app["timeout"], int)
    assert app["timeout"] >= 0
    for name, default in ENVIRONMENT.items():
        assert app["environment"][name].rstrip("/") == default, name
    for name, default in application.get("environment", {}).items():  # 4.2.0 drops these
        assert app["environment"][name] == str(default), name
    assert all(isinstance(v, str) for v in app["environment"].values())


def check_package_manifest(pkg: dict[str, Any], config: dict[str, Any], model_names: list[str]) -> None:
    """``/etc/holoscan/pkg.json`` against the spec, the app's ``app.yaml`` and the models packaged."""
    assert pkg["applicationRoot"].rstrip("/") == "/opt/holoscan/app"
    assert pkg["modelRoot"].rstrip("/") == "/opt/holoscan/models"
    assert isinstance(pkg["models"], list)  # an array of {name, path}; 4.2.0 writes an object
    assert sorted(m["name"] for m in pkg["models"]) == sorted(model_names)
    for model in pkg["models"]:
        assert not re.search(r"\s", model["name"])
        assert len(model["name"].encode()) <= 128
        assert not model["path"].startswith("/")  # relative to modelRoot
    assert pkg["resources"] == config["resources"]
    for key in ("memory", "gpuMemory", "sharedMemory"):
        if key in pkg["resources"]:
            assert SIZE.match(pkg["resources"][key])
    assert pkg["version"] == config["application"]["version"]
    assert SEMVER.match(pkg["apiVersion"])


def check_labels(labels: dict[str, str], app: dict[str, Any], config: dict[str, Any]) -> None:
    """OCI title and version annotations; the version equal to ``app.json#version``."""
    assert labels["org.opencontainers.image.title"] == config["application"]["title"]
    assert labels["org.opencontainers.image.version"] == app["version"]
