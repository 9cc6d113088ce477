"""``mode=volume``: the remote backend opens ``<name>_volume``, the whole-volume model beside the network's.

The app still names the network (``brain_tissue_seg``); in volume mode its requests go to the model
``monai-triton repo wrap`` made next to it (``repository/volume.py``), which runs the sliding window on
the server and calls the network through BLS. At open, both must be on the server: a missing volume
model fails at once with the command that makes it, and the network's configuration is compared with
the caller's local ``config.pbtxt`` as in window mode. The caller's ``version`` is the network's: it
travels to the volume model as the ``network_version`` request parameter.
"""

from __future__ import annotations

from pathlib import Path

from ...client.timeouts import CONTROL_TIMEOUT_S
from ...errors import ConfigError, ModelNotFoundError
from ...repository.volume import volume_model_name
from ...signature import ModelSignature
from ...volume_spec import WRAP_COMMAND, VolumeSpec
from ..requests import Parameter
from . import health
from .health import Server
from .protocol import Served, check_local_config, read_signature, server_info


def served_name(model_name: str, mode: str) -> str:
    """The model requests go to: the network's in window mode, ``<name>_volume`` in volume mode."""
    return volume_model_name(model_name) if mode == "volume" else model_name


def open_volume_model(
    server: Server,
    network: str,
    version: int | None,
    *,
    ready_timeout_s: float,
    repository: str | Path | None,
) -> ModelSignature:
    """The volume model's signature on ``server``, where the fleet found ``<network>_volume`` ready (``fleet.py``):
    checked to wrap ``network``, which is waited for (Triton may still be loading it) and compared with a local
    config."""
    transport, volume = server.transport, volume_model_name(network)
    signature = read_signature(transport, volume, None, timeout_s=CONTROL_TIMEOUT_S)
    spec = VolumeSpec.of(signature.metadata)
    if spec is None or spec.network != network:
        wraps = "no whole_volume block in its metadata" if spec is None else f"it wraps {spec.network!r}"
        raise ConfigError(
            f"model {volume!r} on {transport.url} is not the whole-volume model of {network!r} ({wraps}); rewrite it "
            f"with '{WRAP_COMMAND.format(name=network)} --force'"
        )
    health.wait_until_any_ready(
        lambda left: {server.label: health.probe(transport, server.address, network, version, timeout_s=left)},
        network,
        timeout_s=ready_timeout_s,
    )
    served = read_signature(transport, network, version, timeout_s=CONTROL_TIMEOUT_S)
    check_local_config(served, repository, url=transport.url)
    return signature


def describe_volume(
    server: Server,
    network: str,
    version: int | None,
    *,
    model: str,
    ready_timeout_s: float,
    repository: str | Path | None,
) -> Served:
    """What the fleet learns of one server in volume mode: the whole-volume model ``model`` and its network,
    checked (:func:`open_volume_model`), and what the server speaks. Triton only: the volume model is a
    Python-backend model that runs MONAI's sliding window on the server."""
    signature = open_volume_model(server, network, version, ready_timeout_s=ready_timeout_s, repository=repository)
    return Served(signature, server_info(server.transport, model=model, timeout_s=CONTROL_TIMEOUT_S))


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
