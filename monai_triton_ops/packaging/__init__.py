"""MONAI Application Packages (MAPs): a build context in holoscan-cli 4.2.0's layout, built into one OCI image.

``monai-triton package APP -m MODELS`` is :func:`package_app`::

    app.yaml  --appconfig-->  manifests (app.json, pkg.json, env, labels)  --context-->  <context>/ (Dockerfile, ...)
    builder: docker buildx if a daemon answers, else buildah (installed when missing)  --builders-->  the image
    base image: the one named, else Debian 12 made here with mmdebstrap and cached  --rootfs-->

One image serves every backend: which one runs is the environment's choice (``MONAI_TRITON_BACKEND``,
``TRITON_SERVER_NETLOC``, ``HOLOSCAN_*``), with the defaults of ``app.yaml``. See ``docs/packaging.md``.
"""

from __future__ import annotations

import logging
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

from .builders import choose_builder
from .context import BuildContext, PackageRequest, write_context
from .hostpip import read_host_pip
from .rootfs import RootfsSpec, ensure_base_image, host_mirror

__all__ = ["BuildContext", "PackageRequest", "PackageResult", "package_app"]

logger = logging.getLogger(__name__)


@dataclass(frozen=True, kw_only=True)
class PackageResult:
    """The context written and, if built, the image."""

    context: BuildContext
    base_image: str
    builder: str | None
    """``"buildah"`` or ``"docker"``; ``None`` when only the context was written."""
    build_s: float | None = None


def package_app(
    request: PackageRequest,
    *,
    builder: str = "auto",
    base_image: str | None = None,
    build: bool = True,
    quiet: bool = False,
) -> PackageResult:
    """Write the build context and (unless ``build=False``) build it into the image ``context.tag``."""
    if not build:
        base = base_image or RootfsSpec(mirror=host_mirror()).image_ref
        return PackageResult(context=write_context(request, base_image=base), base_image=base, builder=None)
    chosen = choose_builder(builder)
    base = base_image or ensure_base_image(chosen)
    context = write_context(request, base_image=base)
    host_pip = read_host_pip(mounts_allowed=chosen.mounts_host_paths)
    if host_pip.dropped:
        logger.warning("a %s build cannot see host folders; pip settings left out: %s", chosen.name, host_pip.dropped)
    started = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="monai-triton-build-") as scratch:
        pip_conf = Path(scratch) / "pip.conf"
        pip_conf.write_text(host_pip.pip_conf())
        secrets = {"pip-conf": pip_conf, **({"host-ca": host_pip.cert} if host_pip.cert else {})}
        chosen.build(context.path, context.tag, secrets=secrets, volumes=host_pip.volumes, quiet=quiet)
    elapsed = time.perf_counter() - started
    logger.info("built %s with %s in %.0f s", context.tag, chosen.name, elapsed)
    return PackageResult(context=context, base_image=base, builder=chosen.name, build_s=elapsed)
