"""A 1 Gbit/s link made for the benchmark: a network namespace whose loopback is shaped with ``tbf``.

This kernel has the ``tbf`` queueing discipline but not ``netem``. A namespace of our own keeps the host's
loopback (and everyone else's traffic on it) untouched; its own loopback (127.0.0.1 only) carries
``tc qdisc add dev lo root tbf rate 1gbit burst 256kb latency 50ms``, and a server and a client started
inside it talk through the shaped link. The namespace is removed on the way out, whatever happened.
"""

from __future__ import annotations

import os
import secrets
import shutil
import subprocess
from types import TracebackType

SHAPE = ("tbf", "rate", "1gbit", "burst", "256kb", "latency", "50ms")
IP = shutil.which("ip") or "/usr/sbin/ip"
_TIMEOUT_S = 30


class ShapedLink:
    """``with ShapedLink() as link: subprocess.Popen(link.wrap(argv))`` runs ``argv`` behind the shaped loopback."""

    def __init__(self) -> None:
        self.name = f"mto-bench-{os.getpid()}-{secrets.token_hex(2)}"
        self._made = False

    def __enter__(self) -> ShapedLink:
        _ip("netns", "add", self.name)
        self._made = True
        try:
            _ip("netns", "exec", self.name, "ip", "link", "set", "lo", "up")
            _ip("netns", "exec", self.name, "tc", "qdisc", "add", "dev", "lo", "root", *SHAPE)
        except BaseException:
            self.remove()
            raise
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.remove()

    def wrap(self, argv: list[str]) -> list[str]:
        """``argv`` run inside the namespace (environment and working folder kept)."""
        return [IP, "netns", "exec", self.name, *argv]

    def describe(self) -> str:
        shown = subprocess.run(
            self.wrap(["tc", "qdisc", "show", "dev", "lo"]), capture_output=True, text=True, timeout=_TIMEOUT_S
        )
        return shown.stdout.strip()

    def remove(self) -> None:
        if self._made:
            self._made = False
            subprocess.run([IP, "netns", "del", self.name], capture_output=True, timeout=_TIMEOUT_S, check=False)


def _ip(*argv: str) -> None:
    done = subprocess.run([IP, *argv], capture_output=True, text=True, timeout=_TIMEOUT_S, check=False)
    if done.returncode != 0:
        raise RuntimeError(f"ip {' '.join(argv)}: {done.stderr.strip()} (the benchmark needs root for a namespace)")
