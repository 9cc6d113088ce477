"""The choice at open between a pool of shared memory slots and the request body (``shared_memory=``)."""

from __future__ import annotations

import logging
import time

from ....client.status import CallError
from ....client.transports.base import Transport
from ....errors import BackendUnavailableError, ConfigError
from ..protocol import SYSTEM_SHARED_MEMORY, ServerInfo
from .pool import RegionPool
from .region import PAGE, remove_stale_regions

logger = logging.getLogger(__name__)


def open_pool(
    transport: Transport | None,
    info: ServerInfo,
    *,
    mode: str,
    loopback: bool,
    max_in_flight: int,
    model: str,
    url: str,
    fleet: str,
) -> RegionPool | None:
    """How a backend's tensors travel, decided at open: a pool of slots registered on ``transport``, the fleet's
    one server (``info``: what it speaks), or ``None`` for the request body.

    ``mode`` is the ``shared_memory`` option: ``none`` never, ``auto`` when the server is on this host's loopback
    and lists Triton's ``system_shared_memory`` extension, ``system`` always (an error when it cannot work). A
    fleet of several servers (``transport`` ``None``; ``fleet`` names them) sends the body. A first region is
    registered here, so that a server that refuses client shared memory (started without
    ``--allow-client-shm``, a restricted shared-memory endpoint, a container with its own ``/dev/shm``) is found
    at open.
    """
    if mode == "cuda":
        raise BackendUnavailableError(
            f"{url}: shared_memory=cuda needs a GPU and cuda-python; it is not supported by this build yet "
            "(use auto, system or none)"
        )
    if transport is None:
        if mode == "system":
            raise ConfigError(
                f"model {model!r}: shared_memory=system needs one server on this host, and {fleet} stands for "
                "several; use shared_memory=auto or none"
            )
        return None
    if mode == "none" or (mode == "auto" and not loopback):
        return None
    if not info.has(SYSTEM_SHARED_MEMORY):
        if mode == "system":
            raise ConfigError(
                f"model {model!r}: shared_memory=system, but {info.lacks(SYSTEM_SHARED_MEMORY)} at {url} (use "
                "shared_memory=auto or none)"
            )
        logger.info("%s: %s; tensors go in the request body", url, info.lacks(SYSTEM_SHARED_MEMORY))
        return None
    remove_stale_regions(lambda name: transport.unregister_system_shm(name, timeout_s=1.0))
    pool = RegionPool(transport, max_slots=max_in_flight + 4)
    try:
        pool.release(pool.acquire(PAGE))  # the server must accept a region now, not at the first request
    except (CallError, OSError) as exc:
        pool.close(time.monotonic())
        reason = exc.message if isinstance(exc, CallError) else str(exc)
        if mode == "system":
            raise ConfigError(
                f"model {model!r}: shared_memory=system, but {url} cannot use this host's system shared memory: "
                f"{reason} (use shared_memory=auto or none)"
            ) from exc
        logger.warning(
            "%s refuses client shared memory (%s); tensors of model %r go in the request body", url, reason, model
        )
        return None
    return pool
