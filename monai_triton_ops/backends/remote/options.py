"""The remote backend's options: each one a query-string key of the spec (``grpc://HOST:PORT?timeout_s=30``).

Every option can also come from the environment, through the spec itself: ``MONAI_TRITON_BACKEND``
holds a whole spec, query string included. ``docs/remote.md`` lists them with their defaults.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from ...client.credentials import check_credential_options
from ...errors import ConfigError
from ..options import BackendOptions

SharedMemory = Literal["auto", "system", "cuda", "none"]
Compression = Literal["none", "gzip", "deflate"]
Fallback = Literal["none", "torch"]
Mode = Literal["window", "volume"]
VolumeOutput = Literal["labels", "scores"]


@dataclass(frozen=True, kw_only=True)
class RemoteOptions(BackendOptions):
    """Options of ``grpc://``, ``grpcs://``, ``http://`` and ``https://`` backends.

    TLS and auth (``credentials.py``): ``root_certificates`` a PEM file of the CA that signed the
    server's certificate (``grpcs://``, ``https://``; default: the system's CAs), ``client_certificate``
    and ``client_key`` PEM files for mutual TLS; ``auth_token`` (sent as ``authorization: Bearer``),
    ``restricted_keys`` (Triton's ``--grpc-restricted-protocol`` / ``--http-restricted-api`` keys) and
    ``headers`` name where each secret is, ``env:VARIABLE`` or ``file:PATH``, never the secret itself.
    ``max_batch_size`` for a server without Triton's model configuration (any Open Inference Protocol
    server, ``protocol.py``): above 0 the first dim of every tensor is the batch, at most that many.

    ``timeout_s`` is every inference's default deadline (a remote call always has one);
    ``ready_timeout_s`` the one deadline for the server and the model to be ready at open;
    ``shared_memory`` how tensors travel: ``auto`` (system shared memory when the server is on
    this host's loopback, else the wire), ``system`` (required: an error when it cannot work),
    ``cuda`` (CUDA IPC regions; needs a GPU and ``cuda-python``), ``none`` (always the wire);
    ``retries`` how many more attempts a transient error (server unavailable, queue full,
    connection refused or reset) gets, with exponential backoff from ``backoff_s`` to
    ``max_backoff_s``, inside the deadline; ``compression`` gRPC message compression;
    ``keepalive_s`` gRPC keepalive ping period; ``root_certificates`` a PEM file for
    ``grpcs://`` servers with a private CA.

    Several servers (``fleet.py``): ``servers`` more ``HOST:PORT`` of the spec's scheme, beside the
    spec's own; a server that fails is probed again after ``probe_backoff_s``, doubling up to
    ``max_probe_backoff_s``; names are resolved again every ``resolve_interval_s`` (a headless
    Service's pods come and go); ``fallback=torch`` runs a request in-process on the local model
    repository when no server can.

    ``mode``: ``window`` sends each sliding-window batch (the
    network's model), ``volume`` the whole volume to ``<model>_volume``, which runs the sliding window
    on the server (``docs/remote.md``); there ``volume_output`` is what comes back: ``labels`` (the
    argmax, uint8) or ``scores`` (the network's output, blended, as window mode gives it).
    """

    timeout_s: float | None = 120.0
    ready_timeout_s: float = 60.0
    shared_memory: SharedMemory = "auto"
    retries: int = 3
    backoff_s: float = 0.05
    max_backoff_s: float = 1.0
    client_certificate: Path | None = None
    client_key: Path | None = None
    auth_token: str | None = None
    restricted_keys: tuple[str, ...] = ()
    headers: tuple[str, ...] = ()
    max_batch_size: int | None = None
    compression: Compression = "none"
    keepalive_s: float | None = None
    root_certificates: Path | None = None
    servers: tuple[str, ...] = ()
    probe_backoff_s: float = 0.25
    max_probe_backoff_s: float = 5.0
    resolve_interval_s: float = 30.0
    fallback: Fallback = "none"
    mode: Mode = "window"
    volume_output: VolumeOutput = "labels"

    def __post_init__(self) -> None:
        super_post_init = getattr(super(), "__post_init__", None)
        if super_post_init is not None:
            super_post_init()
        if self.timeout_s is None:
            raise ConfigError("remote backends need a deadline on every call: timeout_s must be a number of seconds")
        for name in ("timeout_s", "ready_timeout_s", "probe_backoff_s", "max_probe_backoff_s", "resolve_interval_s"):
            _positive(name, getattr(self, name))
        if self.probe_backoff_s > self.max_probe_backoff_s:
            raise ConfigError(
                f"probing needs probe_backoff_s <= max_probe_backoff_s, got {self.probe_backoff_s} and "
                f"{self.max_probe_backoff_s}"
            )
        if self.keepalive_s is not None:
            _positive("keepalive_s", self.keepalive_s)
        if self.retries < 0:
            raise ConfigError(f"retries must be >= 0, got {self.retries}")
        if not 0 <= self.backoff_s <= self.max_backoff_s:
            raise ConfigError(
                f"backoff needs 0 <= backoff_s <= max_backoff_s, got {self.backoff_s} and {self.max_backoff_s}"
            )
        if self.mode == "volume" and self.fallback == "torch":
            raise ConfigError(
                "fallback=torch runs windows in this process and mode=volume sends the whole volume to the server; "
                "use one of them"
            )
        check_credential_options(self)
        if self.max_batch_size is not None and (isinstance(self.max_batch_size, bool) or self.max_batch_size < 0):
            raise ConfigError(f"max_batch_size must be an integer >= 0, got {self.max_batch_size!r}")


def _positive(name: str, value: float) -> None:
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value) or value <= 0:
        raise ConfigError(f"{name} must be a finite number of seconds > 0, got {value!r}")
