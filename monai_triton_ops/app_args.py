"""The command line of an App SDK app: the App SDK's options plus ours, checked before the graph runs.

Ours: ``--backend SPEC``, ``--model-name NAME``, one flag per backend option (``--timeout-s``,
``--max-in-flight``... see ``app_settings``), ``--preview`` and ``--allow-non-finite``; each also as a
``MONAI_TRITON_*`` variable and in the app's ``app.yaml`` (``application.environment``). The App SDK's:
``-i -o -m -w -t -l``. The backend, first match wins::

    --backend SPEC                      explicit choice (command line)
    -t/--triton-server-netloc H:P       the App SDK's own remote option -> http://H:P (HTTP, as in the App SDK)
    MONAI_TRITON_BACKEND=SPEC           explicit choice (environment, then app.yaml)
    TRITON_SERVER_NETLOC=H:P            the App SDK's environment variable -> http://H:P (environment, then app.yaml)
    the app's default                   usually ``torch``

So an App SDK app started with ``-t`` runs on the remote backend unchanged, and ``--backend`` always wins. The App SDK's
``parse_args`` rejects unknown options, so we extend rather than bypass it: our options come off the
command line and every other argument still goes through the App SDK's parser. Before it does, the
whole command line is checked once by a parser that knows every option, so a typo is one line
(exit 2), and so are a reserved or missing backend (exit 3), a missing input or model path and an
output folder that cannot be written (exit 2).

``run_app`` is the ``__main__`` of an app: ``--help`` that lists every option (Holoscan's own
``--help`` would show only Holoscan's), one log level for everything, Ctrl-C and SIGTERM ending the
run within seconds (``interrupts.py``), and every failure as one line and a documented exit code
(``exits.py``).
"""

from __future__ import annotations

import argparse
import importlib
import os
import sys
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, NoReturn

from . import app_settings, console, deployment, exits, interrupts, preflight
from .app_settings import Setting
from .deployment import (  # noqa: F401 (the keys of AppContext.args and the variables, imported from here too)
    ALLOW_NON_FINITE_ARG,
    BACKEND_ARG,
    BACKEND_MAP_ARG,
    BACKEND_OPTIONS_ARG,
    BACKEND_SOURCE_ARG,
    ENV_ALLOW_NON_FINITE,
    ENV_BACKEND,
    ENV_NETLOC,
    ENV_PREVIEW,
    MODEL_NAME_ARG,
    MODEL_OPTIONS_ARG,
    PREVIEW_ARG,
    netloc_spec,
)
from .errors import ModelNotFoundError, UsageError

if TYPE_CHECKING:
    from monai.deploy.core import AppContext

#: The app's default backend (``backends.registry.DEFAULT_BACKEND``; not imported here, so that ``run_app``
#: can restart the process before torch is loaded).
DEFAULT_BACKEND = "torch"
#: The App SDK's (and a MAP's) model folder when -m is not given.
ENV_MODEL_PATH = "HOLOSCAN_MODEL_PATH"
_HELP = ("-h", "--help")


class _Parser(argparse.ArgumentParser):
    """An ``ArgumentParser`` whose errors are one ``UsageError`` (one line, exit 2), not usage text and exit."""

    def error(self, message: str) -> NoReturn:
        raise UsageError(f"{self.prog}: {message} (see '{self.prog} --help')")


def backend_parser(*, options: bool = True) -> argparse.ArgumentParser:
    """Our options alone; ``add_help=False`` so that the whole parser can include it.

    With ``options``, one flag per option of every backend that imports here (``--timeout-s``...).
    """
    parser = _Parser(add_help=False)
    parser.add_argument(
        "--backend",
        metavar="SPEC",
        action="append",
        help=(
            f"where the models run: torch (default), triton, grpc://HOST:PORT, http://HOST:PORT (env {ENV_BACKEND}); "
            f"wins over the App SDK's -t HOST:PORT / {ENV_NETLOC}, which mean http://HOST:PORT. NAME=SPEC (repeat "
            f"the flag; in the variable separated by ';') for the model NAME of the models folder"
        ),
    )
    parser.add_argument(
        "--model-name",
        metavar="NAME",
        help=(
            "the model to run instead of the one the app's code names: NAME, or CODE=NAME[,CODE=NAME] per "
            f"operator (env {app_settings.ENV_MODEL_NAME})"
        ),
    )
    parser.add_argument(
        "--preview",
        action="store_true",
        default=None,
        help=f"also write preview.png: input slices with the labels overlaid (env {ENV_PREVIEW}=1)",
    )
    parser.add_argument(
        "--allow-non-finite",
        action="store_true",
        default=None,
        help=f"run on images with NaN/Inf voxels instead of refusing them (env {ENV_ALLOW_NON_FINITE}=1)",
    )
    if options:
        for option, schemes in app_settings.backend_option_names().items():
            parser.add_argument(app_settings.flag_of(option), **app_settings.option_help(option, schemes))
    return parser


