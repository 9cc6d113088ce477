"""What a whole-volume model wraps, as its client reads it: the ``whole_volume`` block and the names on the wire.

A whole-volume model ``<name>_volume`` (``repository/volume.py`` writes it, ``monai-triton repo wrap``) carries
in its MONAI metadata a ``whole_volume`` block: the network it calls and the tensors it takes and gives. The
pipeline, the remote backend and the operators read it from a served model's signature metadata; they sit above
the repository tools or beside them, so the block's reading lives here, beside :mod:`signature`, not with the
tools that write it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from .errors import ConfigError

#: The uint8 argmax output of a whole-volume model.
LABELS = "LABELS"
#: The key of the block in the MONAI metadata that makes a model a whole-volume model.
VOLUME_KEY = "whole_volume"
DEFAULT_MAX_VOLUME_MB = 1024
DEFAULT_MAX_IN_FLIGHT = 2
#: How a user makes the whole-volume model of network ``name`` (named in errors).
WRAP_COMMAND = "monai-triton repo wrap REPO --name {name}"


@dataclass(frozen=True, kw_only=True)
class VolumeSpec:
    """What a whole-volume model wraps: the ``whole_volume`` block of its metadata (client and runner read it).

    ``input``/``output`` are the network's tensor names (the volume model uses the same ones, so the scores
    come back under the network's output name); ``labels`` the uint8 argmax output; ``channels`` the
    network output's channels (``None`` when dynamic); ``max_volume_mb`` the largest input the server
    accepts; ``max_in_flight`` how many network requests one volume keeps in flight.
    """

    network: str
    input: str
    output: str
    labels: str = LABELS
    channels: int | None
    spatial_rank: int
    batch_axis: bool
    network_max_batch_size: int
    max_volume_mb: int = DEFAULT_MAX_VOLUME_MB
    max_in_flight: int = DEFAULT_MAX_IN_FLIGHT

    def __post_init__(self) -> None:
        if self.max_volume_mb < 1:
            raise ConfigError(f"max_volume_mb must be >= 1 (megabytes), got {self.max_volume_mb}")
        if self.max_in_flight < 1:
            raise ConfigError(f"max_in_flight must be >= 1, got {self.max_in_flight}")

    @classmethod
    def of(cls, metadata: Any) -> VolumeSpec | None:
        """The block in a model's metadata, or ``None`` for a model that is not a whole-volume model."""
        block = metadata.get(VOLUME_KEY) if isinstance(metadata, dict) else None
        if block is None:
            return None
        try:
            return cls(**{key: block[key] for key in block if key in cls.__dataclass_fields__})
        except (TypeError, KeyError) as exc:
            raise ConfigError(f"metadata block {VOLUME_KEY!r} is not one monai-triton writes: {exc}") from exc

    def limit_bytes(self) -> int:
        return self.max_volume_mb << 20
