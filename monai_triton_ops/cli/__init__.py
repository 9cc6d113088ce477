"""monai-triton: run App SDK apps on any backend; build, check and serve model repositories.

    monai-triton exec APP -i IN -o OUT -m MODELS [--backend [NAME=]SPEC ...] [--timeout-s 30 ...] [APP OPTIONS]
    monai-triton repo build MODEL -o REPO --name NAME [--flavor python|libtorch] [--input-shape 1,1,96,96,96 ...]
                            [--like CONFIG] [--input-name NAME ...] [--output-name NAME ...]
                            [--whole-volume [--max-volume-mb N]]
    monai-triton repo wrap REPO --name NAME [--max-volume-mb N] [--network-output NAME] [--force]
    monai-triton repo check [REPO] [--server URL]
    monai-triton repo describe MODEL
    monai-triton config MODEL [--name NAME] [same options as repo build]
    monai-triton convert MODEL|BUNDLE --to onnx|pt2 [-o OUT] [--tolerance 1e-4] [--input-shape B,C,D,H,W ...]
                         [--network FILE.py:FUNCTION] [--force]
    monai-triton serve REPO [--http-port N] [--grpc-port N] [--metrics-port N] [--server-path P]
    monai-triton backends
    monai-triton package APP -m MODELS [-c app.yaml] [-t TAG] [-o CONTEXT] [--base-image IMAGE] [--builder B]

Every command takes ``-l LEVEL`` (``console.py``) and ends in ``exits.py``: a failure is one line on
stderr and exit code 2 (bad input or usage), 3 (backend or server unavailable) or 1 (a bug), the
traceback only with ``-l DEBUG``. Imports are lazy, so ``--help`` and ``--version`` load no torch.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence

from .. import __version__, console, exits
from ..errors import UsageError
from . import apps, convert, repo, serve
from .parser import Parser


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the console script; returns the exit code."""
    try:
        line = sys.argv[1:] if argv is None else list(argv)
        parser = build_parser(exec_options=_command_of(line) == "exec")
        args, rest = parser.parse_known_args(line)
        if rest and args.command != "exec":  # exec hands the rest to the app, whose parser judges it
            parser.error(f"unrecognized arguments: {' '.join(rest)}")
        args.app_args = rest
    except UsageError as exc:
        return exits.report(exc)
    except SystemExit as exc:  # --help, --version
        return exits.system_exit_code(exc)
    args.process = argv is None  # a real process may restart itself (stack limit) before running an app
    level = args.log_level or args.default_level
    console.configure(level)
    return exits.run_guarded(lambda: args.handler(args), debug=level == "DEBUG")


def _command_of(line: Sequence[str]) -> str | None:
    """The command a command line names (its first word that is not an option)."""
    return next((word for word in line if not word.startswith("-")), None)


def build_parser(*, exec_options: bool = False) -> argparse.ArgumentParser:
    """Every command's parser; ``exec_options``: ``exec`` takes every backend option's flag (imports the backends)."""
    codes = ", ".join(f"{code} {text}" for code, text in exits.MEANINGS.items())
    parser = Parser(prog="monai-triton", description=(__doc__ or "").split("\n\n")[0], epilog=f"Exit codes: {codes}.")
    parser.add_argument("--version", action="version", version=f"monai-triton {__version__}")
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    apps.add_exec(commands, options=exec_options)
    repo.add_repo(commands)
    repo.add_config(commands)
    convert.add_convert(commands)
    serve.add_serve(commands)
    apps.add_backends(commands)
    apps.add_package(commands)
    return parser