def app_parser(prog: str = "app", description: str | None = None) -> argparse.ArgumentParser:
    """Every option an app accepts: the App SDK's and ours, with help (the App SDK's parser stays the judge)."""
    parser = _Parser(prog=prog, description=description, parents=[backend_parser()], epilog=_epilog())
    parser.add_argument("-i", "--input", metavar="PATH", help="input file or folder (default: env HOLOSCAN_INPUT_PATH)")
    parser.add_argument("-o", "--output", metavar="DIR", help="output folder, created if missing")
    parser.add_argument("-m", "--model", metavar="PATH", help="model repository folder (<name>/<version>/model.pt)")
    parser.add_argument("-w", "--workdir", metavar="DIR", help="App SDK workspace folder")
    parser.add_argument(
        "-t",
        "--triton-server-netloc",
        metavar="HOST:PORT",
        help=f"a Triton server: the model runs on http://HOST:PORT unless --backend is given (env {ENV_NETLOC})",
    )
    parser.add_argument(
        "-l", "--log-level", type=str.upper, choices=console.LEVELS,
        help="DEBUG (also Holoscan's log and tracebacks), INFO, WARN (default), ERROR, CRITICAL",
    )  # fmt: skip
    return parser


def _epilog() -> str:
    codes = "; ".join(f"{code} {text}" for code, text in exits.MEANINGS.items())
    return f"Holoscan's own options (--config, --driver, --worker, ...) are passed to Holoscan. Exit codes: {codes}."


def split_backend_args(argv: Sequence[str]) -> tuple[str | None, list[str]]:
    """``(--backend value or None, argv without our options)``; ``argv[0]`` is the program, as in ``sys.argv``."""
    known, rest = _split(argv)
    return deployment.SEPARATOR.join(known.backend) if known.backend else None, rest


def _split(argv: Sequence[str]) -> tuple[argparse.Namespace, list[str]]:
    known, rest = backend_parser().parse_known_args(list(argv[1:]))
    return known, [argv[0], *rest] if argv else rest


def _cli_options(known: argparse.Namespace) -> dict[str, str | None]:
    """The backend options given as flags: ``{"timeout_s": "30", ...}`` (``None`` when not given)."""
    prefix = "option_"
    return {k[len(prefix) :]: v for k, v in vars(known).items() if k.startswith(prefix)}


def split_netloc_args(argv: Sequence[str]) -> tuple[str | None, list[str]]:
    """``(-t/--triton-server-netloc value or None, argv without it)``, like :func:`split_backend_args`."""
    parser = argparse.ArgumentParser(add_help=False)
    parser.add_argument("-t", "--triton-server-netloc")
    known, rest = parser.parse_known_args(list(argv[1:]))
    return known.triton_server_netloc or None, [argv[0], *rest] if argv else rest


def netloc_of(argv: Sequence[str]) -> str | None:
    """The App SDK's ``-t/--triton-server-netloc`` value in ``argv``, if any."""
    return split_netloc_args(argv)[0]


def resolve_backend(
    cli: str | None,
    *,
    default: str = DEFAULT_BACKEND,
    environ: Mapping[str, str] | None = None,
    netloc: str | None = None,
) -> str:
    """``--backend``, then ``-t`` (``netloc``), then the environment (ours, then the App SDK's), then the default.

    The result is validated, so a typo fails before any operator starts.
    """
    return resolve_backend_setting(cli, default=default, environ=environ, netloc=netloc).value


def resolve_backend_setting(
    cli: str | None,
    *,
    default: str = DEFAULT_BACKEND,
    environ: Mapping[str, str] | None = None,
    netloc: str | None = None,
    from_yaml: Mapping[str, str] | None = None,
) -> Setting:
    """As :func:`resolve_backend`, with where the spec came from (``from_yaml``: what app.yaml set)."""
    given = [cli] if cli else []
    return deployment.resolve(given, netloc=netloc, environ=environ, from_yaml=from_yaml, default=default).default


def resolve_allow_non_finite(cli: bool | None, *, environ: Mapping[str, str] | None = None) -> bool:
    """``--allow-non-finite``, else ``MONAI_TRITON_ALLOW_NON_FINITE`` (1/true/yes/on), else False."""
    return deployment.is_set(cli, ENV_ALLOW_NON_FINITE, environ)


def resolve_flag(cli: bool | None, variable: str, *, environ: Mapping[str, str] | None = None) -> bool:
    """A switch: the flag, else the variable (1/true/yes/on), else False."""
    return deployment.is_set(cli, variable, environ)


def allow_non_finite_from(app_context: AppContext | None) -> bool:
    """What the app context (or, without one, the environment) says about NaN/Inf voxels."""
    if app_context is not None and ALLOW_NON_FINITE_ARG in app_context.args:
        return deployment.is_set(None, "", {"": str(app_context.args[ALLOW_NON_FINITE_ARG])})
    return resolve_allow_non_finite(None)


