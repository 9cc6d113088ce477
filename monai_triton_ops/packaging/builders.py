"""The image builders: Docker with buildx where a daemon runs, otherwise buildah (no daemon, as root).

Both build the same context with the same Containerfile; they differ in how the build reaches the host:

=================  ==================================  ==========================================
                   docker buildx                        buildah
=================  ==================================  ==========================================
secrets            ``--secret id=...,src=...``          the same
host folders       not possible (pip settings that      ``--volume PATH:PATH:ro`` for ``RUN`` only
                   name them are left out)
layer cache        BuildKit's own                       ``--layers`` (containers-storage)
a local rootfs     ``docker import TAR REF``            ``buildah from scratch`` + ``add`` + ``commit``
=================  ==================================  ==========================================
"""

from __future__ import annotations

import contextlib
import json
import logging
import shutil
from abc import ABC, abstractmethod
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from ..errors import PackagingError, UsageError
from .programs import BUILDAH, ensure_programs, run

logger = logging.getLogger(__name__)

BUILD_TIMEOUT_S = 3600.0
QUERY_TIMEOUT_S = 60.0
IMPORT_TIMEOUT_S = 600.0
CHOICES = ("auto", "docker", "buildah")


class Builder(ABC):
    """One way to turn a build context into a local image."""

    name: str
    mounts_host_paths: bool
    """Whether ``RUN`` steps can see host folders (``volumes`` of :meth:`build`)."""

    @abstractmethod
    def build(
        self,
        context: Path,
        tag: str,
        *,
        secrets: Mapping[str, Path],
        volumes: Sequence[tuple[Path, str]] = (),
        timeout_s: float = BUILD_TIMEOUT_S,
        quiet: bool = False,
    ) -> None:
        """Build ``context/Dockerfile`` as ``tag``; ``volumes`` are ``(host path, path inside)``, read-only."""

    @abstractmethod
    def image_exists(self, ref: str) -> bool:
        """Whether the local store holds ``ref``."""

    @abstractmethod
    def import_rootfs(self, tarball: Path, ref: str) -> None:
        """Make an image ``ref`` whose only layer is the root filesystem in ``tarball``."""

    @abstractmethod
    def inspect(self, ref: str) -> dict[str, Any]:
        """The image's config: ``Env`` (``K=V`` strings), ``Labels``, ``Entrypoint``, ``User``, ``WorkingDir``."""


class Buildah(Builder):
    """Daemonless builds as root (Debian's ``buildah`` with ``runc``)."""

    name = "buildah"
    mounts_host_paths = True

    def build(
        self,
        context: Path,
        tag: str,
        *,
        secrets: Mapping[str, Path],
        volumes: Sequence[tuple[Path, str]] = (),
        timeout_s: float = BUILD_TIMEOUT_S,
        quiet: bool = False,
    ) -> None:
        argv = [
            "buildah",
            "bud",
            "--layers",
            "--force-rm",
            "--network",
            "host",
            "-f",
            str(context / "Dockerfile"),
            "-t",
            tag,
        ]
        argv += [f"--secret=id={key},src={path}" for key, path in secrets.items()]
        argv += [f"--volume={host}:{inside}:ro" for host, inside in volumes]
        run([*argv, str(context)], timeout_s=timeout_s, what=f"buildah bud {tag}", capture=quiet)

    def image_exists(self, ref: str) -> bool:
        return _succeeds(["buildah", "inspect", "--type", "image", ref])

    def import_rootfs(self, tarball: Path, ref: str) -> None:
        container = run(["buildah", "from", "scratch"], timeout_s=QUERY_TIMEOUT_S, what="buildah from scratch").strip()
        try:
            run(["buildah", "add", container, str(tarball), "/"], timeout_s=IMPORT_TIMEOUT_S, what="buildah add rootfs")
            run(
                ["buildah", "config", "--cmd", "/bin/bash", container], timeout_s=QUERY_TIMEOUT_S, what="buildah config"
            )
            run(["buildah", "commit", "--rm", container, ref], timeout_s=IMPORT_TIMEOUT_S, what=f"buildah commit {ref}")
        except PackagingError:
            with contextlib.suppress(PackagingError):
                run(["buildah", "rm", container], timeout_s=QUERY_TIMEOUT_S, what="buildah rm")
            raise

    def inspect(self, ref: str) -> dict[str, Any]:
        text = run(["buildah", "inspect", "--type", "image", ref], timeout_s=QUERY_TIMEOUT_S, what=f"inspect {ref}")
        config: dict[str, Any] = json.loads(text).get("OCIv1", {}).get("config", {})
        return config


class Docker(Builder):
    """A Docker daemon with the buildx plugin (BuildKit)."""

    name = "docker"
    mounts_host_paths = False

    def build(
        self,
        context: Path,
        tag: str,
        *,
        secrets: Mapping[str, Path],
        volumes: Sequence[tuple[Path, str]] = (),
        timeout_s: float = BUILD_TIMEOUT_S,
        quiet: bool = False,
    ) -> None:
        if volumes:
            raise UsageError(f"docker builds cannot mount host folders: {[str(host) for host, _ in volumes]}")
        argv = ["docker", "buildx", "build", "--load", "-f", str(context / "Dockerfile"), "-t", tag]
        argv += [f"--secret=id={key},src={path}" for key, path in secrets.items()]
        run([*argv, str(context)], timeout_s=timeout_s, what=f"docker buildx build {tag}", capture=quiet)

    def image_exists(self, ref: str) -> bool:
        return _succeeds(["docker", "image", "inspect", ref])

    def import_rootfs(self, tarball: Path, ref: str) -> None:
        run(["docker", "import", "--change", "CMD [\"/bin/bash\"]", str(tarball), ref],
            timeout_s=IMPORT_TIMEOUT_S, what=f"docker import {ref}")  # fmt: skip

    def inspect(self, ref: str) -> dict[str, Any]:
        text = run(["docker", "image", "inspect", ref], timeout_s=QUERY_TIMEOUT_S, what=f"inspect {ref}")
        config: dict[str, Any] = json.loads(text)[0].get("Config", {})
        return config


def choose_builder(name: str = "auto") -> Builder:
    """``docker`` (a daemon and buildx answer), ``buildah`` (installed when missing), or ``auto``: docker if usable."""
    if name not in CHOICES:
        raise UsageError(f"unknown builder {name!r}; choose one of {', '.join(CHOICES)}")
    if name == "docker" or (name == "auto" and docker_usable()):
        if not docker_usable():
            raise PackagingError("docker: no daemon answers, or the buildx plugin is missing (`docker buildx version`)")
        return Docker()
    ensure_programs(BUILDAH, why="building the MAP without a Docker daemon")
    return Buildah()


def docker_usable() -> bool:
    """A docker client whose daemon answers and which has buildx."""
    if shutil.which("docker") is None:
        return False
    return _succeeds(["docker", "info", "--format", "{{.ServerVersion}}"]) and _succeeds(
        ["docker", "buildx", "version"]
    )


def _succeeds(argv: Sequence[str]) -> bool:
    try:
        run(argv, timeout_s=QUERY_TIMEOUT_S, what=argv[0])
    except PackagingError:
        return False
    return True
