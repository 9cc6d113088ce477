"""What a remote backend's ``open()`` builds before its first request, in this order:

1. the fleet (``fleet.py``), its control calls on the contract's worker pool: every server probed until one has
   the model ready within ``ready_timeout_s`` (``health.py``), each ready server described (``protocol.py``) and checked
   to serve the same model; in volume mode the whole-volume model and the network it wraps (``volume.py``);
   with ``fallback=torch`` and no server ready, the signature of the model in this process;
2. how tensors travel: a pool of shared memory slots on the one server, or the request body
   (``shm.choice.open_pool``);
3. the exchange that sends each attempt (``exchange.py``), with the version and the request parameters every
   request carries.

Whatever fails on the way closes what was made before it.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from ...client.endpoints import Endpoint
from ...client.transports.base import TransportSettings
from ...client.workers import Workers
from ...errors import ModelNotFoundError, ServerUnavailableError
from ...signature import ModelSignature
from .exchange import Exchange
from .fallback import TorchFallback
from .fleet import Fleet
from .health import Server
from .options import RemoteOptions
from .protocol import UNKNOWN_SERVER, Served
from .shm.choice import open_pool
from .volume import describe_volume, missing_volume_model, volume_parameters


@dataclass(frozen=True)
class Opened:
    """An open remote backend's parts: its servers, how it sends an attempt, and the signature."""

    fleet: Fleet
    exchange: Exchange
    signature: ModelSignature


@dataclass(frozen=True, kw_only=True)
class Target:
    """What the backend asks for: ``model`` as served (``<network>_volume`` in volume mode), ``network`` as the app
    names it, ``version`` (the network's), the servers, and the caller's model repository."""

    model: str
    network: str
    version: int | None
    endpoints: Sequence[Endpoint]
    url: str
    repository: str | Path | None


def open_remote(target: Target, options: RemoteOptions, fallback: TorchFallback | None, workers: Workers) -> Opened:
    """Open the backend's parts (see the module docstring); ``fallback`` (made, not yet loaded) and ``workers`` (the
    contract's pool, whose threads own HTTP clients) are the caller's."""
    fleet: Fleet | None = None
    try:
        volume = options.mode == "volume"
        fleet = Fleet(
            target.model,
            None if volume else target.version,  # in volume mode the version is the network's, a parameter
            target.endpoints,
            TransportSettings.from_options(options),
            workers,
            options,
            repository=target.repository,
            describe=(lambda server: _describe_volume(server, target, options)) if volume else None,
        )
        signature = _open_fleet(fleet, target, options, fallback)
        only = fleet.members.only_server()
        pool = open_pool(
            only.transport if only is not None else None,
            only.info if only is not None else UNKNOWN_SERVER,
            mode=options.shared_memory,
            loopback=target.endpoints[0].is_loopback,
            max_in_flight=options.max_in_flight,
            model=target.model,
            url=target.url,
            fleet=fleet.members.label,
        )
        if pool is not None:
            fleet.members.pin()
    except BaseException:
        if fleet is not None:
            fleet.members.close()
        raise
    version, parameters = "" if target.version is None else str(target.version), {}
    if volume:  # the version asked for is the network's, sent along as a parameter
        version, parameters = "", volume_parameters(target.version)
    exchange = Exchange(signature, version, pool, fallback=options.shared_memory == "auto", parameters=parameters)
    return Opened(fleet, exchange, signature)


def _open_fleet(fleet: Fleet, target: Target, options: RemoteOptions, fallback: TorchFallback | None) -> ModelSignature:
    """The fleet's signature (each server's checked against the local config); or the fallback's, when no server
    is ready."""
    try:
        return fleet.open(options.ready_timeout_s)
    except ModelNotFoundError as exc:
        if options.mode == "volume":
            raise missing_volume_model(exc, target.network) from exc
        raise
    except ServerUnavailableError as exc:
        if fallback is None:
            raise
        signature = fallback.open(str(exc))
        fleet.adopt(signature)
        return signature


def _describe_volume(server: Server, target: Target, options: RemoteOptions) -> Served:
    """One server's whole-volume model and its network, checked (``volume.py``)."""
    return describe_volume(
        server,
        target.network,
        target.version,
        model=target.model,
        ready_timeout_s=options.ready_timeout_s,
        repository=target.repository,
    )
