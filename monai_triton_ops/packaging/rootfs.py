"""A base image made here from Debian 12 packages (``mmdebstrap``), for machines that reach no container registry.

What the image needs from the system is declared here, not found by luck:

- ``python3`` and ``python3-venv``: the app's interpreter and the venv its packages go into;
- ``libpython3.11``: the interpreter's shared library, which Triton's Python-backend stub links (Debian's
  ``python3`` does not bring it; without it the ``triton`` backend's stub cannot start);
- ``ca-certificates``, and ``passwd`` for the app's user.

The CUDA 13 runtime that Holoscan loads comes from pip (``nvidia-cuda-runtime``, a dependency of this project).

Cache, so that only the first build pays for the root filesystem (about 2 minutes): the tarball is kept in
``$MONAI_TRITON_CACHE`` (default ``$XDG_CACHE_HOME/monai-triton``, i.e. ``~/.cache/monai-triton``) under
``rootfs/``, and imported once into the builder's own store as ``localhost/monai-triton-base:<suite>-<key>``;
the key is a hash of everything that decides the contents (suite, packages, mirrors, options).
"""

from __future__ import annotations

import hashlib
import logging
import os
import re
import tempfile
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

from .builders import Builder
from .programs import MMDEBSTRAP, ensure_programs, run

logger = logging.getLogger(__name__)

SUITE = "bookworm"
PACKAGES = ("python3", "python3-venv", "libpython3.11", "ca-certificates", "passwd")
#: Documentation, manual pages and translations are left out (copyright files stay).
DPKG_OPTIONS = (
    "path-exclude=/usr/share/doc/*",
    "path-include=/usr/share/doc/*/copyright",
    "path-exclude=/usr/share/man/*",
    "path-exclude=/usr/share/locale/*",
    "path-exclude=/usr/share/info/*",
)
DEFAULT_MIRROR = "http://deb.debian.org/debian"
DEFAULT_SECURITY_MIRROR = "http://deb.debian.org/debian-security"
IMAGE_NAME = "localhost/monai-triton-base"
MMDEBSTRAP_TIMEOUT_S = 1800.0
CACHE_ENV = "MONAI_TRITON_CACHE"


@dataclass(frozen=True, kw_only=True)
class RootfsSpec:
    """Everything that decides the root filesystem's contents."""

    suite: str = SUITE
    packages: tuple[str, ...] = PACKAGES
    mirror: str = DEFAULT_MIRROR
    security_mirror: str = DEFAULT_SECURITY_MIRROR
    dpkg_options: tuple[str, ...] = field(default=DPKG_OPTIONS)

    @property
    def sources(self) -> list[str]:
        return [
            f"deb {self.mirror} {self.suite} main",
            f"deb {self.mirror} {self.suite}-updates main",
            f"deb {self.security_mirror} {self.suite}-security main",
        ]

    @property
    def key(self) -> str:
        text = "\n".join([self.suite, *self.packages, *self.sources, *self.dpkg_options])
        return hashlib.sha256(text.encode()).hexdigest()[:12]

    @property
    def image_ref(self) -> str:
        return f"{IMAGE_NAME}:{self.suite}-{self.key}"


def cache_dir() -> Path:
    """``$MONAI_TRITON_CACHE``, else ``$XDG_CACHE_HOME/monai-triton``, else ``~/.cache/monai-triton``."""
    if os.environ.get(CACHE_ENV):
        return Path(os.environ[CACHE_ENV]).expanduser()
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "monai-triton"


def host_mirror(suite: str = SUITE, sources_dirs: Sequence[Path] = (Path("/etc/apt"),)) -> str:
    """The Debian mirror this machine's apt uses for ``suite`` (a local mirror or proxy is kept), or deb.debian.org."""
    for root in sources_dirs:
        files = [root / "sources.list", *sorted((root / "sources.list.d").glob("*"))] if root.is_dir() else []
        for path in files:
            try:
                text = path.read_text(encoding="utf-8", errors="replace")
            except OSError:
                continue
            mirror = _mirror_in(text, suite)
            if mirror:
                return mirror
    return DEFAULT_MIRROR


def _mirror_in(text: str, suite: str) -> str | None:
    """The first ``.../debian`` URI serving ``suite`` in a one-line or deb822 sources file."""
    for line in text.splitlines():
        parts = line.split("#", 1)[0].split()
        if len(parts) >= 3 and parts[0] == "deb" and parts[-2 if parts[1].startswith("[") else 2] == suite:
            uri = next(p for p in parts[1:] if not p.startswith("["))
            if uri.rstrip("/").endswith("/debian"):
                return uri.rstrip("/")
    for stanza in re.split(r"\n\s*\n", text):
        fields: dict[str, str] = dict(re.findall(r"^([A-Za-z-]+):\s*(.*)$", stanza, flags=re.MULTILINE))
        if suite in fields.get("Suites", "").split():
            for uri in fields.get("URIs", "").split():
                if uri.rstrip("/").endswith("/debian"):
                    return uri.rstrip("/")
    return None


def ensure_base_image(builder: Builder, spec: RootfsSpec | None = None) -> str:
    """The base image's reference: from the builder's store, the cached tarball, or a fresh ``mmdebstrap`` run."""
    spec = spec or RootfsSpec(mirror=host_mirror())
    if builder.image_exists(spec.image_ref):
        logger.info("base image %s is cached", spec.image_ref)
        return spec.image_ref
    tarball = ensure_rootfs_tarball(spec)
    logger.warning("importing %s as %s", tarball, spec.image_ref)
    builder.import_rootfs(tarball, spec.image_ref)
    return spec.image_ref


def ensure_rootfs_tarball(spec: RootfsSpec) -> Path:
    """``<cache>/rootfs/<suite>-<key>.tar``, made with ``mmdebstrap`` if absent (written aside, then renamed)."""
    folder = cache_dir() / "rootfs"
    tarball = folder / f"{spec.suite}-{spec.key}.tar"
    if tarball.is_file():
        return tarball
    ensure_programs(MMDEBSTRAP, why="making a Debian base image without a registry")
    folder.mkdir(parents=True, exist_ok=True)
    logger.warning("making the Debian %s root filesystem with mmdebstrap (about 2 minutes, once)", spec.suite)
    with tempfile.TemporaryDirectory(dir=folder, prefix=".partial-") as scratch:
        partial = Path(scratch) / tarball.name
        argv = ["mmdebstrap", "--variant=apt", f"--include={','.join(spec.packages)}"]
        argv += [f"--dpkgopt={option}" for option in spec.dpkg_options]
        run([*argv, spec.suite, str(partial), *spec.sources], timeout_s=MMDEBSTRAP_TIMEOUT_S, what="mmdebstrap")
        partial.replace(tarball)
    return tarball
