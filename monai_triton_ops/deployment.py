"""The deploy-time backend of each model of an app, and its options, as ``AppContext.args`` carries them.

A backend value is ``SPEC`` (the app-wide backend) or ``NAME=SPEC`` (the backend of the model ``NAME``, its folder
name in the models folder ``-m``). The command line repeats ``--backend``, one value each; ``MONAI_TRITON_BACKEND``
(and ``app.yaml``'s entry of the same name) holds several values separated by ``;``, since a fleet's addresses are
separated by ``,``::

    --backend torch --backend spleen=grpc://gpu1:8001,gpu2:8001
    MONAI_TRITON_BACKEND="torch;spleen=grpc://gpu1:8001,gpu2:8001"

One rule gives each model its backend: the first source that sets one, in the order command line, environment,
``app.yaml``; within that source the model's own ``NAME=SPEC``, else the source's app-wide ``SPEC`` (``--backend``
/ ``MONAI_TRITON_BACKEND``, then the App SDK's ``-t`` / ``TRITON_SERVER_NETLOC``); then the operator's
``backend=`` in the code, then ``torch``. A name is a model's folder name, so ``NAME=`` never starts a spec
(a spec's own ``=`` follows its ``?``: ``grpc://h:8001?ready_timeout_s=120``).

Refused before anything runs, each with the value and where it came from: two values for one model (or two
app-wide ones) in one source, and a name that is not a model folder of ``-m`` (:func:`check_models`).

``monai-triton exec`` hands an app its options as the environment (an App SDK app's own parser refuses options it
does not know) and lists them in ``MONAI_TRITON_COMMAND_LINE``, so that they keep the command line's rank.
"""

from __future__ import annotations

import json
import os
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from . import app_settings
from .app_settings import Setting
from .errors import UsageError

ENV_BACKEND = "MONAI_TRITON_BACKEND"
ENV_PREVIEW = "MONAI_TRITON_PREVIEW"
ENV_ALLOW_NON_FINITE = "MONAI_TRITON_ALLOW_NON_FINITE"
#: Keys under which the deploy-time settings land in ``AppContext.args`` (strings, as the App SDK keeps them).
BACKEND_ARG = "backend"
BACKEND_SOURCE_ARG = "backend_source"
BACKEND_MAP_ARG = "backend_map"
MODEL_NAME_ARG = "model_name"
BACKEND_OPTIONS_ARG = "backend_options"
MODEL_OPTIONS_ARG = "model_backend_options"
PREVIEW_ARG = "preview"
ALLOW_NON_FINITE_ARG = "allow_non_finite"
_TRUE = {"1", "true", "yes", "on"}
#: The App SDK's own variable for a Triton server's ``HOST:PORT`` (its ``-t/--triton-server-netloc``).
ENV_NETLOC = "TRITON_SERVER_NETLOC"
#: The variables ``monai-triton exec`` set from its own command line (comma-separated): they rank as the command line.
ENV_COMMAND_LINE = "MONAI_TRITON_COMMAND_LINE"
#: What separates the values of one ``MONAI_TRITON_BACKEND``.
SEPARATOR = ";"
_NAMED = re.compile(r"^([A-Za-z0-9_][A-Za-z0-9_.-]*)=(.+)$")


@dataclass(frozen=True)
class BackendChoice:
    """The app-wide backend and the models whose own ``NAME=SPEC`` won, each with its source."""

    default: Setting
    models: Mapping[str, Setting] = field(default_factory=dict)
    #: every model any source names (for :func:`check_models`), with where it was named
    named: Mapping[str, str] = field(default_factory=dict)

    def of(self, model: str) -> Setting:
        """The backend of ``model``: its own entry, else the app-wide one."""
        return self.models.get(model, self.default)

    def dump(self) -> str:
        """``models`` as JSON text, for ``AppContext.args`` (which holds strings)."""
        return app_settings.dump_settings(self.models)


