"""How pip inside the image build reaches the same packages as pip here, without baking anything in.

pip in the build runs in a fresh root filesystem: it knows neither this machine's pip configuration
(extra indexes, ``find-links`` folders with local wheels, constraint files) nor the certificate authority
this machine's TLS traffic is verified with. Both are handed to the build for its ``RUN`` steps only:

- the effective pip settings (``pip config list``: files and ``PIP_*`` variables) become a ``pip.conf``
  passed as a build secret (``pip-conf``), with the certificate left out;
- the CA bundle pip uses here is passed as the ``host-ca`` secret (``PIP_CERT`` inside the build);
- local folders and files those settings name (``/opt/wheels``, ``file:///...`` indexes, constraint files)
  are mounted read-only (buildah ``--volume``) below ``/run/monai-triton-host/``, and the ``pip.conf`` names
  them there (for an index ``<root>/simple``, all of ``<root>``, where the PEP 503 pages' relative links lead);
  a docker build cannot mount host folders, so for docker those settings are left out and said so.

Secrets and volumes exist only while a ``RUN`` step runs: nothing of this machine lands in the image.
"""

from __future__ import annotations

import configparser
import io
import logging
import os
import ssl
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

logger = logging.getLogger(__name__)

#: pip settings forwarded to the build; lists are space-separated.
FORWARDED = (
    "index-url",
    "extra-index-url",
    "find-links",
    "constraint",
    "trusted-host",
    "default-timeout",
    "timeout",
    "retries",
    "no-index",
    "prefer-binary",
)
_LIST_KEYS = {"extra-index-url", "find-links", "constraint", "trusted-host"}
_PATH_KEYS = {"index-url", "extra-index-url", "find-links", "constraint"}
_CONFIG_TIMEOUT_S = 60.0
#: Where host folders appear inside the build (``<n>-<name>``): no path of this machine is created in the image;
#: only the empty mount points below this folder remain in the layer of the step that used them.
MOUNT_ROOT = "/run/monai-triton-host"


@dataclass(frozen=True, kw_only=True)
class HostPip:
    """What the build gets from this machine's pip."""

    settings: dict[str, str]
    """Forwarded settings, already filtered for the builder."""
    volumes: tuple[tuple[Path, str], ...]
    """``(host path, path inside the build)`` to mount read-only (``settings`` name the inside paths)."""
    cert: Path | None
    """The CA bundle pip verifies TLS with here."""
    dropped: tuple[str, ...] = ()
    """Settings left out because the builder cannot mount host paths."""

    def pip_conf(self) -> str:
        """The settings as a ``pip.conf`` (``[global]``)."""
        parser = configparser.ConfigParser(interpolation=None)
        parser["global"] = dict(self.settings)
        out = io.StringIO()
        parser.write(out)
        return out.getvalue()


def read_host_pip(*, mounts_allowed: bool) -> HostPip:
    """This interpreter's effective pip settings, ready for a build that can (or cannot) mount host paths."""
    raw = _pip_config()
    settings: dict[str, str] = {}
    volumes: dict[Path, str] = {}
    dropped: list[str] = []
    for key, value in raw.items():
        if key not in FORWARDED:
            continue
        if key not in _PATH_KEYS:
            settings[key] = value
            continue
        kept: list[str] = []
        for item in value.split() if key in _LIST_KEYS else [value]:
            local = _local_path(item)
            if local is None:
                kept.append(item)
            elif not local.exists():
                logger.info("pip setting %s=%s: %s does not exist here, left out of the build", key, item, local)
            elif mounts_allowed:
                root = _mount_root(key, local)
                inside = volumes.setdefault(root, f"{MOUNT_ROOT}/{len(volumes)}-{root.name}")
                kept.append(item.replace(str(root), inside, 1))
            else:
                dropped.append(f"{key}={item}")
        if kept:
            settings[key] = " ".join(kept)
    return HostPip(settings=settings, volumes=tuple(volumes.items()), cert=_cert(raw), dropped=tuple(dropped))


def _pip_config() -> dict[str, str]:
    """``pip config list`` as ``key -> value``: ``PIP_*`` variables over ``install.`` over ``global.`` entries."""
    try:
        result = subprocess.run(
            [sys.executable, "-m", "pip", "config", "list"],
            capture_output=True,
            text=True,
            timeout=_CONFIG_TIMEOUT_S,
            check=False,
        )
    except (OSError, subprocess.TimeoutExpired) as exc:
        logger.warning("pip config list failed (%s): the build uses pip's defaults", exc)
        return {}
    ranked: dict[str, tuple[int, str]] = {}
    rank = {"global": 0, "install": 1, ":env:": 2}
    for line in result.stdout.splitlines():
        section_key, sep, value = line.partition("=")
        section, _, key = section_key.rpartition(".")
        if not sep or section not in rank:
            continue
        value = value.strip().strip("'\"")
        if key not in ranked or rank[section] >= ranked[key][0]:
            ranked[key] = (rank[section], value)
    return {key: value for key, (_, value) in ranked.items()}


def _local_path(item: str) -> Path | None:
    if item.startswith("file://"):
        return Path(item[len("file://") :])
    if item.startswith("/"):
        return Path(item)
    return None


def _mount_root(key: str, local: Path) -> Path:
    """A local index ``<root>/simple`` links its files relatively (``../../files/...``): mount ``<root>``."""
    return local.parent if key.endswith("index-url") and local.name == "simple" else local


def _cert(raw: dict[str, str]) -> Path | None:
    """pip's ``cert`` setting, else ``PIP_CERT``/``REQUESTS_CA_BUNDLE``/``SSL_CERT_FILE``, else OpenSSL's default."""
    for candidate in (
        raw.get("cert"),
        os.environ.get("PIP_CERT"),
        os.environ.get("REQUESTS_CA_BUNDLE"),
        os.environ.get("SSL_CERT_FILE"),
        ssl.get_default_verify_paths().cafile,
        "/etc/ssl/certs/ca-certificates.crt",
    ):
        if candidate and Path(candidate).is_file():
            return Path(candidate)
    return None
