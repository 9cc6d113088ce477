"""Whether a starting server's models are ready, or can never be, and why a server that exited early did: what
``LocalTritonServer`` polls and reads while it waits.

A model that failed to load, a Python-backend stub that cannot start or died while loading, a model name the
repository does not hold: each ends the wait at once with a ``ServerStartError`` naming the model and quoting
Triton (the log tail attached), instead of waiting out the startup deadline. Triton 2.51 reports the stub's
failure to start only in its log, and then waits for that stub forever.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path

from ..client import loopback
from ..discovery import TritonInstall
from ..errors import PortInUseError, ServerStartError
from . import logs
from .capabilities import load_failure
from .options import ServerOptions
from .ports import LOOPBACK
from .stub import python_models, repository_stub_problems


class PortTaken(Exception):
    """A port picked free was taken before tritonserver bound it: the launcher retries with other ports."""


class LoadAborted(ServerStartError):
    """The Python backend aborted the server while it loaded (``logs.server_abort``): a fault of a moment's CPU
    starvation, not of the models, so the launcher starts it once more before it gives up with this error."""


def check_stub(install: TritonInstall, env: Mapping[str, str], options: ServerOptions) -> None:
    """Refuse at once a repository whose Python models could never load: a stub they start cannot start here."""
    problems = repository_stub_problems(options.model_repository, install.stub_path, env)
    if problems:
        problem, models = next(iter(problems.items()))
        raise ServerStartError(f"models {models} cannot load: {problem}")


def raise_load_failures(text: str, options: ServerOptions, log_path: Path, install: TritonInstall | None) -> None:
    """Raise for a model that failed to load, or a stub failure, in ``text`` (the log written since the last look)."""
    raise_model_failures(logs.model_failures(text), "failed to load", options, log_path, install)
    if cause := logs.stub_failure(text):
        models = python_models(options.model_repository)
        raise ServerStartError(f"models {models} cannot load: {cause}", log_tail=logs.read_tail(log_path))


def raise_exited(code: int, options: ServerOptions, log_path: Path, install: TritonInstall | None) -> None:
    """Raise why a server that exited with ``code`` before it was ready did, from its log.

    A port the caller gave that was taken is ``PortInUseError``; one picked free and taken since is ``PortTaken``
    (the launcher tries other ports); a model that failed to load is named; a known abort is named with its cause;
    else the exit status and the log's first error lines.
    """
    text = logs.read_tail(log_path, max_lines=10_000, max_chars=1 << 20)
    given = {p for p in (options.http_port, options.grpc_port, options.metrics_port) if p is not None}
    for conflict in logs.port_conflicts(text):
        if conflict.port in given:
            raise PortInUseError(
                f"{conflict.service} port {conflict.port} on {LOOPBACK} is already in use "
                f"(tritonserver could not bind it)"
            )
        raise PortTaken()
    tail = logs.read_tail(log_path)
    raise_model_failures(logs.model_failures(text), "failed to load", options, log_path, install)
    kind = LoadAborted if logs.server_abort(text) else ServerStartError
    raise kind(logs.exit_reason(code, text), log_tail=tail)


def models_ready(
    base: str, options: ServerOptions, log_path: Path, install: TritonInstall | None, *, timeout_s: float
) -> bool:
    """Whether every wanted model is ready (the server at ``base``); raise when one never will be."""
    index = loopback.repository_index(base, timeout_s=timeout_s)
    if index is None:
        return False
    known = {str(entry.get("name")) for entry in index}
    if options.models:
        wanted = set(options.models)
    elif options.model_control_mode == "none":
        wanted = known
    else:
        wanted = set()
    missing = sorted(wanted - known)
    if missing:
        raise ServerStartError(
            f"models {missing} are not in the repository {str(options.model_repository)!r} (it holds {sorted(known)})"
        )
    pending = [name for name in sorted(wanted) if not loopback.model_is_ready(base, name, timeout_s=timeout_s)]
    failed = [
        logs.ModelFailure(str(e["name"]), int(e.get("version") or 0), str(e["reason"]))
        for e in index
        if e.get("name") in pending and e.get("state") == "UNAVAILABLE" and e.get("reason")
    ]
    raise_model_failures(failed, "is unavailable", options, log_path, install)
    return not pending


def raise_model_failures(
    failures: list[logs.ModelFailure],
    what: str,
    options: ServerOptions,
    log_path: Path | None,
    install: TritonInstall | None,
) -> None:
    """Raise for the first failure of a wanted model (every model, when none was named).

    Where the model's ``config.pbtxt`` explains the failure (a backend or instance kind this server lacks),
    the error names the fix instead (``capabilities.load_failure``).
    """
    wanted = set(options.models)
    failures = [f for f in failures if not wanted or f.model in wanted]
    if failures:
        f = failures[0]
        hint = load_failure(options.model_repository / f.model, install, f.reason, where="tritonserver")
        if hint is not None:
            raise hint
        raise ServerStartError(
            f"model {f.model!r} version {f.version} {what}: {f.reason}",
            log_tail=logs.read_tail(log_path) if log_path else "",
        )
