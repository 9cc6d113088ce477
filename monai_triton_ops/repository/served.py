"""``monai-triton repo check --server URL``: what a Triton server serves, and whether local configs match it.

The App SDK's remote apps keep a client-side ``config.pbtxt`` next to the app while the model runs on
a shared Triton; when the two drift apart the client fails on its first request. This module asks
the server (repository index, then each model's configuration, every call with a deadline) and
compares a local folder's configuration with what the server serves: names, dtypes, dims and
``max_batch_size``. It speaks through the client layer (``client/``), as the remote backend does: the same
URLs, TLS and mutual TLS, auth headers (secrets named by ``env:``/``file:``) and status table, so a server
the backend reaches, this reaches too.

URLs: ``grpc://HOST:PORT``, ``grpcs://...``, ``http://HOST:PORT``, ``https://...``, or the App SDK's
``HOST:PORT`` (HTTP, as its ``-t``/``TRITON_SERVER_NETLOC``).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, TypeVar

from ..client.credentials import CredentialOptions, CredentialRefs, load_credentials
from ..client.endpoints import server_endpoint
from ..client.status import CallError, Status, public_error
from ..client.timeouts import CONTROL_TIMEOUT_S
from ..client.tls import check_handshake, check_tls_options
from ..client.transports import connect
from ..client.transports.base import TransportSettings
from ..client.workers import JOIN_TIMEOUT_S, Workers
from ..errors import ServerUnavailableError
from ..signature import ModelSignature
from .check import EntryReport, differences, replace_problems, table

T = TypeVar("T")


@dataclass(frozen=True, kw_only=True)
class ServedModel:
    """One entry of the server's repository index, with its configuration when it is loaded."""

    name: str
    version: str
    state: str
    reason: str = ""
    signature: ModelSignature | None = None
    platform: str = ""


class ServerView:
    """A read-only view of one server's models, every call bounded by ``timeout_s``; ``credentials`` as the remote
    backend's options name them (CA, client certificate and key, auth token, headers, restricted keys)."""

    def __init__(
        self, url: str, *, timeout_s: float = CONTROL_TIMEOUT_S, credentials: CredentialOptions | None = None
    ) -> None:
        self.url = url
        self.timeout_s = timeout_s
        endpoint = server_endpoint(url)
        options = credentials or CredentialRefs()
        check_tls_options([endpoint], options)
        settings = TransportSettings(credentials=load_credentials(options))
        check_handshake(endpoint, settings.credentials, timeout_s=timeout_s)  # a TLS failure named, not waited out
        self._workers = Workers("repo-check", 1)  # an HTTP client lives on the thread that made it
        try:
            self._transport = connect(endpoint, settings, self._workers)
        except BaseException:
            self._workers.stop(join_timeout_s=JOIN_TIMEOUT_S)
            raise

    def close(self) -> None:
        try:
            self._transport.close()
        finally:
            self._workers.stop(join_timeout_s=JOIN_TIMEOUT_S)

    def __enter__(self) -> ServerView:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def models(self) -> list[ServedModel]:
        """Every model in the server's repository index, in name order, with the signature of ready ones."""
        index = self._call("the repository index", lambda t: t.repository_index(timeout_s=self.timeout_s))
        entries = [_entry(e.get("name"), e.get("version"), e.get("state"), e.get("reason")) for e in index]
        found = []
        for entry in sorted(entries, key=lambda e: (e["name"], e["version"])):
            signature, platform = None, ""
            if entry["state"] == "READY":
                config = self.config(entry["name"])
                platform = str(config.platform or config.backend)
                from .config import signature_from_config

                signature = signature_from_config(config)
            found.append(
                ServedModel(
                    name=entry["name"], version=entry["version"], state=entry["state"], reason=entry["reason"],
                    signature=signature, platform=platform,
                )
            )  # fmt: skip
        return found

    def config(self, name: str) -> Any:
        """The model's configuration as the server has it (a ``ModelConfig`` message, whichever protocol)."""
        return self._call(
            f"the configuration of model {name!r}", lambda t: t.model_config(name, "", timeout_s=self.timeout_s)
        )

    def _call(self, what: str, call: Callable[[Any], T]) -> T:
        """``call(transport)``; a failure raised as the status table says (a refused token is a ``ConfigError``,
        a 4xx the request's fault); a server that is away or too slow as ``ServerUnavailableError``."""
        try:
            return call(self._transport)
        except CallError as exc:
            if exc.status in (Status.UNAVAILABLE, Status.DEADLINE):
                raise ServerUnavailableError(
                    f"Triton server {self.url!r} did not give {what} within {self.timeout_s:g} s: {exc.message}"
                ) from exc
            raise public_error(exc, f"Triton server {self.url!r}, {what}") from exc


