"""``monai-triton exec``, ``backends`` and ``package``: run an app, list what it can run on, ship it as a MAP."""

from __future__ import annotations

import argparse
import os
import runpy
import sys
from pathlib import Path
from typing import Any

from .. import console, exits
from ..errors import UsageError
from .parser import add_log_level


def add_exec(commands: argparse._SubParsersAction[Any], *, options: bool = False) -> None:
    """``exec``; with ``options``, a flag for every backend option too (that imports the backends: only for exec)."""
    p = commands.add_parser(
        "exec",
        help="run an App SDK application (folder with __main__.py, or a .py file)",
        epilog="Our options, before or after APP, reach the app as its environment (MONAI_TRITON_*), so that an app "
        "whose own App SDK parser knows none of them takes them too; every other option goes to the app. "
        "'monai-triton backends' lists the backend options.",
    )
    p.add_argument("app", type=Path, help="application folder (with __main__.py) or script")
    p.add_argument("-i", "--input", required=True, help="input file or folder")
    p.add_argument("-o", "--output", required=True, help="output folder (created if missing)")
    p.add_argument("-m", "--model", required=True, help="models folder (a model per folder) or one model")
    p.add_argument(
        "--backend", metavar="[NAME=]SPEC", action="append", default=[],
        help="where the models run: torch (default), triton, grpc://H:P, http://H:P; NAME=SPEC for the model NAME "
        "(repeatable; env MONAI_TRITON_BACKEND, values separated by ';')",
    )  # fmt: skip
    p.add_argument("--model-name", metavar="NAME", help="the model to run instead of the code's (CODE=NAME,...)")
    p.add_argument("--preview", action="store_true", help="also write preview.png")
    p.add_argument("--allow-non-finite", action="store_true", help="run on images with NaN/Inf voxels")
    p.add_argument("-w", "--workdir", help="App SDK workspace folder, passed to the app")
    p.add_argument("-t", "--triton-server-netloc", metavar="HOST:PORT", help="App SDK option, passed to the app")
    if options:
        from ..app_settings import backend_option_names, flag_of, option_help

        for option, schemes in backend_option_names().items():
            p.add_argument(flag_of(option), **option_help(option, schemes))
    add_log_level(p)
    p.set_defaults(handler=_run_exec)


def _run_exec(args: argparse.Namespace) -> int:
    """Run the app in this process with the argv ``python APP ...`` gives it, and our options as its environment."""
    from .. import interrupts

    if args.process:  # Ctrl-C / SIGTERM held back across the restart, then taken by the watcher
        interrupts.block()
    console.prepare_process(restart=args.process)  # before anything imports Holoscan
    if args.process:
        interrupts.install_signal_handlers()
    app = args.app
    if not (app.is_file() or (app / "__main__.py").is_file()):
        raise UsageError(f"{str(app)!r} is neither a .py file nor a folder with __main__.py")
    _check_backends(args.backend, args.model)  # a bad or reserved backend fails here, before the app is imported
    argv = [str(app), "-i", args.input, "-o", args.output, "-m", args.model]
    for flag, value in (("-l", args.log_level), ("-w", args.workdir), ("-t", args.triton_server_netloc)):
        if value:
            argv += [flag, value]
    argv += args.app_args
    saved, sys.argv = sys.argv, argv
    saved_env = dict(os.environ)
    os.environ.update(exec_environment(args))
    try:
        runpy.run_path(str(app), run_name="__main__")
    except SystemExit as exc:  # an app whose __main__ ends in sys.exit(run_app(...)) has reported already
        return exits.system_exit_code(exc)
    finally:
        sys.argv = saved
        os.environ.clear()
        os.environ.update(saved_env)
    return exits.OK


def _check_backends(values: list[str], models: str) -> None:
    """Each spec parses and can be imported here, no model has two, and each ``NAME`` is a model folder of ``-m``."""
    from ..deployment import check_models, resolve
    from ..preflight import check_backend

    if not values:
        return
    choice = resolve(values, environ={})
    for spec in dict.fromkeys([choice.default.value, *(s.value for s in choice.models.values())]):
        check_backend(spec)
    check_models(choice, models)


def exec_environment(args: argparse.Namespace) -> dict[str, str]:
    """``exec``'s own options as the app's environment, listed in ``MONAI_TRITON_COMMAND_LINE`` (they rank as the
    command line): the App SDK's parser refuses options it does not know, an app with ours reads them there too."""
    from ..app_settings import ENV_MODEL_NAME, env_of
    from ..deployment import ENV_ALLOW_NON_FINITE, ENV_BACKEND, ENV_COMMAND_LINE, ENV_PREVIEW, SEPARATOR

    env: dict[str, str] = {}
    if args.backend:
        env[ENV_BACKEND] = SEPARATOR.join(args.backend)
    if args.model_name:
        env[ENV_MODEL_NAME] = args.model_name
    for flag, variable in ((args.preview, ENV_PREVIEW), (args.allow_non_finite, ENV_ALLOW_NON_FINITE)):
        if flag:
            env[variable] = "1"
    prefix = "option_"
    env.update({env_of(k[len(prefix) :]): v for k, v in vars(args).items() if k.startswith(prefix) and v is not None})
    if env:
        env[ENV_COMMAND_LINE] = ",".join(sorted(env))
    return env


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
