"""What a server speaks beyond the Open Inference Protocol, and so where a model's signature comes from.

Triton, MLServer, KServe's model server and others all speak the Open Inference Protocol (KServe V2):
health, server and model metadata, inference, over HTTP/JSON and gRPC. Triton adds extensions, which
its server metadata lists (``extensions``) and this backend uses when they are there:

    model_configuration   the signature from the model config: max_batch_size, MONAI metadata in its parameters
    binary_tensor_data    HTTP tensors as binary (without it, HTTP tensors travel as JSON numbers)
    system_shared_memory  tensors through this host's shared memory (shared_memory=auto/system)
    statistics            backend.statistics()

KServe's own model server lists none of them, yet takes binary HTTP tensors since 0.14 (the
``inference-header-content-length`` header): :data:`UNLISTED_BINARY` names such servers, and
:attr:`ServerInfo.binary_tensors` is the one answer to "binary or JSON over HTTP" (MLServer refuses binary ones).

Without ``model_configuration`` (MLServer and KServe list no such extension) the signature comes from the standard
model-metadata endpoint: tensor names, datatypes and shapes. What that endpoint does not say comes from:

    max_batch_size    the ``max_batch_size`` option, else the caller's local ``<repository>/<model>/config.pbtxt``,
                      else 0 (no implicit batch dim; shapes as the server gives them, a leading -1 included)
    MONAI metadata    the local ``config.pbtxt`` (its ``parameters``), else none
    tensors           the local ``config.pbtxt`` when the server's metadata lists none

and a local ``config.pbtxt`` is compared with the server's metadata (names, datatypes, shapes): an app built
for another model fails at open.

With ``model_configuration`` the signature comes from the server alone (:func:`read_signature`: the
``config.pbtxt`` the server loaded, MONAI metadata in its ``parameters``), so a client needs no local file; a
local ``config.pbtxt`` is only compared (:func:`check_local_config`): a mismatch means the app was built for
another model. :func:`mismatch` is the one comparison of two signatures (a local file and a server, two
servers of a fleet).
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from types import MappingProxyType
from typing import Any

from ...client.status import CallError, Status, to_public
from ...client.transports.base import Transport
from ...errors import ConfigError
from ...repository import layout
from ...repository.config import read_config, signature_from_config
from ...signature import ModelSignature, TensorSpec

logger = logging.getLogger(__name__)

MODEL_CONFIGURATION = "model_configuration"
BINARY_TENSORS = "binary_tensor_data"
SYSTEM_SHARED_MEMORY = "system_shared_memory"
STATISTICS = "statistics"


@dataclass(frozen=True)
class ServerInfo:
    """A server's name, version and the protocol extensions it lists (its server metadata)."""

    name: str
    version: str
    extensions: frozenset[str]

    def has(self, extension: str) -> bool:
        return extension in self.extensions

    @property
    def binary_tensors(self) -> bool:
        """Whether its HTTP bodies may carry tensors as binary: the extension listed, or a server known to take them."""
        if self.has(BINARY_TENSORS):
            return True
        since = UNLISTED_BINARY.get(self.name)
        return since is not None and _release(self.version) >= since

    def __str__(self) -> str:
        return f"{self.name} {self.version}".strip() or "an unnamed server"

    def lacks(self, extension: str) -> str:
        """The sentence errors use for a missing extension."""
        listed = ", ".join(sorted(self.extensions)) or "none"
        return f"the server ({self}) does not have the {extension} extension (it lists: {listed})"


#: Servers that take binary HTTP tensors without listing the extension: name -> first release that does. KServe's
#: model server decodes them since 0.14 (0.13 has no ``inference-header-content-length``); tested with 0.21.
UNLISTED_BINARY: Mapping[str, tuple[int, ...]] = MappingProxyType({"kserve": (0, 14)})


def _release(version: str) -> tuple[int, ...]:
    """``"0.21.0"`` as ``(0, 21, 0)``; the numeric head of each part (``"0rc1"`` is 0); ``()`` if none."""
    numbers = []
    for part in version.split("."):
        digits = part[: len(part) - len(part.lstrip("0123456789"))]
        if not digits:
            break
        numbers.append(int(digits))
    return tuple(numbers)


#: What a server that answers no server metadata is taken to be: the base protocol, no extension.
UNKNOWN_SERVER = ServerInfo("unknown", "", frozenset())


@dataclass(frozen=True)
class Served:
    """What open learns about one model on one server."""

    signature: ModelSignature
    server: ServerInfo


