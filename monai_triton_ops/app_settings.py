"""Deploy-time settings of an app: the backend, the model name and every backend option, from three sources.

One naming rule maps each setting to its command-line flag and its environment variable::

    option timeout_s     ->  --timeout-s      MONAI_TRITON_TIMEOUT_S
    the model name       ->  --model-name     MONAI_TRITON_MODEL_NAME
    the backend          ->  --backend        MONAI_TRITON_BACKEND

One precedence, first match wins: the command line, then the environment, then the app's ``app.yaml``
(``application.environment``, the same variable names), then the app's code (``InferenceOperator(...,
backend_options=...)``), then the backend's own default. ``app.yaml``'s ``environment:`` holds the
defaults of the environment: when the app starts, each entry the environment does not already have is
set for the run (so ``HOLOSCAN_*`` and ``TRITON_SERVER_NETLOC`` work there too), and a variable that was
already set, even to the same value, counts as the environment's. The file is ``HOLOSCAN_CONFIG_PATH``
when set (in a MAP: ``/var/holoscan/app.yaml``), else the one beside the app. A MAP does not bake these
defaults into its image's ``ENV`` (``app.json#environment`` lists them): so in a container
``-e TRITON_SERVER_NETLOC=H:P`` alone chooses the remote backend over app.yaml's
``MONAI_TRITON_BACKEND``, and ``-e MONAI_TRITON_BACKEND=...`` wins over both.

Options in a backend spec's query string (``grpc://h:8001?ready_timeout_s=120``) rank as the spec's own
source: one in a spec from the environment beats the same option from ``app.yaml`` or the code
(:func:`backend_keywords`).

An option the chosen backend does not have is an error on the command line (the user just typed it)
and is skipped from the environment or ``app.yaml``, which often carry settings for several backends.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import os
from collections.abc import Mapping, MutableMapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from .errors import ConfigError, UsageError

logger = logging.getLogger(__name__)

ENV_PREFIX = "MONAI_TRITON_"
ENV_MODEL_NAME = "MONAI_TRITON_MODEL_NAME"
APP_YAML = "app.yaml"
#: The App SDK's (and a MAP's) path of the app's configuration: ``/var/holoscan/app.yaml`` in a MAP.
ENV_CONFIG_PATH = "HOLOSCAN_CONFIG_PATH"
#: Where each setting came from, as the log and the docs name it.
SOURCES = ("command line", "environment", "app.yaml", "code")


def flag_of(option: str) -> str:
    """``timeout_s`` -> ``--timeout-s``."""
    return "--" + option.replace("_", "-")


def env_of(option: str) -> str:
    """``timeout_s`` -> ``MONAI_TRITON_TIMEOUT_S``."""
    return ENV_PREFIX + option.upper()


@dataclass(frozen=True)
class Setting:
    """A value and the source it came from (one of ``SOURCES``, or ``default``)."""

    value: str
    source: str


# -- app.yaml ----------------------------------------------------------------------------------
def app_yaml_of(program: str | os.PathLike[str] | None, environ: Mapping[str, str] | None = None) -> Path | None:
    """The app's ``app.yaml``: ``HOLOSCAN_CONFIG_PATH`` when set (a MAP sets it), else the one beside the app.

    Beside the app means in its folder (``python APP``) or next to its script. A ``HOLOSCAN_CONFIG_PATH``
    that names no file is a ``ConfigError``: the deployer meant a configuration that is not there.
    """
    env = os.environ if environ is None else environ
    configured = env.get(ENV_CONFIG_PATH)
    if configured:
        if not Path(configured).is_file():
            raise ConfigError(f"app configuration {configured!r} ({ENV_CONFIG_PATH}) does not exist")
        return Path(configured)
    if not program:
        return None
    path = Path(program)
    folder = path if path.is_dir() else path.parent
    candidate = folder / APP_YAML
    return candidate if candidate.is_file() else None


def read_app_environment(path: Path | None) -> dict[str, str]:
    """``application.environment`` of an ``app.yaml`` as strings; ``{}`` without the file or the section."""
    if path is None:
        return {}
    import yaml

    try:
        document = yaml.safe_load(path.read_text(encoding="utf-8")) or {}
    except (OSError, yaml.YAMLError) as exc:
        raise ConfigError(f"{str(path)!r} cannot be read as YAML: {exc}") from exc
    application = document.get("application") if isinstance(document, Mapping) else None
    environment = application.get("environment") if isinstance(application, Mapping) else None
    if environment is None:
        return {}
    if not isinstance(environment, Mapping):
        raise ConfigError(f"{str(path)!r}: application.environment must be a mapping of NAME: value")
    return {str(k): "" if v is None else str(v) for k, v in environment.items()}


def apply_app_environment(values: Mapping[str, str], environ: MutableMapping[str, str] | None = None) -> dict[str, str]:
    """Set each ``app.yaml`` variable the environment lacks; returns those set (the others were overridden)."""
    env = os.environ if environ is None else environ
    applied = {k: v for k, v in values.items() if k not in env}
    env.update(applied)
    if applied:
        logger.debug("from app.yaml: %s", ", ".join(sorted(applied)))
    return applied


def source_of(name: str, from_yaml: Mapping[str, str], environ: Mapping[str, str] | None = None) -> str:
    """``environment`` or ``app.yaml`` for a variable that is set."""
    env = os.environ if environ is None else environ
    return "app.yaml" if name in from_yaml and env.get(name) == from_yaml[name] else "environment"


# -- backend options ---------------------------------------------------------------------------
def backend_option_names() -> dict[str, tuple[str, ...]]:
    """Every option of every backend that imports here -> the schemes that accept it."""
    from .backends.registry import available_backends, backend_class
    from .errors import BackendSpecError, BackendUnavailableError

    names: dict[str, list[str]] = {}
    for scheme in available_backends():
        try:
            cls = backend_class(scheme)
        except (BackendUnavailableError, BackendSpecError):
            continue
        for option in _option_names(cls.options_type):
            names.setdefault(option, []).append(scheme)
    return {option: tuple(schemes) for option, schemes in sorted(names.items())}


def accepted_options(spec: str) -> list[str]:
    """The options ``spec``'s backend takes."""
    from .backends.registry import backend_class

    return _option_names(backend_class(spec).options_type)