def netloc_spec(netloc: str | None) -> str | None:
    """``HOST:PORT`` -> ``http://HOST:PORT`` (the App SDK's client is HTTP); a full spec is kept as is."""
    if not netloc:
        return None
    return netloc if "://" in netloc else f"http://{netloc}"


def split_values(text: str) -> list[str]:
    """``MONAI_TRITON_BACKEND``'s values: ``a;b`` -> ``["a", "b"]`` (empty ones dropped)."""
    return [part.strip() for part in text.split(SEPARATOR) if part.strip()]


def parse_values(values: Sequence[str], where: str) -> tuple[str | None, dict[str, str]]:
    """``(app-wide spec or None, {model: spec})`` of one source's values; each spec checked.

    Raises:
        UsageError: two values for one model, or two app-wide values (naming ``where``).
        BackendSpecError: a spec that does not parse.
    """
    from .backends.registry import parse_backend_spec

    app_wide: str | None = None
    models: dict[str, str] = {}
    for value in values:
        match = _NAMED.match(value.strip())
        name, spec = (match.group(1), match.group(2).strip()) if match else (None, value.strip())
        parse_backend_spec(spec)  # a typo fails here, naming the spec
        if name is None:
            if app_wide is not None:
                raise UsageError(
                    f"{where}: two app-wide backends, {app_wide!r} and {spec!r}; give one, and NAME=SPEC for a model"
                )
            app_wide = spec
        elif name in models:
            raise UsageError(f"{where}: two backends for model {name!r}, {models[name]!r} and {spec!r}; give one")
        else:
            models[name] = spec
    return app_wide, models


@dataclass(frozen=True)
class _Source:
    name: str  # one of app_settings.SOURCES
    where: str  # the flag or variable, for errors
    app_wide: str | None
    models: dict[str, str]


def resolve(
    cli: Sequence[str],
    *,
    netloc: str | None = None,
    environ: Mapping[str, str] | None = None,
    from_yaml: Mapping[str, str] | None = None,
    default: str = "torch",
) -> BackendChoice:
    """Every model's backend by the module's rule. ``cli``: the ``--backend`` values, ``netloc``: ``-t``'s."""
    env = os.environ if environ is None else environ
    yaml_values = from_yaml or {}
    exec_given = command_line_variables(env)
    cli = [*cli] or (split_values(env[ENV_BACKEND]) if ENV_BACKEND in exec_given else [])
    sources = [_source("command line", "--backend", cli, netloc_spec(netloc))]
    for kind in ("environment", "app.yaml"):
        found = {
            variable: env[variable]
            for variable in (ENV_BACKEND, ENV_NETLOC)
            if env.get(variable)
            and variable not in exec_given
            and app_settings.source_of(variable, yaml_values, env) == kind
        }
        values = split_values(found.get(ENV_BACKEND, ""))
        sources.append(_source(kind, f"{ENV_BACKEND} ({kind})", values, netloc_spec(found.get(ENV_NETLOC))))
    app_wide = next((Setting(s.app_wide, s.name) for s in sources if s.app_wide), Setting(default, "code"))
    models: dict[str, Setting] = {}
    named: dict[str, str] = {}
    for source in sources:
        for name in source.models:
            named.setdefault(name, source.where)
    for name in named:
        for source in sources:
            if name in source.models:
                models[name] = Setting(source.models[name], source.name)
                break
            if source.app_wide:
                break
    if app_wide.source == "code":
        parse_values([default], "the app's default backend")
    return BackendChoice(app_wide, models, named)


def _source(name: str, where: str, values: Sequence[str], netloc: str | None) -> _Source:
    app_wide, models = parse_values(values, where)
    return _Source(name, where, app_wide or netloc, models)


