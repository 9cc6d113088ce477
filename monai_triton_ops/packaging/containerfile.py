"""The MAP's Containerfile (named ``Dockerfile``, as holoscan-cli 4.2.0 names it; buildah and docker both read it).

Steps are ordered from the least to the most often changed, so that a rebuild after an app or code change
reuses the layers with the system packages and the third-party Python packages (minutes) and redoes only
the last, small ones::

    system packages (only what the base lacks) -> app user and MAP folders -> third-party packages
    -> Triton server files -> this project's wheel -> models -> manifests, app.yaml, app, tools -> env, labels

Everything the build borrows from the host (the CA bundle, pip's settings) is a build secret, present while one
``RUN`` step runs and never in a layer.
"""

from __future__ import annotations

import json
import shlex
from collections.abc import Mapping
from dataclasses import dataclass

from .manifests import LAYOUT, MapLayout

#: System packages the app needs from any Debian/Ubuntu base; the interpreter's libpythonX.Y is added by version.
SYSTEM_PACKAGES = ("python3", "python3-venv", "ca-certificates", "passwd")
USER = "holoscan"
#: The loader's search path gets the CUDA runtime wheel's folder (ldconfig), for every process in the image.
LD_CONF = "/etc/ld.so.conf.d/monai-triton-ops-cuda.conf"
PIP_DIR = "/tmp/monai-triton-pip"  # noqa: S108 - inside the image build, removed by the step that uses it
_SECRETS = (
    "--mount=type=secret,id=host-ca,target=/run/secrets/host-ca "
    "--mount=type=secret,id=pip-conf,target=/run/secrets/pip-conf"
)


@dataclass(frozen=True, kw_only=True)
class ContainerSpec:
    """What the Containerfile needs to know; everything else is in the context it sits in."""

    base_image: str
    environment: Mapping[str, str]
    labels: Mapping[str, str]
    wheel_name: str
    server_files: str | None
    """``nvidia-pytriton`` (installed with ``--no-deps``), or ``None`` for an image without Triton's server."""
    uid: int = 1000
    gid: int = 1000
    has_docs: bool = False
    layout: MapLayout = LAYOUT


def render(spec: ContainerSpec) -> str:
    """The whole Containerfile."""
    parts = [_header(spec), _system(spec), _user(spec), _python(spec), _files(spec), _runtime(spec)]
    return "\n".join(parts)


def _header(spec: ContainerSpec) -> str:
    return f"""\
# A MONAI Application Package, written by `monai-triton package` (monai-triton-ops). Layout and manifests follow
# holoscan-cli 4.2.0's packager, with the MAP spec's fixes (docs/packaging.md). Built by that command; by hand:
#   buildah bud --layers --secret id=host-ca,src=/etc/ssl/certs/ca-certificates.crt -t IMAGE:TAG .
#   docker buildx build --load --secret id=host-ca,src=/etc/ssl/certs/ca-certificates.crt -t IMAGE:TAG .
FROM {spec.base_image}

ARG DEBIAN_FRONTEND=noninteractive
"""


def _system(spec: ContainerSpec) -> str:
    packages = " ".join(SYSTEM_PACKAGES)
    return f"""\
# System packages the app needs, installed only where the base image lacks them; then the interpreter's
# shared library, which Triton's Python-backend stub links.
RUN set -eu; \\
    missing=""; for p in {packages}; do dpkg -s "$p" >/dev/null 2>&1 || missing="$missing $p"; done; \\
    if [ -n "$missing" ]; then apt-get update && apt-get install -y --no-install-recommends $missing; fi; \\
    v=$(python3 -c 'import sys; print("%d.%d" % sys.version_info[:2])'); \\
    if ! ldconfig -p | grep -q "libpython$v.so.1.0"; then \\
        apt-get update && apt-get install -y --no-install-recommends "libpython$v"; fi; \\
    ldconfig -p | grep -q "libpython$v.so.1.0"; \\
    rm -rf /var/lib/apt/lists/*
"""


