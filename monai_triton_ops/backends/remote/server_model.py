"""What the server says about one model: its signature from its config (readiness is ``readiness.py``).

The signature comes from the server alone (``config.pbtxt`` as the server loaded it, MONAI metadata in
its ``parameters``), so a client needs no local file. A local ``config.pbtxt`` is only compared, when
the caller's model repository has one: a mismatch means the app was built for another model.
"""

from __future__ import annotations

import logging
from pathlib import Path

from ...errors import ConfigError
from ...repository import layout
from ...repository.config import read_config, signature_from_config
from ...signature import ModelSignature
from ..status import CallError, to_public
from .transports.base import Transport

logger = logging.getLogger(__name__)


def read_signature(transport: Transport, model: str, version: int | None, *, timeout_s: float) -> ModelSignature:
    """The served version's signature, MONAI metadata included, from the server's model config.

    The one place the signature comes from: a server without Triton's model-configuration extension (any Open
    Inference Protocol server) would be read here from the standard model-metadata endpoint instead.
    """
    try:
        metadata = transport.model_metadata(model, _version(version), timeout_s=timeout_s)
        config = transport.model_config(model, _version(version), timeout_s=timeout_s)
    except CallError as exc:
        raise to_public(exc, model=model, url=transport.url) from exc
    served = [int(v) for v in metadata.get("versions", []) if str(v).isdigit()]
    chosen = version if version is not None else (max(served) if served else None)
    try:
        return signature_from_config(config, version=chosen)
    except ConfigError as exc:
        raise ConfigError(f"{transport.url}: {exc}") from exc


def check_local_config(signature: ModelSignature, repository: str | Path | None, *, url: str) -> None:
    """Compare with ``<repository>/<model>/config.pbtxt`` when the caller has one; a mismatch is an error."""
    if repository is None:
        return
    path = Path(repository) / signature.name / layout.CONFIG_FILENAME
    if not path.is_file():
        return
    local = signature_from_config(read_config(path, name=signature.name), version=signature.version)
    found = differences(local, signature)
    if found:
        raise ConfigError(
            f"model {signature.name!r}: the local {str(path)!r} does not match what {url} serves: " + "; ".join(found)
        )
    logger.debug("local %s matches the server's configuration", path)


def differences(
    local: ModelSignature, served: ModelSignature, *, names: tuple[str, str] = ("local", "server")
) -> list[str]:
    """What differs between two signatures of one model: tensors (names, dtypes, shapes) and ``max_batch_size``.

    ``names`` say which is which in the text (the local file and the server; two servers of a fleet).
    """
    first, second = names
    found = []
    if local.max_batch_size != served.max_batch_size:
        found.append(f"max_batch_size {first} {local.max_batch_size}, {second} {served.max_batch_size}")
    for kind in ("inputs", "outputs"):
        mine = [(s.name, s.dtype, list(s.shape)) for s in getattr(local, kind)]
        theirs = [(s.name, s.dtype, list(s.shape)) for s in getattr(served, kind)]
        if mine != theirs:
            found.append(f"{kind} {first} {mine}, {second} {theirs}")
    return found


def _version(version: int | None) -> str:
    return "" if version is None else str(version)
