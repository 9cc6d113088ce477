"""``monai-triton serve``: a model repository on a local tritonserver, in the foreground until Ctrl-C."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

from .parser import add_log_level


def add_serve(commands: argparse._SubParsersAction[Any]) -> None:
    p = commands.add_parser("serve", help="serve a model repository with a local tritonserver until Ctrl-C")
    p.add_argument("repository", type=Path, help="model repository folder")
    p.add_argument("--http-port", type=int, help="default: a free port")
    p.add_argument("--grpc-port", type=int, help="default: a free port")
    p.add_argument("--metrics-port", type=int, help="default: a free port")
    p.add_argument("--server-path", type=Path, help="tritonserver binary or install folder (default: wheel)")
    p.add_argument("--startup-timeout", type=float, default=120.0, help="seconds (default: %(default)s)")
    p.add_argument("--log-path", type=Path, help="keep the server log in this file")
    p.add_argument(
        "--model-load-thread-count",
        type=int,
        help="models loaded at once (default: Triton's, 4)",
    )
    add_log_level(p, default="INFO")
    p.set_defaults(handler=_run_serve)


def _run_serve(args: argparse.Namespace) -> int:
    """Run the server in the foreground; print where it listens and what it serves once it is ready."""
    from ..client.loopback import repository_index
    from ..client.timeouts import CONTROL_TIMEOUT_S
    from ..server import LocalTritonServer
    from ..server.foreground import run_in_foreground

    if not _model_folders(args.repository):
        print(f"warning: model repository {str(args.repository)!r} holds no models; serving nothing", file=sys.stderr)
    server = LocalTritonServer(
        args.repository,
        http_port=args.http_port,
        grpc_port=args.grpc_port,
        metrics_port=args.metrics_port,
        server_path=args.server_path,
        startup_timeout_s=args.startup_timeout,
        log_path=args.log_path,
        model_load_thread_count=args.model_load_thread_count,
    )

    def announce(server: LocalTritonServer) -> None:
        print(f"serving {args.repository} (pid {server.pid}); Ctrl-C to stop", flush=True)
        print(f"HTTP    {server.http_url}", flush=True)
        print(f"gRPC    {server.grpc_url}", flush=True)
        print(f"metrics {server.metrics_url}", flush=True)
        print(f"log     {server.log_path}", flush=True)
        index = repository_index(server.http_url, timeout_s=CONTROL_TIMEOUT_S) or []
        for entry in sorted(index, key=lambda e: str(e.get("name"))):
            print(f"model   {entry.get('name')} version {entry.get('version') or '?'} {entry.get('state')}", flush=True)

    return run_in_foreground(server, on_ready=announce)


def _model_folders(repository: Path) -> list[Path]:
    if not repository.is_dir():
        return [repository]  # not a folder: the server says so, with its own error
    return [p for p in repository.iterdir() if p.is_dir() and not p.name.startswith(".")]