def command_line_variables(environ: Mapping[str, str] | None = None) -> set[str]:
    """The variables ``monai-triton exec`` set from its command line (``MONAI_TRITON_COMMAND_LINE``)."""
    env = os.environ if environ is None else environ
    return {name.strip() for name in env.get(ENV_COMMAND_LINE, "").split(",") if name.strip()}


def model_folders(models_path: str | os.PathLike[str] | None) -> list[str] | None:
    """The model names of a models folder (its folders), or ``None`` when ``models_path`` is no such folder
    (not given, a file, or one model itself: a bundle or a Triton model folder)."""
    if not models_path:
        return None
    folder = Path(models_path)
    if not folder.is_dir() or (folder / "config.pbtxt").is_file() or (folder / "configs").is_dir():
        return None
    return sorted(p.name for p in folder.iterdir() if p.is_dir() and not p.name.startswith("."))


def check_models(choice: BackendChoice, models_path: str | os.PathLike[str] | None) -> None:
    """Every model the backend choice names is a model folder of ``-m`` (when ``-m`` is a models folder)."""
    names = model_folders(models_path)
    if names is None:
        return
    for model, where in choice.named.items():
        if model not in names:
            raise UsageError(
                f"{where}: backend for model {model!r}, which is not in the models folder {str(models_path)!r} "
                f"(models there: {', '.join(names) or 'none'}); NAME must be a model's folder name"
            )


def resolve_options(
    choice: BackendChoice, cli: Mapping[str, str | None], *, from_yaml: Mapping[str, str] | None = None
) -> dict[str, dict[str, Setting]]:
    """The backend options of every backend the choice uses (``{spec: {option: Setting}}``).

    A flag is given to each chosen backend that has the option, and is an error only when none has it.
    """
    specs = list(dict.fromkeys([choice.default.value, *(s.value for s in choice.models.values())]))
    env = os.environ
    given = {**{name: env[app_settings.env_of(name)] for name in _exec_options(env)}, **_given(cli)}
    environ = {k: v for k, v in env.items() if k not in command_line_variables(env)}
    accepted = {spec: set(app_settings.accepted_options(spec)) for spec in specs}
    for name in given:
        if not any(name in names for names in accepted.values()):  # the one error, as for one backend
            app_settings.resolve_backend_options(specs[0], {name: given[name]}, environ=environ, from_yaml=from_yaml)
    return {
        spec: app_settings.resolve_backend_options(
            spec, {k: v for k, v in given.items() if k in accepted[spec]}, environ=environ, from_yaml=from_yaml
        )
        for spec in specs
    }


def _given(cli: Mapping[str, str | None]) -> dict[str, str]:
    return {name: value for name, value in cli.items() if value is not None}


def _exec_options(environ: Mapping[str, str]) -> list[str]:
    prefix = app_settings.ENV_PREFIX
    skip = {ENV_BACKEND, app_settings.ENV_MODEL_NAME, ENV_COMMAND_LINE}
    return [
        v[len(prefix) :].lower()
        for v in command_line_variables(environ)
        if v.startswith(prefix) and v not in skip and v in environ and v[len(prefix) :].lower() in _option_names()
    ]


def _option_names() -> set[str]:
    return set(app_settings.backend_option_names())


def dump_options(options: Mapping[str, Mapping[str, Setting]], choice: BackendChoice) -> str:
    """Each model's options (those of its backend) as JSON text, for ``AppContext.args``."""
    return json.dumps({model: app_settings.dump_settings(options[s.value]) for model, s in choice.models.items()})


def load_model_options(text: str | None, model: str) -> dict[str, Setting] | None:
    """``model``'s options from :func:`dump_options`' text; ``None`` when the model has no backend of its own."""
    if not text:
        return None
    entry = json.loads(text).get(model)
    return None if entry is None else app_settings.load_settings(entry)


def is_set(cli: bool | None, variable: str, environ: Mapping[str, str] | None = None) -> bool:
    """A switch: the flag, else the variable (1/true/yes/on), else False."""
    env = os.environ if environ is None else environ
    return bool(cli) or env.get(variable, "").strip().lower() in _TRUE


