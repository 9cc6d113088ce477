"""This project as a wheel for the image: built from the checkout it runs from, or one the user gives.

No package index has ``monai-triton-ops``, so the image cannot ``pip install`` it by name (what
holoscan-cli 4.2.0 would write into the requirements); the wheel built here goes into the build context.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import logging
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

from ..errors import ConfigError
from .programs import run

logger = logging.getLogger(__name__)

WHEEL_TIMEOUT_S = 600.0


def source_tree() -> Path | None:
    """The checkout this package was imported from (``pyproject.toml`` next to ``monai_triton_ops/``), if any."""
    root = Path(__file__).resolve().parents[2]
    pyproject = root / "pyproject.toml"
    if pyproject.is_file() and 'name = "monai-triton-ops"' in pyproject.read_text(encoding="utf-8"):
        return root
    return None


def project_wheel(dest: Path, wheel: Path | None = None) -> Path:
    """``wheel`` copied into ``dest``, or a wheel built there from :func:`source_tree`."""
    dest.mkdir(parents=True, exist_ok=True)
    if wheel is not None:
        if not wheel.is_file() or wheel.suffix != ".whl" or not wheel.name.startswith("monai_triton_ops-"):
            raise ConfigError(f"--wheel {str(wheel)!r} is not a monai_triton_ops-*.whl file")
        target = dest / wheel.name
        target.write_bytes(wheel.read_bytes())
        return target
    source = source_tree()
    if source is None:
        raise ConfigError(
            "monai-triton-ops is not running from a source checkout, so no wheel can be built for the image; "
            "pass --wheel with a monai_triton_ops-*.whl"
        )
    with _one_build_at_a_time(source), tempfile.TemporaryDirectory(prefix="monai-triton-wheel-") as scratch:
        logger.info("building the monai-triton-ops wheel from %s", source)
        run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--quiet", "-w", scratch, str(source)],
            timeout_s=WHEEL_TIMEOUT_S, what=f"pip wheel {source}")  # fmt: skip
        built = sorted(Path(scratch).glob("monai_triton_ops-*.whl"))
        if len(built) != 1:
            raise ConfigError(f"pip wheel {source} made {[p.name for p in built]}, not one monai_triton_ops wheel")
        target = dest / built[0].name
        target.write_bytes(built[0].read_bytes())
    return target


@contextlib.contextmanager
def _one_build_at_a_time(source: Path) -> Iterator[None]:
    """Hold a lock per checkout: setuptools builds in the checkout's own ``build/`` folder, so two packagers of one
    checkout at once fail with ``File exists: build/bdist...``; the second waits for the first instead."""
    key = hashlib.sha256(str(source).encode()).hexdigest()[:16]
    with open(Path(tempfile.gettempdir()) / f"monai-triton-wheel-{key}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        yield
