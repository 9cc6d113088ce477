"""``monai-triton repo check --server URL``: what a Triton server serves, and whether local configs match it.

The App SDK's remote apps keep a client-side ``config.pbtxt`` next to the app while the model runs on
a shared Triton; when the two drift apart the client fails on its first request. This module asks
the server (repository index, then each model's configuration, every call with a deadline) and
compares a local folder's configuration with what the server serves: names, dtypes, dims and
``max_batch_size``. It uses ``tritonclient`` directly: a tool's handful of calls, not the request path.

URLs: ``grpc://HOST:PORT``, ``grpcs://...``, ``http://HOST:PORT``, ``https://...``, or the App SDK's
``HOST:PORT`` (HTTP, as its ``-t``/``TRITON_SERVER_NETLOC``).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit

from ..errors import ConfigError, ServerUnavailableError
from ..server.health import CONTROL_TIMEOUT_S
from ..signature import ModelSignature
from .check import EntryReport, differences, replace_problems, table

_SCHEMES = {"grpc": ("grpc", False), "grpcs": ("grpc", True), "http": ("http", False), "https": ("http", True)}


@dataclass(frozen=True, kw_only=True)
class ServedModel:
    """One entry of the server's repository index, with its configuration when it is loaded."""

    name: str
    version: str
    state: str
    reason: str = ""
    signature: ModelSignature | None = None
    platform: str = ""


def parse_url(url: str) -> tuple[str, str, bool]:
    """``(protocol, host:port, tls)`` of a server URL; a bare ``HOST:PORT`` is HTTP, as the App SDK's ``-t``."""
    text = url if "://" in url else f"http://{url}"
    parts = urlsplit(text)
    if parts.scheme not in _SCHEMES or not parts.hostname or parts.port is None or parts.path not in ("", "/"):
        raise ConfigError(
            f"server URL {url!r}: expected grpc://HOST:PORT, grpcs://, http://HOST:PORT, https:// or HOST:PORT"
        )
    protocol, tls = _SCHEMES[parts.scheme]
    return protocol, parts.netloc, tls


class ServerView:
    """A read-only view of one server's models, every call bounded by ``timeout_s``."""

    def __init__(self, url: str, *, timeout_s: float = CONTROL_TIMEOUT_S) -> None:
        self.url = url
        self.protocol, self.address, tls = parse_url(url)
        self.timeout_s = timeout_s
        if self.protocol == "grpc":
            import tritonclient.grpc as grpcclient

            self._client: Any = grpcclient.InferenceServerClient(self.address, ssl=tls)
        else:
            import tritonclient.http as httpclient

            self._client = httpclient.InferenceServerClient(
                self.address, ssl=tls, connection_timeout=timeout_s, network_timeout=timeout_s
            )

    def close(self) -> None:
        self._client.close()

    def __enter__(self) -> ServerView:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def models(self) -> list[ServedModel]:
        """Every model in the server's repository index, in name order, with the signature of ready ones."""
        entries = self._call("the repository index", self._index)
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
        return self._call(f"the configuration of model {name!r}", lambda: self._config(name))

    def _index(self) -> list[dict[str, str]]:
        if self.protocol == "grpc":
            response = self._client.get_model_repository_index(client_timeout=self.timeout_s)
            return [_entry(m.name, m.version, m.state, m.reason) for m in response.models]
        index = self._client.get_model_repository_index()
        return [_entry(e.get("name"), e.get("version"), e.get("state"), e.get("reason")) for e in index]

    def _config(self, name: str) -> Any:
        from google.protobuf import json_format
        from tritonclient.grpc import model_config_pb2 as pb

        if self.protocol == "grpc":
            return self._client.get_model_config(name, client_timeout=self.timeout_s).config
        return json_format.ParseDict(self._client.get_model_config(name), pb.ModelConfig(), ignore_unknown_fields=True)

    def _call(self, what: str, call: Any) -> Any:
        from tritonclient.utils import InferenceServerException

        try:
            return call()
        except (InferenceServerException, OSError) as exc:  # refused, reset, timed out, TLS, a gRPC status
            raise ServerUnavailableError(
                f"Triton server {self.url!r} did not give {what} within {self.timeout_s:g} s: {exc}"
            ) from exc


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