def server_info(transport: Transport, *, model: str, timeout_s: float) -> ServerInfo:
    """The server metadata; a server without that endpoint is taken as the base protocol (no extension)."""
    try:
        meta = transport.server_metadata(timeout_s=timeout_s)
    except CallError as exc:
        if exc.status in (Status.UNSUPPORTED, Status.NOT_FOUND):
            return UNKNOWN_SERVER
        raise to_public(exc, model=model, url=transport.url) from exc
    extensions = frozenset(str(e) for e in meta.get("extensions", ()) or ())
    return ServerInfo(str(meta.get("name", "")), str(meta.get("version", "")), extensions)


def describe_model(
    transport: Transport,
    model: str,
    version: int | None,
    *,
    timeout_s: float,
    repository: str | Path | None,
    max_batch_size: int | None,
) -> Served:
    """The server and the model's signature: from the model config on Triton, else from the model metadata."""
    server = server_info(transport, model=model, timeout_s=timeout_s)
    if server.has(MODEL_CONFIGURATION):
        signature = read_signature(transport, model, version, timeout_s=timeout_s)
        if max_batch_size is not None and max_batch_size != signature.max_batch_size:
            raise ConfigError(
                f"model {model!r}: option max_batch_size={max_batch_size}, but {transport.url} serves it with "
                f"max_batch_size {signature.max_batch_size} (its model configuration); drop the option"
            )
        check_local_config(signature, repository, url=transport.url)
        return Served(signature, server)
    signature = signature_from_metadata(
        transport, model, version, timeout_s=timeout_s, repository=repository, max_batch_size=max_batch_size
    )
    logger.info(
        "model %r on %s (%s, no model configuration extension): signature from its model metadata, "
        "max_batch_size %d; tensors %s",
        model,
        transport.url,
        server,
        signature.max_batch_size,
        "binary" if server.binary_tensors else "as JSON numbers over HTTP",
    )
    return Served(signature, server)


def signature_from_metadata(
    transport: Transport,
    model: str,
    version: int | None,
    *,
    timeout_s: float,
    repository: str | Path | None,
    max_batch_size: int | None,
) -> ModelSignature:
    """The signature an Open Inference Protocol server's model metadata gives, completed as the module says."""
    try:
        metadata = transport.model_metadata(model, "" if version is None else str(version), timeout_s=timeout_s)
    except CallError as exc:
        raise to_public(exc, model=model, url=transport.url) from exc
    local, path = _local(repository, model)
    batch = max_batch_size if max_batch_size is not None else (local.max_batch_size if local is not None else 0)
    served = [int(v) for v in metadata.get("versions", None) or () if str(v).isdigit()]
    chosen = version if version is not None else (max(served) if served else None)
    inputs, outputs = metadata.get("inputs") or [], metadata.get("outputs") or []
    where = f"model {model!r} on {transport.url}"
    if not inputs or not outputs:
        if local is None:
            raise ConfigError(
                f"{where}: the server's model metadata lists no {'inputs' if not inputs else 'outputs'} and there "
                "is no local config.pbtxt to take them from: declare the tensors on the server (MLServer: inputs "
                "and outputs in model-settings.json) or give the model repository that holds its config.pbtxt"
            )
        logger.info("%s: the server's metadata lists no tensors; they come from %s", where, path)
        return replace(local, max_batch_size=batch, version=chosen)
    signature = ModelSignature(
        name=model,
        inputs=tuple(_tensor(where, "input", t, batch) for t in inputs),
        outputs=tuple(_tensor(where, "output", t, batch) for t in outputs),
        max_batch_size=batch,
        version=chosen,
        metadata=local.metadata if local is not None else {},
    )
    if local is not None:
        signature = _with_local(signature, replace(local, max_batch_size=batch), where, path)
    return signature


def _local(repository: str | Path | None, model: str) -> tuple[ModelSignature | None, Path | None]:
    if repository is None:
        return None, None
    path = Path(repository) / model / layout.CONFIG_FILENAME
    if not path.is_file():
        return None, None
    return signature_from_config(read_config(path, name=model)), path


def _tensor(where: str, kind: str, entry: dict[str, Any], batch: int) -> TensorSpec:
    name = str(entry.get("name", ""))
    try:
        shape = [int(d) for d in entry.get("shape", ())]
    except (TypeError, ValueError):
        raise ConfigError(f"{where}: {kind} {name!r} has shape {entry.get('shape')!r}, not a list of dims") from None
    if batch > 0:
        if not shape or shape[0] != -1:
            raise ConfigError(
                f"{where}: max_batch_size {batch} makes the first dim of every tensor the batch, but {kind} {name!r} "
                f"has shape {shape} (its first dim is not -1); give max_batch_size=0"
            )
        shape = shape[1:]
    try:
        return TensorSpec(name=name, dtype=str(entry.get("datatype", "")), shape=tuple(shape))
    except ConfigError as exc:
        raise ConfigError(f"{where}: {kind} {name!r} in the server's model metadata: {exc}") from None


