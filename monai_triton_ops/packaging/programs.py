"""The host programs packaging needs (buildah, runc, mmdebstrap), installed from Debian's packages when missing.

Only as root on a machine with ``apt-get``; anywhere else a missing program is one ``PackagingError`` that
names the command to run. Every command here runs with a deadline, and a failure carries its output's tail.
"""

from __future__ import annotations

import logging
import os
import shutil
import subprocess
from collections.abc import Mapping, Sequence

from ..errors import PackagingError

logger = logging.getLogger(__name__)

#: Program -> the Debian package that provides it. ``runc`` is only a "Recommends" of buildah, and without
#: it every ``RUN`` step fails (``did not get container create message from subprocess: EOF``).
BUILDAH = {"buildah": "buildah", "runc": "runc"}
MMDEBSTRAP = {"mmdebstrap": "mmdebstrap"}
APT_TIMEOUT_S = 900.0
_TAIL = 3000


def ensure_programs(programs: Mapping[str, str], *, why: str) -> None:
    """Install the Debian packages of the missing ``programs`` (as root, with apt-get), or say how to."""
    missing = sorted({package for program, package in programs.items() if shutil.which(program) is None})
    if not missing:
        return
    command = f"apt-get install --no-install-recommends {' '.join(missing)}"
    if os.geteuid() != 0 or shutil.which("apt-get") is None:
        raise PackagingError(f"{why} needs {', '.join(missing)}, which are not installed; run as root: {command}")
    logger.warning("installing %s from Debian's packages (%s)", ", ".join(missing), why)
    env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
    run(["apt-get", "update", "-qq"], timeout_s=APT_TIMEOUT_S, what="apt-get update", env=env)
    run(["apt-get", "install", "-y", "-qq", "--no-install-recommends", *missing],
        timeout_s=APT_TIMEOUT_S, what=command, env=env)  # fmt: skip


def run(
    argv: Sequence[str],
    *,
    timeout_s: float,
    what: str,
    env: Mapping[str, str] | None = None,
    capture: bool = True,
) -> str:
    """Run ``argv`` to completion within ``timeout_s``; its stdout, or a ``PackagingError`` with the output's tail.

    With ``capture=False`` the output goes to this process's own stdout/stderr (a long build the user watches).
    """
    logger.debug("running: %s", " ".join(argv))
    executable = shutil.which(argv[0]) or argv[0]
    try:
        result = subprocess.run(
            [executable, *argv[1:]],
            capture_output=capture,
            text=True,
            timeout=timeout_s,
            env=dict(env) if env is not None else None,
            check=False,
        )
    except subprocess.TimeoutExpired as exc:
        raise PackagingError(f"{what}: no result within {timeout_s:g} s{_tail(exc.stdout, exc.stderr)}") from exc
    except OSError as exc:
        raise PackagingError(f"{what}: cannot run {argv[0]!r}: {exc.strerror or exc}") from exc
    if result.returncode != 0:
        raise PackagingError(f"{what} failed with exit code {result.returncode}{_tail(result.stdout, result.stderr)}")
    return result.stdout or ""


def _tail(stdout: str | bytes | None, stderr: str | bytes | None) -> str:
    text = "".join(s.decode(errors="replace") if isinstance(s, bytes) else s for s in (stdout, stderr) if s)
    return f"\n--- output tail ---\n{text[-_TAIL:]}" if text.strip() else ""
