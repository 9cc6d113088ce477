"""``monai-triton``: thin command line over the library.

    monai-triton exec APP -i IN -o OUT -m MODELS [--backend SPEC] [-l LEVEL]
"""

from __future__ import annotations

import argparse
import logging
import runpy
import sys
from collections.abc import Sequence
from pathlib import Path

from .errors import MonaiTritonError

logger = logging.getLogger(__name__)


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the console script; returns the exit code."""
    parser = build_parser()
    args = parser.parse_args(argv)
    logging.basicConfig(level=getattr(args, "log_level", None) or "INFO", format="%(levelname)s %(name)s: %(message)s")
    try:
        return int(args.handler(args) or 0)
    except MonaiTritonError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="monai-triton", description=__doc__.split("\n\n")[0])
    commands = parser.add_subparsers(dest="command", required=True)
    _add_exec(commands)
    return parser


def _add_exec(commands: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = commands.add_parser("exec", help="run an App SDK application (folder with __main__.py, or a .py file)")
    p.add_argument("app", type=Path, help="application folder or script")
    p.add_argument("-i", "--input", required=True, help="input file or folder")
    p.add_argument("-o", "--output", required=True, help="output folder")
    p.add_argument("-m", "--model", required=True, help="model repository folder")
    p.add_argument("--backend", help="backend spec: torch, triton, grpc://HOST:PORT, http://HOST:PORT")
    p.add_argument("-l", "--log-level", type=str.upper, choices=["DEBUG", "INFO", "WARN", "ERROR", "CRITICAL"])
    p.set_defaults(handler=_run_exec)


def _run_exec(args: argparse.Namespace) -> int:
    """Run the app in this process with the argv it would get from ``python APP ...``."""
    app = args.app
    if not (app.is_file() or (app / "__main__.py").is_file()):
        print(f"error: {str(app)!r} is neither a .py file nor a folder with __main__.py", file=sys.stderr)
        return 2
    argv = [str(app), "-i", args.input, "-o", args.output, "-m", args.model]
    if args.backend:
        argv += ["--backend", args.backend]
    if args.log_level:
        argv += ["-l", args.log_level]
    saved, sys.argv = sys.argv, argv
    try:
        runpy.run_path(str(app), run_name="__main__")
    finally:
        sys.argv = saved
    return 0


if __name__ == "__main__":
    sys.exit(main())