def _entry(name: Any, version: Any, state: Any, reason: Any) -> dict[str, str]:
    return {
        "name": str(name),
        "version": str(version or ""),
        "state": str(state or "UNKNOWN"),
        "reason": str(reason or ""),
    }


def compare(local: ModelSignature, served: ModelSignature, url: str) -> list[str]:
    """Where a local ``config.pbtxt`` and the server's configuration of the same model disagree."""
    label = f"the server ({url})"
    found = []
    if local.max_batch_size != served.max_batch_size:
        found.append(f"config.pbtxt says max_batch_size {local.max_batch_size}, {label} {served.max_batch_size}")
    for kind, ours, theirs in (("input", local.input_names, served.input_names),
                               ("output", local.output_names, served.output_names)):  # fmt: skip
        if ours != theirs:
            found.append(f"config.pbtxt names the {kind}s {list(ours)}, {label} {list(theirs)}")
    if local.max_batch_size == served.max_batch_size:
        found += differences(local, served, label)
    return found


def against_server(reports: Sequence[EntryReport], served: Sequence[ServedModel], url: str) -> list[EntryReport]:
    """Each local report with what the server says about that model added (absent, not ready, different)."""
    by_name: dict[str, list[ServedModel]] = {}
    for model in served:
        by_name.setdefault(model.name, []).append(model)
    result = []
    for report in reports:
        found = by_name.get(report.name, [])
        ready = [m for m in found if m.state == "READY" and m.signature is not None]
        if not found:
            names = ", ".join(sorted(by_name)) or "none"
            problems = [f"not on the server {url} (it serves: {names})"]
        elif not ready:
            problems = [f"on the server {url} but {m.state}: {m.reason or 'no reason given'}" for m in found[:1]]
        elif report.signature is None:
            problems = []
        else:
            problems = compare(report.signature, ready[0].signature, url)  # type: ignore[arg-type]
        note = [f"the server {url} serves it, version {ready[0].version or '?'}"] if ready and not problems else []
        result.append(replace_problems(report, problems, note))
    return result


def render_served(served: Sequence[ServedModel], url: str) -> str:
    """The server's models: name, version, state, platform, inputs and outputs; then the reasons of failed ones."""
    rows = [("MODEL", "VERSION", "STATE", "PLATFORM", "INPUTS", "OUTPUTS")]
    for m in served:
        inputs = outputs = "-"
        if m.signature is not None:
            batch = m.signature.max_batch_size
            inputs = "; ".join(f"{s.name} {s.dtype} {list(s.full_shape(batch))}" for s in m.signature.inputs)
            outputs = "; ".join(f"{s.name} {s.dtype} {list(s.full_shape(batch))}" for s in m.signature.outputs)
        rows.append((m.name, m.version or "-", m.state, m.platform or "-", inputs, outputs))
    lines = [f"server {url}", *table(rows)]
    lines += [f"{m.name}: {m.state}: {m.reason}" for m in served if m.state != "READY" and m.reason]
    return "\n".join(lines) + "\n"
