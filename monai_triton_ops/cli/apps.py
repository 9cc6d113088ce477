"""``monai-triton exec``, ``backends`` and ``package``: run an app, list what it can run on, ship it as a MAP."""

from __future__ import annotations

import argparse
import runpy
import sys
from pathlib import Path
from typing import Any

from .. import console, exits
from ..errors import UsageError
from .parser import add_log_level


def add_exec(commands: argparse._SubParsersAction[Any]) -> None:
    p = commands.add_parser(
        "exec",
        help="run an App SDK application (folder with __main__.py, or a .py file)",
        epilog="Any other option goes to the app: --model-name, --preview, backend options (--timeout-s ...); "
        "'monai-triton backends' lists them.",
    )
    p.add_argument("app", type=Path, help="application folder (with __main__.py) or script")
    p.add_argument("-i", "--input", required=True, help="input file or folder")
    p.add_argument("-o", "--output", required=True, help="output folder (created if missing)")
    p.add_argument("-m", "--model", required=True, help="model repository folder")
    p.add_argument(
        "--backend", metavar="SPEC", help="where the model runs: torch (default), triton, grpc://H:P, http://H:P"
    )
    p.add_argument("-w", "--workdir", help="App SDK workspace folder, passed to the app")
    p.add_argument("-t", "--triton-server-netloc", metavar="HOST:PORT", help="App SDK option, passed to the app")
    p.add_argument("--allow-non-finite", action="store_true", help="run on images with NaN/Inf voxels")
    add_log_level(p)
    p.set_defaults(handler=_run_exec)


def _run_exec(args: argparse.Namespace) -> int:
    """Run the app in this process with the argv it would get from ``python APP ...``."""
    from .. import interrupts

    if args.process:  # Ctrl-C / SIGTERM held back across the restart, then taken by the watcher
        interrupts.block()
    console.prepare_process(restart=args.process)  # before anything imports Holoscan
    if args.process:
        interrupts.install_signal_handlers()
    app = args.app
    if not (app.is_file() or (app / "__main__.py").is_file()):
        raise UsageError(f"{str(app)!r} is neither a .py file nor a folder with __main__.py")
    if args.backend:
        from ..preflight import check_backend

        check_backend(args.backend)  # a reserved backend fails here, before the app is even imported
    argv = [str(app), "-i", args.input, "-o", args.output, "-m", args.model]
    for flag, value in (("--backend", args.backend), ("-l", args.log_level), ("-w", args.workdir),
                        ("-t", args.triton_server_netloc)):  # fmt: skip
        if value:
            argv += [flag, value]
    if args.allow_non_finite:
        argv.append("--allow-non-finite")
    argv += args.app_args
    saved, sys.argv = sys.argv, argv
    try:
        runpy.run_path(str(app), run_name="__main__")
    except SystemExit as exc:  # an app whose __main__ ends in sys.exit(run_app(...)) has reported already
        return exits.system_exit_code(exc)
    finally:
        sys.argv = saved
    return exits.OK


def add_backends(commands: argparse._SubParsersAction[Any]) -> None:
    p = commands.add_parser("backends", help="list every backend, whether it can run here and why not, and the options")
    add_log_level(p)
    p.set_defaults(handler=_run_backends)


def _run_backends(args: argparse.Namespace) -> int:
    from ..app_settings import backend_statuses, render_backends

    sys.stdout.write(render_backends(backend_statuses()))
    return exits.OK


def add_package(commands: argparse._SubParsersAction[Any]) -> None:
    p = commands.add_parser("package", help="build a MONAI Application Package (MAP): one image, every backend")
    p.add_argument("app", type=Path, help="application folder (with __main__.py) or .py file")
    p.add_argument("-m", "--models", type=Path, help="model repository folder (one model per subfolder) or model file")
    p.add_argument("-c", "--config", type=Path, help="the app's app.yaml (default: APP/app.yaml)")
    p.add_argument("-r", "--requirements", type=Path, help="the app's requirements.txt (default: APP's)")
    p.add_argument("-t", "--tag", help="image name:tag (default: the app folder's name and the app's version)")
    p.add_argument("-o", "--output", type=Path, help="build context folder (default: output/map/<app>)")
    p.add_argument("--version", dest="app_version", help="the MAP's version (default: application.version)")
    p.add_argument("--base-image", help="base image (default: Debian 12 made here with mmdebstrap, cached)")
    p.add_argument("--builder", choices=["auto", "docker", "buildah"], default="auto",
                   help="auto: docker with buildx if a daemon answers, else buildah (default: auto)")  # fmt: skip
    p.add_argument("--no-build", action="store_true", help="write the build context only")
    p.add_argument("--wheel", type=Path, help="monai_triton_ops wheel to install (default: built from this checkout)")
    p.add_argument("--constraint", action="append", type=Path, default=[], metavar="FILE",
                   help="pip constraints for the image, over this environment's versions (repeatable)")  # fmt: skip
    p.add_argument("--no-pin-environment", action="store_true",
                   help="do not pin the image's packages to the versions installed here")  # fmt: skip
    p.add_argument("--timeout", type=int, default=0, help="app.json#timeout in seconds, 0: none (default: 0)")
    add_log_level(p, default="INFO")
    p.set_defaults(handler=_run_package)


def _run_package(args: argparse.Namespace) -> int:
    from ..packaging import PackageRequest, package_app

    app = args.app.resolve()
    request = PackageRequest(
        app=app,
        models=args.models,
        output=args.output or Path("output") / "map" / (app.stem if app.is_file() else app.name),
        config=args.config,
        requirements=args.requirements,
        tag=args.tag,
        version=args.app_version,
        wheel=args.wheel,
        constraints=tuple(args.constraint),
        pin_environment=not args.no_pin_environment,
        timeout_s=args.timeout,
    )
    result = package_app(request, builder=args.builder, base_image=args.base_image, build=not args.no_build)
    context = result.context
    print(f"context {context.path}")
    print(f"base    {result.base_image}")
    if result.builder is None:
        print(f"image   not built (--no-build); build with: buildah bud --layers -t {context.tag} {context.path}")
        return exits.OK
    print(f"image   {context.tag} (built with {result.builder} in {result.build_s or 0:.0f} s)")
    mounts = "-v INPUT:/var/holoscan/input:ro -v OUTPUT:/var/holoscan/output"
    if result.builder == "docker":
        print(f"run     docker run --rm {mounts} [-e MONAI_TRITON_BACKEND=SPEC] {context.tag}")
    else:
        print(f'run     c=$(buildah from {context.tag}); buildah run {mounts} [-e MONAI_TRITON_BACKEND=SPEC] "$c" -- '
              '/var/holoscan/tools; buildah rm "$c"   (podman, docker, Kubernetes: docs/packaging.md)')  # fmt: skip
    return exits.OK