def _user(spec: ContainerSpec) -> str:
    layout = spec.layout
    owned = " ".join(shlex.quote(p) for p in (layout.work_dir, layout.input_dir, layout.output_dir, layout.logs_dir))
    folders = " ".join(
        shlex.quote(p) for p in ("/etc/holoscan", layout.app_dir, layout.models_dir, layout.docs_dir, layout.export_dir)
    )
    return f"""\
# The app runs as {USER} (uid {spec.uid}); a base image's own user with that uid (ubuntu) gives way.
RUN set -eu; \\
    other=$(getent passwd {spec.uid} | cut -d: -f1 || true); \\
    if [ -n "$other" ] && [ "$other" != {USER} ]; then userdel -r "$other" 2>/dev/null || userdel "$other"; fi; \\
    getent group {spec.gid} >/dev/null || groupadd -g {spec.gid} {USER}; \\
    id -u {USER} >/dev/null 2>&1 || useradd -m -u {spec.uid} -g {spec.gid} -s /bin/bash {USER}; \\
    mkdir -p {folders} {owned}; \\
    chown {spec.uid}:{spec.gid} {owned}
"""


def _python(spec: ContainerSpec) -> str:
    venv = spec.layout.venv
    pip = f"{venv}/bin/pip install --disable-pip-version-check -c {PIP_DIR}/constraints.txt"
    server = (
        f"    {pip} --no-deps {spec.server_files}; \\\n"
        if spec.server_files
        else "    : no Triton server files in this image; \\\n"
    )
    return f"""\
# Third-party packages at the versions of the environment that packaged the app (pip/constraints.txt).
# pip reads this machine's settings and CA bundle from build secrets; nothing of them stays in the image.
COPY pip/requirements.txt pip/constraints.txt {PIP_DIR}/
RUN {_SECRETS} \\
    set -eu; \\
    if [ -s /run/secrets/pip-conf ]; then export PIP_CONFIG_FILE=/run/secrets/pip-conf; fi; \\
    if [ -s /run/secrets/host-ca ]; then export PIP_CERT=/run/secrets/host-ca; fi; \\
    export PIP_NO_INPUT=1 PIP_NO_CACHE_DIR=1; \\
    python3 -m venv {venv}; \\
    {pip} -r {PIP_DIR}/requirements.txt; \\
{server}    true

# This project, from the wheel built from the checkout; the CUDA runtime it depends on goes on the loader's path.
COPY pip/{spec.wheel_name} {PIP_DIR}/
RUN set -eu; \\
    {venv}/bin/pip install --disable-pip-version-check --no-deps --no-index {PIP_DIR}/{spec.wheel_name}; \\
    {venv}/bin/python -m monai_triton_ops.packaging.runtime_libs --lib-dir > {LD_CONF}; \\
    ldconfig; \\
    rm -rf {PIP_DIR}
"""


def _files(spec: ContainerSpec) -> str:
    layout = spec.layout
    docs = f"COPY docs {layout.docs_dir}\n" if spec.has_docs else ""
    return f"""\
COPY models {layout.models_dir}
{docs}COPY map/app.json {layout.app_json}
COPY map/pkg.json {layout.pkg_json}
COPY app.config {layout.config_path}
COPY app {layout.app_dir}
COPY tools {layout.tools_path}
"""


def _runtime(spec: ContainerSpec) -> str:
    layout = spec.layout
    # One ENV and one LABEL instruction: each instruction is a layer commit in a --layers build.
    env_lines = "ENV " + " \\\n    ".join(
        [f"PATH={layout.venv}/bin:$PATH", *(f"{name}={_quote(value)}" for name, value in spec.environment.items())]
    )
    label_lines = "LABEL " + " \\\n      ".join(
        f"{_quote(name)}={_quote(value)}" for name, value in spec.labels.items()
    )
    return f"""\
# The MAP's HOLOSCAN_* variables. app.yaml's environment: defaults (in app.json#environment too) are applied
# by the app at start from HOLOSCAN_CONFIG_PATH, so that a variable given at run time is told apart from them.
{env_lines}
WORKDIR {layout.work_dir}
USER {USER}
{label_lines}
ENTRYPOINT [{json.dumps(layout.tools_path)}]
"""


def _quote(value: str) -> str:
    """A double-quoted Containerfile word (JSON escaping is what both builders accept)."""
    return json.dumps(value)