def resolve_backend_options(
    spec: str,
    cli: Mapping[str, str | None],
    *,
    environ: Mapping[str, str] | None = None,
    from_yaml: Mapping[str, str] | None = None,
) -> dict[str, Setting]:
    """The options the command line, the environment and ``app.yaml`` give for ``spec``'s backend, typed-checked.

    ``cli`` maps option names to flag values (``None``: not given). Raises ``UsageError`` for a flag
    the backend does not have and ``ConfigError`` (naming the flag or variable) for a bad value.
    """
    from .backends.options import parse_options
    from .backends.registry import backend_class, parse_backend_spec

    env = os.environ if environ is None else environ
    yaml_values = from_yaml or {}
    scheme = parse_backend_spec(spec).scheme
    cls = backend_class(spec)
    accepted = _option_names(cls.options_type)
    chosen: dict[str, Setting] = {}
    for name, value in cli.items():
        if value is None:
            continue
        if name not in accepted:
            raise UsageError(
                f"{flag_of(name)}: backend {scheme!r} has no option {name!r}; its options: "
                + ", ".join(flag_of(n) for n in sorted(accepted))
            )
        chosen[name] = Setting(value, "command line")
    for name in accepted:
        variable = env_of(name)
        if name not in chosen and variable in env:
            chosen[name] = Setting(env[variable], source_of(variable, yaml_values, env))
    skipped = sorted(env_of(n) for n in backend_option_names() if n not in accepted and env_of(n) in env)
    if skipped:
        logger.info("backend %r has no option for %s; skipped", scheme, ", ".join(skipped))
    for name, setting in chosen.items():
        where = flag_of(name) if setting.source == "command line" else f"{env_of(name)} ({setting.source})"
        try:
            parse_options(cls.options_type, {name: setting.value}, backend=scheme)
        except ConfigError as exc:
            raise ConfigError(f"{where}: {exc}") from exc
    return chosen


def backend_keywords(
    spec: str, spec_source: str, deployed: Mapping[str, Setting], code: Mapping[str, Any]
) -> dict[str, Any]:
    """The keyword options to create ``spec``'s backend with, by the one precedence.

    ``deployed`` are the options from the command line, the environment and ``app.yaml`` (with their
    sources), ``code`` the app's ``backend_options``. ``create_backend`` lets a keyword beat the spec's
    query, so an option the query sets is left out of the keywords wherever the spec's source outranks
    the keyword's: ``MONAI_TRITON_BACKEND=grpc://h:8001?ready_timeout_s=120`` beats app.yaml's
    ``MONAI_TRITON_READY_TIMEOUT_S``. At equal rank the option's own flag or variable wins (the more
    specific setting).
    """
    from .backends.registry import parse_backend_spec

    query = parse_backend_spec(spec).options
    spec_rank = _rank(spec_source)
    keywords = {k: v for k, v in code.items() if not (k in query and spec_rank < _rank("code"))}
    for name, setting in deployed.items():
        if name in query and spec_rank < _rank(setting.source):
            keywords.pop(name, None)
        else:
            keywords[name] = setting.value
    return keywords