def init_app_context(argv: Sequence[str] | None = None, *, default_backend: str = DEFAULT_BACKEND) -> AppContext:
    """The App SDK's ``init_app_context`` plus our options, after the checks that need no graph.

    ``context.args`` gets ``deployment.context_args``: ``backend`` (the app-wide spec) and ``backend_source``,
    ``backend_map`` (the models with a backend of their own), ``model_name`` (an override or None),
    ``backend_options`` and ``model_backend_options``, ``preview`` and ``allow_non_finite``.
    """
    from monai.deploy.core import RuntimeEnv
    from monai.deploy.core import init_app_context as sdk_init_app_context

    argv = list(sys.argv if argv is None else argv)
    if any(a in _HELP for a in argv[1:]):
        app_parser(Path(argv[0]).name if argv else "app").print_help()
        raise SystemExit(exits.OK)
    args = app_parser(Path(argv[0]).name if argv else "app").parse_args(argv[1:])  # UsageError: one line
    from_yaml = app_settings.apply_app_environment(
        app_settings.read_app_environment(app_settings.app_yaml_of(argv[0] if argv else None))
    )
    ours, rest = _split(argv)
    netloc, rest = split_netloc_args(rest)
    given = deployment.Given(
        backends=ours.backend or (),
        netloc=netloc,
        options=_cli_options(ours),
        model_name=ours.model_name,
        preview=ours.preview,
        allow_non_finite=ours.allow_non_finite,
    )
    models_path = args.model or os.environ.get(ENV_MODEL_PATH)
    deployed = deployment.context_args(given, from_yaml=from_yaml, models_path=models_path, default=default_backend)
    _check_paths(args)
    level = args.log_level or console.DEFAULT_LEVEL
    console.configure_holoscan(level)
    # The netloc is ours now: the App SDK would also connect its own HTTP client (TritonRemoteModel) to every
    # TritonModel in the model folder, and that client (gevent, made on the main thread) crashes the Holoscan
    # run with a segmentation fault. So the App SDK gets neither -t nor TRITON_SERVER_NETLOC.
    runtime_env = RuntimeEnv()
    sdk_netloc = netloc or runtime_env.triton_server_netloc
    runtime_env.triton_server_netloc = ""
    context = sdk_init_app_context(rest if args.log_level else [*rest, "-l", level], runtime_env)
    context.triton_server_netloc = sdk_netloc
    interrupts.track_output(context.output_path)  # an interrupted run leaves no file of its own behind
    context.args.update(deployed)
    return context


def _check_paths(args: argparse.Namespace) -> None:
    """Input readable, model path present, output folder writable: what the App SDK's parser would only half check."""
    from monai.deploy.core import RuntimeEnv

    env = RuntimeEnv()
    preflight.check_input(args.input or env.input)
    # In a MAP the models come from HOLOSCAN_MODEL_PATH (no -m): a wrong one fails here, naming the variable.
    model = args.model or os.environ.get(ENV_MODEL_PATH)
    if model:
        if not args.model and not Path(model).exists():
            raise ModelNotFoundError(f"model repository {model!r} ({ENV_MODEL_PATH}) does not exist")
        preflight.check_model_configs(preflight.check_model_path(model))
    preflight.check_output_folder(args.output or env.output)


AppFactory = Callable[..., Any]


def run_app(app: str | AppFactory, argv: Sequence[str] | None = None) -> int:
    """Run an App SDK ``Application`` as a command; returns the exit code (``sys.exit(run_app(...))``).

    ``app`` is the class, or ``"module:Class"`` to import it only after the stack limit is raised
    (Holoscan checks it on import). With ``argv=None`` (a real process) ``sys.argv`` is used and the
    process may restart itself once with a larger stack (``console.prepare_process``).
    """
    args = list(sys.argv if argv is None else argv)
    if argv is None:  # a real process: Ctrl-C and SIGTERM end it within seconds, from any thread
        interrupts.block()  # held back across a restart (execv keeps the mask and pending signals)...
    console.prepare_process(restart=argv is None)
    if argv is None:
        interrupts.install_signal_handlers()  # ...and taken from here on, a signal that came meanwhile included
    level = console.level_from_argv(args)
    console.configure(level)

    def body() -> int:
        factory = _load(app)
        if any(a in _HELP for a in args[1:]):
            print(app_help(factory, args[0] if args else "app"))
            return exits.OK
        preflight.check_holoscan_options(args)
        instance = factory() if argv is None else factory(args)
        instance.run()
        return exits.OK

    return exits.run_guarded(body, debug=level == "DEBUG")


def app_help(app: Any, program: str) -> str:
    """The ``--help`` text of an app: its docstring's first line and every option it accepts."""
    doc = (getattr(app, "__doc__", None) or "").strip().splitlines()
    return app_parser(Path(program).name, doc[0] if doc else None).format_help()


def _load(app: str | AppFactory) -> AppFactory:
    if not isinstance(app, str):
        return app
    module_name, _, attribute = app.partition(":")
    module = importlib.import_module(module_name)
    factory: AppFactory = getattr(module, attribute)
    return factory
