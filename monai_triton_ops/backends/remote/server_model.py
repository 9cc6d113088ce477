"""What the server says about one model: readiness within one deadline, and its signature from its config.

The signature comes from the server alone (``config.pbtxt`` as the server loaded it, MONAI metadata in
its ``parameters``), so a client needs no local file. A local ``config.pbtxt`` is only compared, when
the caller's model repository has one: a mismatch means the app was built for another model.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from ...errors import ConfigError, ModelLoadError, ModelNotFoundError, ServerUnavailableError
from ...repository import layout
from ...repository.config import read_config, signature_from_config
from ...signature import ModelSignature
from .translate import CallError, Status, to_public
from .transport import Transport

logger = logging.getLogger(__name__)

#: One probe's deadline while waiting; the whole wait has the caller's deadline.
_PROBE_TIMEOUT_S = 2.0
_POLL_FIRST_S = 0.05
_POLL_MAX_S = 1.0
#: Repository states in which a model may still become ready.
_PENDING_STATES = frozenset({"LOADING", "UNLOADING", "READY", ""})


def wait_until_ready(transport: Transport, model: str, version: int | None, *, timeout_s: float) -> None:
    """Return once ``model`` (``version``, or the server's choice) is ready; fail fast when it never will be.

    Raises ``ModelNotFoundError`` (listing what the server has) for a wrong name or version,
    ``ModelLoadError`` for a model the server failed to load, ``ServerUnavailableError`` when the
    server does not answer or the model is not ready within ``timeout_s``.
    """
    started = time.monotonic()
    deadline = started + timeout_s
    poll = _POLL_FIRST_S
    last = "no answer yet"
    while True:
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            raise ServerUnavailableError(
                f"model {model!r} on {transport.url} was not ready within {timeout_s:g} s (ready_timeout_s): {last}"
            )
        probe = min(_PROBE_TIMEOUT_S, remaining)
        try:
            if transport.is_model_ready(model, _version(version), timeout_s=probe):
                logger.info("model %r ready on %s after %.2f s", model, transport.url, time.monotonic() - started)
                return
            index = transport.repository_index(timeout_s=probe)
            last = _never_ready(index, model, version, transport.url)
        except CallError as exc:
            if exc.status not in (Status.UNAVAILABLE, Status.DEADLINE):
                raise to_public(exc, model=model, url=transport.url) from exc
            last = f"{exc.status.value}: {exc.message}"
        time.sleep(max(0.0, min(poll, deadline - time.monotonic())))
        poll = min(2 * poll, _POLL_MAX_S)


def _never_ready(index: Sequence[dict[str, Any]], model: str, version: int | None, url: str) -> str:
    """Raise when the index shows the model can never become ready; else describe its state."""
    entries = [e for e in index if e.get("name") == model]
    if not entries:
        raise ModelNotFoundError(f"model {model!r} is not on {url}; the server has: {_listing(index)}")
    if version is not None:
        versioned = [e for e in entries if str(e.get("version", "")) == str(version)]
        if not versioned and any(e.get("state") == "READY" for e in entries):
            raise ModelNotFoundError(f"model {model!r} has no version {version} on {url}; it has: {_listing(entries)}")
        entries = versioned or entries
    for entry in entries:
        state = str(entry.get("state", ""))
        if state not in _PENDING_STATES:
            reason = entry.get("reason") or "no reason given"
            raise ModelLoadError(f"model {model!r} is {state} on {url}: {reason}")
    return "state " + ", ".join(str(e.get("state") or "unknown") for e in entries)


def _listing(index: Sequence[dict[str, Any]]) -> str:
    if not index:
        return "no models"
    items = []
    for entry in sorted(index, key=lambda e: (str(e.get("name")), str(e.get("version")))):
        version = f" version {entry['version']}" if entry.get("version") else ""
        items.append(f"{entry.get('name')}{version} ({entry.get('state') or 'unknown'})")
    return ", ".join(items)


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
    differences = _differences(local, signature)
    if differences:
        raise ConfigError(
            f"model {signature.name!r}: the local {str(path)!r} does not match what {url} serves: "
            + "; ".join(differences)
        )
    logger.debug("local %s matches the server's configuration", path)


def _differences(local: ModelSignature, served: ModelSignature) -> list[str]:
    found = []
    if local.max_batch_size != served.max_batch_size:
        found.append(f"max_batch_size local {local.max_batch_size}, server {served.max_batch_size}")
    for kind in ("inputs", "outputs"):
        mine = [(s.name, s.dtype, list(s.shape)) for s in getattr(local, kind)]
        theirs = [(s.name, s.dtype, list(s.shape)) for s in getattr(served, kind)]
        if mine != theirs:
            found.append(f"{kind} local {mine}, server {theirs}")
    return found


def _version(version: int | None) -> str:
    return "" if version is None else str(version)