def _rank(source: str) -> int:
    """0 for the command line, the highest; a source not in ``SOURCES`` ranks below every one."""
    return SOURCES.index(source) if source in SOURCES else len(SOURCES)


def _option_names(options_type: type[Any]) -> list[str]:
    return [f.name for f in dataclasses.fields(options_type) if f.init]


# -- the model name ----------------------------------------------------------------------------
def model_name_for(code_name: str, override: str | None) -> str:
    """The model to use for an operator whose code says ``code_name``.

    ``override`` is ``NAME`` (every inference operator of the app uses ``NAME``) or
    ``CODE=NAME[,CODE=NAME...]`` (per operator, by the name in its code).
    """
    if not override:
        return code_name
    text = override.strip()
    if "=" not in text:
        return text
    mapping: dict[str, str] = {}
    for pair in text.split(","):
        old, sep, new = pair.partition("=")
        if not sep or not old.strip() or not new.strip():
            raise UsageError(f"model name {override!r}: expected NAME or CODE=NAME[,CODE=NAME...], got {pair!r}")
        mapping[old.strip()] = new.strip()
    return mapping.get(code_name, code_name)


def dump_settings(settings: Mapping[str, Setting]) -> str:
    """``{name: Setting}`` as JSON text, for ``AppContext.args`` (which holds strings)."""
    return json.dumps({name: [s.value, s.source] for name, s in settings.items()})


def load_settings(text: str | None) -> dict[str, Setting]:
    """The inverse of :func:`dump_settings`; ``{}`` for nothing."""
    if not text:
        return {}
    return {name: Setting(str(value), str(source)) for name, (value, source) in json.loads(text).items()}


def describe(settings: Mapping[str, Setting]) -> str:
    """``timeout_s=30 (command line), retries=5 (app.yaml)``."""
    return ", ".join(f"{k}={v.value} ({v.source})" for k, v in sorted(settings.items())) or "none"


def option_help(option: str, schemes: tuple[str, ...]) -> dict[str, Any]:
    """``argparse`` keywords for an option's flag."""
    return {
        "dest": f"option_{option}",
        "metavar": "VALUE",
        "help": f"backend option {option} ({', '.join(schemes)}; env {env_of(option)})",
    }


# -- what can be chosen here -------------------------------------------------------------------
@dataclass(frozen=True)
class BackendStatus:
    """One backend scheme: whether it can run here, why not, and its options."""

    scheme: str
    runs_here: bool
    detail: str
    options: tuple[str, ...] = ()


def backend_statuses() -> list[BackendStatus]:
    """Every registered scheme, as its backend says it runs here (asked through the registry), with its options."""
    from .backends.registry import available_backends, backend_availability, backend_class
    from .errors import BackendSpecError, BackendUnavailableError

    statuses = []
    for scheme in available_backends():
        runs, detail = backend_availability(scheme)
        try:
            options = tuple(_option_names(backend_class(scheme).options_type))
        except (BackendUnavailableError, BackendSpecError):
            options = ()
        statuses.append(BackendStatus(scheme, runs, detail, options))
    return statuses


def render_backends(statuses: list[BackendStatus]) -> str:
    """The table ``monai-triton backends`` prints, then the naming rule of the options."""
    width = max(len(s.scheme) for s in statuses) + 2
    lines = [f"{'backend':<{width}}{'runs here':<11}details"]
    for status in statuses:
        lines.append(f"{status.scheme:<{width}}{'yes' if status.runs_here else 'no':<11}{status.detail}")
    names = sorted({option for status in statuses for option in status.options})
    lines += ["", "options (flag, variable; also in app.yaml's environment): backends"]
    flag_width = max((len(flag_of(o)) for o in names), default=0) + 2
    env_width = max((len(env_of(o)) for o in names), default=0) + 2
    for option in names:
        schemes = ", ".join(s.scheme for s in statuses if option in s.options)
        lines.append(f"  {flag_of(option):<{flag_width}}{env_of(option):<{env_width}}{schemes}")
    lines += [
        "",
        f"backend: --backend / {ENV_PREFIX}BACKEND; model: --model-name / {ENV_MODEL_NAME}; "
        "precedence: command line > environment > app.yaml > code",
    ]
    return "\n".join(lines) + "\n"
