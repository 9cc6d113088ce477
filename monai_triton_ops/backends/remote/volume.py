"""``mode=volume``: the remote backend opens ``<name>_volume``, the whole-volume model beside the network's.

The app still names the network (``brain_tissue_seg``); in volume mode its requests go to the model
``monai-triton repo wrap`` made next to it (``repository/volume.py``), which runs the sliding window on
the server and calls the network through BLS. At open, both must be on the server: a missing volume
model fails at once with the command that makes it, and the network's configuration is compared with
the caller's local ``config.pbtxt`` as in window mode. The caller's ``version`` is the network's: it
travels to the volume model as the ``network_version`` request parameter.
"""

from __future__ import annotations

import time
from pathlib import Path

from ...errors import ConfigError, ModelNotFoundError, ServerUnavailableError
from ...repository.volume import WRAP_COMMAND, VolumeSpec, volume_model_name
from ...signature import ModelSignature
from ..requests import Parameter
from . import readiness
from .server_model import check_local_config, read_signature
from .translate import CallError, Status, to_public
from .transport import Transport

#: Deadline of each control call at open (metadata, config).
_CONTROL_TIMEOUT_S = 10.0


def served_name(model_name: str, mode: str) -> str:
    """The model requests go to: the network's in window mode, ``<name>_volume`` in volume mode."""
    return volume_model_name(model_name) if mode == "volume" else model_name


def open_volume_model(
    transport: Transport,
    network: str,
    version: int | None,
    *,
    ready_timeout_s: float,
    repository: str | Path | None,
) -> ModelSignature:
    """Wait for ``<network>_volume`` and the network, check both; the volume model's signature.

    The fleet has already found ``<network>_volume`` ready on this server (``fleet.py``); the waits here are
    for a server found later and for the network, which Triton may still be loading."""
    url, volume = transport.url, volume_model_name(network)
    deadline = time.monotonic() + ready_timeout_s
    try:
        wait_until_ready(transport, volume, None, timeout_s=ready_timeout_s)
    except ModelNotFoundError as exc:
        raise missing_volume_model(exc, network) from exc
    signature = read_signature(transport, volume, None, timeout_s=_CONTROL_TIMEOUT_S)
    spec = VolumeSpec.of(signature.metadata)
    if spec is None or spec.network != network:
        wraps = "no whole_volume block in its metadata" if spec is None else f"it wraps {spec.network!r}"
        raise ConfigError(
            f"model {volume!r} on {url} is not the whole-volume model of {network!r} ({wraps}); rewrite it with "
            f"'{WRAP_COMMAND.format(name=network)} --force'"
        )
    wait_until_ready(transport, network, version, timeout_s=max(0.1, deadline - time.monotonic()))
    served = read_signature(transport, network, version, timeout_s=_CONTROL_TIMEOUT_S)
    check_local_config(served, repository, url=url)
    return signature


def wait_until_ready(transport: Transport, model: str, version: int | None, *, timeout_s: float) -> None:
    """Return once ``model`` is ready on this one server; fail fast when its repository index says it never will
    be (``readiness.never_ready``), ``ServerUnavailableError`` past ``timeout_s``."""
    deadline = time.monotonic() + timeout_s
    last = "no answer yet"
    while True:
        left = deadline - time.monotonic()
        if left <= 0:
            raise ServerUnavailableError(
                f"model {model!r} on {transport.url} was not ready within {timeout_s:g} s (ready_timeout_s): {last}"
            )
        probe_s = min(readiness.PROBE_TIMEOUT_S, left)
        try:
            if transport.is_model_ready(model, "" if version is None else str(version), timeout_s=probe_s):
                return
            last = "state " + (
                readiness.never_ready(transport.repository_index(timeout_s=probe_s), model, version, transport.url)
                or "unknown"
            )
        except CallError as exc:
            if exc.status not in (Status.UNAVAILABLE, Status.DEADLINE):
                raise to_public(exc, model=model, url=transport.url) from exc
            last = f"{exc.status.value}: {exc.message}"
        time.sleep(max(0.0, min(0.2, deadline - time.monotonic())))


def missing_volume_model(exc: ModelNotFoundError, network: str) -> ModelNotFoundError:
    """The server's "not found" for ``<network>_volume``, with how to make that model."""
    command = WRAP_COMMAND.format(name=network)
    return ModelNotFoundError(
        f"{exc}; mode=volume needs the whole-volume model {volume_model_name(network)!r} beside {network!r}: make "
        f"it with '{command}' (or 'monai-triton repo build MODEL --name {network} --whole-volume') in the server's "
        "model repository and load it, or use mode=window"
    )


def volume_parameters(version: int | None) -> dict[str, Parameter]:
    """What every volume request carries besides the caller's settings: the network version asked for."""
    return {} if version is None else {"network_version": str(version)}