def _with_local(served: ModelSignature, local: ModelSignature, where: str, path: Path | None) -> ModelSignature:
    """Tensors checked against the local ``config.pbtxt``: same names and datatypes, dims that agree (-1 takes any).

    The narrower dim of the two is kept: a server's metadata often says -1 where the model is fixed.
    """
    merged: dict[str, tuple[TensorSpec, ...]] = {}
    problems = []
    for kind in ("inputs", "outputs"):
        theirs, mine = getattr(served, kind), getattr(local, kind)
        agreed = [_agreed(t, m) for t, m in zip(theirs, mine, strict=False)] if len(theirs) == len(mine) else [None]
        if any(spec is None for spec in agreed):
            problems.append(f"{kind} local {_listing(mine)}, server {_listing(theirs)}")
        else:
            merged[kind] = tuple(spec for spec in agreed if spec is not None)
    if problems:
        raise ConfigError(
            f"{where}: the local {str(path)!r} does not match the server's model metadata: " + "; ".join(problems)
        )
    return replace(served, inputs=merged["inputs"], outputs=merged["outputs"])


def _agreed(theirs: TensorSpec, mine: TensorSpec) -> TensorSpec | None:
    """The spec both agree on, or ``None``."""
    if (theirs.name, theirs.dtype, len(theirs.shape)) != (mine.name, mine.dtype, len(mine.shape)):
        return None
    dims = []
    for a, b in zip(theirs.shape, mine.shape, strict=True):
        if a not in (b, -1) and b != -1:
            return None
        dims.append(a if b == -1 else b)
    return replace(theirs, shape=tuple(dims))


def _listing(specs: tuple[TensorSpec, ...]) -> str:
    return str([(s.name, s.dtype, list(s.shape)) for s in specs])


# -- the run line -----------------------------------------------------------------------------------------
#: The transport of each scheme, as the run line names it.
TRANSPORTS: Mapping[str, str] = MappingProxyType(
    {"grpc": "gRPC", "grpcs": "gRPC with TLS", "http": "HTTP", "https": "HTTPS"}
)


def run_line(url: str, servers: Sequence[ServerInfo], *, shared_memory: bool, volume_model: str | None) -> str:
    """How the run line names a remote backend: ``grpc (triton 2.51.0 at HOST:PORT over gRPC, binary tensors)``.

    ``servers`` are the ones described so far (their server metadata: name and version); how tensors travel is
    said once it is known: system shared memory; else binary over gRPC, and over HTTP binary or JSON as each
    server takes them (:attr:`ServerInfo.binary_tensors`). Before any server is described (not open yet, or a
    fallback running while none is ready) it says "remote server" and nothing of tensors.
    """
    scheme, _, host = url.partition("://")
    names = sorted({str(s) for s in servers if s != UNKNOWN_SERVER})
    parts = [f"{', '.join(names) or 'remote server'} at {host} over {TRANSPORTS.get(scheme, scheme)}"]
    if shared_memory:
        parts.append("system shared memory")
    elif servers:
        binary = {scheme.startswith("grpc") or s.binary_tensors for s in servers}
        ways = {True: "binary tensors", False: "JSON tensors"}
        parts.append(ways[binary.pop()] if len(binary) == 1 else "binary or JSON tensors, as each server takes them")
    if volume_model is not None:
        parts.append(f"whole volume to {volume_model!r}")
    return f"{scheme} ({', '.join(parts)})"


# -- a Triton server's model configuration, and comparing signatures ------------------------------------
def read_signature(transport: Transport, model: str, version: int | None, *, timeout_s: float) -> ModelSignature:
    """The served version's signature, MONAI metadata included, from a Triton server's model config (its
    ``model_configuration`` extension; the version is the one asked for, else the newest the metadata lists)."""
    try:
        metadata = transport.model_metadata(model, "" if version is None else str(version), timeout_s=timeout_s)
        config = transport.model_config(model, "" if version is None else str(version), timeout_s=timeout_s)
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


def mismatch(reference: ModelSignature, other: ModelSignature, *, strict: bool, names: tuple[str, str]) -> list[str]:
    """What makes ``other`` another model than ``reference``; ``strict`` compares version and metadata too."""
    found = differences(reference, other, names=names)
    if strict and reference.version != other.version:
        found.append(f"version {names[0]} {reference.version}, {names[1]} {other.version}")
    if strict and dict(reference.metadata) != dict(other.metadata):
        found.append("their MONAI metadata (config parameters) differ")
    return found
