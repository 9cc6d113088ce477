"""Backend choice at run time for App SDK apps: ``--backend SPEC`` > ``MONAI_TRITON_BACKEND`` > app default.

The App SDK's ``parse_args`` rejects unknown options, so we extend rather than bypass it: our own
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
#: Key under which the resolved spec is stored in ``AppContext.args``.
BACKEND_ARG = "backend"


def backend_parser() -> argparse.ArgumentParser:
    """Our options alone; ``add_help=False`` so ``--help`` reaches the App SDK parser too."""
    parser = argparse.ArgumentParser(add_help=False)
    parser.add_argument(
        "--backend",
        metavar="SPEC",
        help=f"where the model runs: torch (default), triton, grpc://HOST:PORT, http://HOST:PORT (env {ENV_BACKEND})",
    )
    return parser


def split_backend_args(argv: Sequence[str]) -> tuple[str | None, list[str]]:
    """``(--backend value or None, argv without it)``; ``argv[0]`` is the program, as in ``sys.argv``."""
    known, rest = backend_parser().parse_known_args(list(argv[1:]))
    return known.backend, [argv[0], *rest] if argv else rest


def resolve_backend(
    cli: str | None, *, default: str = DEFAULT_BACKEND, environ: Mapping[str, str] | None = None
) -> str:
    """Command line first, then the environment, then the app's default; the result is validated."""
    env = os.environ if environ is None else environ
    spec = cli or env.get(ENV_BACKEND) or default
    parse_backend_spec(spec)  # a typo fails here, before any operator starts
    return spec


def init_app_context(argv: Sequence[str] | None = None, *, default_backend: str = DEFAULT_BACKEND) -> AppContext:
    """The App SDK's ``init_app_context`` plus ``--backend``; the spec lands in ``context.args['backend']``."""
    from monai.deploy.core import init_app_context as sdk_init_app_context

    argv = list(sys.argv if argv is None else argv)
    if any(a in ("-h", "--help") for a in argv[1:]):
        backend_parser().print_help()
    cli, rest = split_backend_args(argv)
    spec = resolve_backend(cli, default=default_backend)
    context = sdk_init_app_context(rest)
    context.args[BACKEND_ARG] = spec
    return context