@dataclass(frozen=True)
class Given:
    """What the command line gave (nothing, for an app whose context the App SDK made)."""

    backends: Sequence[str] = ()
    netloc: str | None = None
    options: Mapping[str, str | None] = field(default_factory=dict)
    model_name: str | None = None
    preview: bool | None = None
    allow_non_finite: bool | None = None


def context_args(
    given: Given, *, from_yaml: Mapping[str, str], models_path: str | None, default: str = "torch"
) -> dict[str, str]:
    """The deploy-time settings as ``AppContext.args`` entries, every check done (nothing has run yet).

    Raises ``UsageError`` / ``BackendSpecError`` (exit 2) for a bad choice, ``BackendUnavailableError`` (exit 3)
    for a backend that cannot be imported here, ``ConfigError`` for an option of the wrong type.
    """
    from .preflight import check_backend

    choice = resolve(given.backends, netloc=given.netloc, environ=os.environ, from_yaml=from_yaml, default=default)
    for spec in dict.fromkeys([choice.default.value, *(s.value for s in choice.models.values())]):
        check_backend(spec)  # reserved or not installed: exit 3 here, not when the graph runs
    check_models(choice, models_path)
    options = resolve_options(choice, given.options, from_yaml=from_yaml)
    return {
        BACKEND_ARG: choice.default.value,
        BACKEND_SOURCE_ARG: choice.default.source,
        BACKEND_MAP_ARG: choice.dump(),
        MODEL_NAME_ARG: given.model_name or os.environ.get(app_settings.ENV_MODEL_NAME) or "",
        BACKEND_OPTIONS_ARG: app_settings.dump_settings(options[choice.default.value]),
        MODEL_OPTIONS_ARG: dump_options(options, choice),
        PREVIEW_ARG: str(is_set(given.preview, ENV_PREVIEW)).lower(),
        ALLOW_NON_FINITE_ARG: str(is_set(given.allow_non_finite, ENV_ALLOW_NON_FINITE)).lower(),
    }


_from_environment: dict[tuple[str, ...], dict[str, str]] = {}
#: What ``app.yaml`` set in this process's environment, per app (applied once; later reads must know its source).
_yaml_applied: dict[str, dict[str, str]] = {}


def args_of(app_context: Any) -> dict[str, str]:
    """The deploy-time settings of an app context: its own (``app_args.init_app_context`` made it), else, for a
    context the App SDK's ``init_app_context`` made, the same settings from the environment and the app's
    ``app.yaml`` (found from ``sys.argv[0]``, as ``python APP`` and ``monai-triton exec`` set it), applied once
    per app and worked out once per environment.
    """
    if app_context is None:
        return {}
    args = dict(getattr(app_context, "args", None) or {})
    if BACKEND_ARG in args:
        return args
    import sys

    program = sys.argv[0] if sys.argv else ""
    if program not in _yaml_applied:
        found = app_settings.read_app_environment(app_settings.app_yaml_of(program or None))
        _yaml_applied[program] = app_settings.apply_app_environment(found)
    netloc = str(getattr(app_context, "triton_server_netloc", "") or "")
    if netloc == os.environ.get(ENV_NETLOC):  # the App SDK read the variable: it ranks as the environment
        netloc = ""
    models_path = str(getattr(app_context, "model_path", "") or "")
    ours = sorted((k, v) for k, v in os.environ.items() if k.startswith(app_settings.ENV_PREFIX) or k == ENV_NETLOC)
    key = (program, netloc, models_path, json.dumps(ours))
    if key not in _from_environment:
        given = Given(netloc=netloc or None)
        yaml_values = _yaml_applied[program]
        _from_environment[key] = context_args(given, from_yaml=yaml_values, models_path=models_path or None)
    return {**args, **_from_environment[key]}
