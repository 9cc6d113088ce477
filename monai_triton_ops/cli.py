"""``monai-triton``: thin command line over the library.

monai-triton exec APP -i IN -o OUT -m MODELS [--backend SPEC] [-l LEVEL]
monai-triton repo build MODEL -o REPO --name NAME [--flavor python|libtorch] [--input-shape 1,1,96,96,96 ...] [...]
monai-triton config MODEL [--name NAME] [same options as repo build]
monai-triton serve REPO [--http-port N] [--grpc-port N] [--metrics-port N] [--server-path P]
"""

from __future__ import annotations

import argparse
import logging
import runpy
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

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
    _add_repo(commands)
    _add_config(commands)
    _add_serve(commands)
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


def _add_repo(commands: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    repo = commands.add_parser("repo", help="model repository tools")
    actions = repo.add_subparsers(dest="action", required=True)
    p = actions.add_parser("build", help="write a TorchScript model into a Triton model repository")
    p.add_argument("-o", "--output", required=True, type=Path, help="model repository folder (created if missing)")
    p.add_argument("--name", required=True, help="model name: the folder name inside the repository")
    p.add_argument("--version", type=int, default=1, help="version folder (default: %(default)s)")
    p.add_argument("--force", action="store_true", help="replace an existing model of that name (all versions)")
    _add_model_options(p)
    p.set_defaults(handler=_run_repo_build)


def _add_config(commands: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = commands.add_parser("config", help="print the config.pbtxt that 'repo build' would write")
    p.add_argument("--name", help="model name (default: the model file name without its suffix)")
    _add_model_options(p)
    p.set_defaults(handler=_run_config)


def _add_model_options(p: argparse.ArgumentParser) -> None:
    """What describes the model and how Triton serves it; shared by 'repo build' and 'config'."""
    p.add_argument("model", type=Path, help="TorchScript file (.pt/.ts)")
    p.add_argument("--flavor", choices=["python", "libtorch"], default="python", help="default: %(default)s")
    p.add_argument(
        "--input-shape", action="append", type=_shape, metavar="D,D,...",
        help="example input shape, batch first; once per forward() argument (needed without MONAI metadata)",
    )  # fmt: skip
    p.add_argument("--input-dtype", action="append", metavar="DTYPE", help="per input (default: float32)")
    p.add_argument("--max-batch-size", type=int, default=0, help="0: batch dim is explicit (default)")
    p.add_argument("--bundle-metadata", type=Path, help="MONAI bundle folder or its configs/metadata.json")
    p.add_argument("--dynamic-batching", action="store_true", help="enable Triton's dynamic batcher")
    p.add_argument("--preferred-batch-size", type=int, nargs="+", default=[], metavar="N")
    p.add_argument("--max-queue-delay-us", type=int, help="dynamic batcher queue delay in microseconds")
    p.add_argument("--instance-kind", help="cpu, gpu, auto (or KIND_CPU, KIND_GPU, KIND_AUTO)")
    p.add_argument("--instance-count", type=int, help="model instances per device")
    p.add_argument("-l", "--log-level", type=str.upper, choices=["DEBUG", "INFO", "WARN", "ERROR", "CRITICAL"])


def _shape(text: str) -> tuple[int, ...]:
    try:
        dims = tuple(int(d) for d in text.replace("x", ",").split(","))
    except ValueError as exc:
        raise argparse.ArgumentTypeError(f"expected sizes like 1,1,96,96,96, got {text!r}") from exc
    if any(d < 1 for d in dims):
        raise argparse.ArgumentTypeError(f"sizes must be positive, got {text!r}")
    return dims


def _model_options(args: argparse.Namespace) -> dict[str, Any]:
    """Keyword arguments of ``generate_config`` / ``build_repository`` from the shared options."""
    from .repository.config import DynamicBatching, InstanceGroup

    batching = None
    if args.dynamic_batching or args.preferred_batch_size or args.max_queue_delay_us is not None:
        batching = DynamicBatching(
            preferred_batch_sizes=tuple(args.preferred_batch_size), max_queue_delay_us=args.max_queue_delay_us or 0
        )
    groups: tuple[InstanceGroup, ...] = ()
    if args.instance_kind is not None or args.instance_count is not None:
        groups = (InstanceGroup(kind=args.instance_kind or "KIND_AUTO", count=args.instance_count or 1),)
    return {
        "flavor": args.flavor,
        "input_shapes": args.input_shape,
        "input_dtypes": args.input_dtype,
        "max_batch_size": args.max_batch_size,
        "bundle_metadata": args.bundle_metadata,
        "dynamic_batching": batching,
        "instance_groups": groups,
    }


def _run_repo_build(args: argparse.Namespace) -> int:
    from .repository.builder import build_repository

    folder = build_repository(
        args.model, args.output, args.name, version=args.version, force=args.force, **_model_options(args)
    )
    print(f"wrote {folder}")
    return 0


def _run_config(args: argparse.Namespace) -> int:
    from .repository.builder import generate_config

    _, _, text = generate_config(args.model, args.name or args.model.stem, **_model_options(args))
    sys.stdout.write(text)
    return 0


def _add_serve(commands: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = commands.add_parser("serve", help="serve a model repository with a local tritonserver until Ctrl-C")
    p.add_argument("repository", type=Path, help="model repository folder")
    p.add_argument("--http-port", type=int, help="default: a free port")
    p.add_argument("--grpc-port", type=int, help="default: a free port")
    p.add_argument("--metrics-port", type=int, help="default: a free port")
    p.add_argument("--server-path", type=Path, help="tritonserver binary or install folder (default: wheel)")
    p.add_argument("--startup-timeout", type=float, default=120.0, help="seconds (default: %(default)s)")
    p.add_argument("--log-path", type=Path, help="keep the server log in this file")
    p.add_argument("-l", "--log-level", type=str.upper, choices=["DEBUG", "INFO", "WARN", "ERROR", "CRITICAL"])
    p.set_defaults(handler=_run_serve)


def _run_serve(args: argparse.Namespace) -> int:
    """Run the server in the foreground; print where it listens once it is ready."""
    from .server import LocalTritonServer
    from .server.foreground import run_in_foreground

    server = LocalTritonServer(
        args.repository,
        http_port=args.http_port,
        grpc_port=args.grpc_port,
        metrics_port=args.metrics_port,
        server_path=args.server_path,
        startup_timeout_s=args.startup_timeout,
        log_path=args.log_path,
    )

    def announce(server: LocalTritonServer) -> None:
        print(f"serving {args.repository} (pid {server.pid}); Ctrl-C to stop", flush=True)
        print(f"HTTP    {server.http_url}", flush=True)
        print(f"gRPC    {server.grpc_url}", flush=True)
        print(f"metrics {server.metrics_url}", flush=True)
        print(f"log     {server.log_path}", flush=True)

    return run_in_foreground(server, on_ready=announce)


if __name__ == "__main__":
    sys.exit(main())
