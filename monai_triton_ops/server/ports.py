"""Loopback ports: pick free ones, check a given one before launch."""

from __future__ import annotations

import contextlib
import errno
import socket

#: The only address the local server listens on.
LOOPBACK = "127.0.0.1"


def pick_free_ports(count: int, *, exclude: tuple[int, ...] = ()) -> list[int]:
    """``count`` distinct ports the kernel reports free on loopback now (they stay free only until someone binds).

    All sockets are held open together so the ports differ from each other and from ``exclude``.
    """
    ports: list[int] = []
    with contextlib.ExitStack() as stack:
        while len(ports) < count:
            sock = stack.enter_context(socket.socket(socket.AF_INET, socket.SOCK_STREAM))
            sock.bind((LOOPBACK, 0))
            port = sock.getsockname()[1]
            if port not in exclude:
                ports.append(port)
    return ports


def port_is_free(port: int) -> bool:
    """Whether a listener could bind ``127.0.0.1:port`` now.

    ``SO_REUSEADDR`` is set as servers set it, so a port held only by ``TIME_WAIT`` connections counts as
    free, while one with a listener (on loopback or on all addresses) does not.
    """
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind((LOOPBACK, port))
        except OSError as exc:
            if exc.errno in (errno.EADDRINUSE, errno.EACCES):
                return False
            raise
    return True
