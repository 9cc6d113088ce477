"""Backend choice at run time for App SDK apps, first match wins:

    --backend SPEC                      explicit choice (command line)
    -t/--triton-server-netloc H:P       the App SDK's own remote option -> http://H:P (HTTP, as in the App SDK)
    MONAI_TRITON_BACKEND=SPEC           explicit choice (environment)
    TRITON_SERVER_NETLOC=H:P            the App SDK's environment variable -> http://H:P
    the app's default                   usually ``torch``

So an App SDK app started with ``-t`` runs on the remote backend unchanged, and ``--backend`` always
wins. The App SDK's ``parse_args`` rejects unknown options, so we extend rather than bypass it: our own
parser takes ``--backend`` off the command line (``-t`` stays, for the App SDK), and every other argument
still goes through the App SDK's parser (``-i``, ``-o``, ``-m``, ``-l``...), which keeps validating them.
The ``parse_args`` rejects unknown options, so we extend rather than bypass it: our own
parser takes ``--backend`` off the command line, and every other argument still goes through the
App SDK's parser (``-i``, ``-o``, ``-m``, ``-l``...), which keeps validating them as before.
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING

from .backends.registry import DEFAULT_BACKEND, parse_backend_spec

if TYPE_CHECKING:
    from monai.deploy.core import AppContext

ENV_BACKEND = "MONAI_TRITON_BACKEND"
#: The App SDK's own variable for a Triton server's ``HOST:PORT`` (its ``-t/--triton-server-netloc``).
ENV_NETLOC = "TRITON_SERVER_NETLOC"
#: Key under which the resolved spec is stored in ``AppContext.args``.
BACKEND_ARG = "backend"


def backend_parser() -> argparse.ArgumentParser:
    """Our options alone; ``add_help=False`` so ``--help`` reaches the App SDK parser too."""
    parser = argparse.ArgumentParser(add_help=False)
    parser.add_argument(
        "--backend",
        metavar="SPEC",
        help=(
            f"where the model runs: torch (default), triton, grpc://HOST:PORT, http://HOST:PORT (env {ENV_BACKEND}); "
            f"wins over the App SDK's -t HOST:PORT / {ENV_NETLOC}, which mean http://HOST:PORT"
        ),
    )
    return parser


def split_backend_args(argv: Sequence[str]) -> tuple[str | None, list[str]]:
    """``(--backend value or None, argv without it)``; ``argv[0]`` is the program, as in ``sys.argv``."""
    known, rest = backend_parser().parse_known_args(list(argv[1:]))
    return known.backend, [argv[0], *rest] if argv else rest


def split_netloc_args(argv: Sequence[str]) -> tuple[str | None, list[str]]:
    """``(-t/--triton-server-netloc value or None, argv without it)``, like :func:`split_backend_args`."""
    parser = argparse.ArgumentParser(add_help=False)
    parser.add_argument("-t", "--triton-server-netloc")
    known, rest = parser.parse_known_args(list(argv[1:]))
    return known.triton_server_netloc or None, [argv[0], *rest] if argv else rest


def netloc_of(argv: Sequence[str]) -> str | None:
    """The App SDK's ``-t/--triton-server-netloc`` value in ``argv``, if any."""
    return split_netloc_args(argv)[0]


def netloc_spec(netloc: str | None) -> str | None:
    """``HOST:PORT`` -> ``http://HOST:PORT`` (the App SDK's client is HTTP); a full spec is kept as is."""
    if not netloc:
        return None
    return netloc if "://" in netloc else f"http://{netloc}"


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
    env = os.environ if environ is None else environ
    spec = cli or netloc_spec(netloc) or env.get(ENV_BACKEND) or netloc_spec(env.get(ENV_NETLOC)) or default
    parse_backend_spec(spec)  # a typo fails here, before any operator starts
    return spec


def init_app_context(argv: Sequence[str] | None = None, *, default_backend: str = DEFAULT_BACKEND) -> AppContext:
    """The App SDK's ``init_app_context`` plus ``--backend`` and ``-t``; the spec is in ``context.args['backend']``."""
    from monai.deploy.core import RuntimeEnv
    from monai.deploy.core import init_app_context as sdk_init_app_context

    argv = list(sys.argv if argv is None else argv)
    if any(a in ("-h", "--help") for a in argv[1:]):
        backend_parser().print_help()
    cli, rest = split_backend_args(argv)
    netloc, rest = split_netloc_args(rest)
    spec = resolve_backend(cli, default=default_backend, netloc=netloc)
    # The netloc is ours now: the App SDK would also connect its own HTTP client (TritonRemoteModel) to every
    # TritonModel in the model folder, and that client (gevent, made on the main thread) crashes the Holoscan
    # run with a segmentation fault. So the App SDK gets neither -t nor TRITON_SERVER_NETLOC.
    runtime_env = RuntimeEnv()
    sdk_netloc = netloc or runtime_env.triton_server_netloc
    runtime_env.triton_server_netloc = ""
    context = sdk_init_app_context(rest, runtime_env)
    context.triton_server_netloc = sdk_netloc
    context.args[BACKEND_ARG] = spec
    return context
