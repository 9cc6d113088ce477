"""monai-triton: run App SDK apps on any backend; build, check and serve model repositories.

    monai-triton exec APP -i IN -o OUT -m MODELS [--backend SPEC] [-w DIR] [-t HOST:PORT] [APP OPTIONS]
    monai-triton repo build MODEL -o REPO --name NAME [--flavor python|libtorch] [--input-shape 1,1,96,96,96 ...]
                            [--like CONFIG] [--input-name NAME ...] [--output-name NAME ...]
                            [--whole-volume [--max-volume-mb N]]
    monai-triton repo wrap REPO --name NAME [--max-volume-mb N] [--network-output NAME] [--force]
    monai-triton repo check [REPO] [--server URL]
    monai-triton repo describe MODEL
    monai-triton config MODEL [--name NAME] [same options as repo build]
    monai-triton serve REPO [--http-port N] [--grpc-port N] [--metrics-port N] [--server-path P]
    monai-triton backends
    monai-triton package APP -m MODELS [-c app.yaml] [-t TAG] [-o CONTEXT] [--base-image IMAGE] [--builder B]

Every command takes ``-l LEVEL`` (``console.py``) and ends in ``exits.py``: a failure is one line on
stderr and exit code 2 (bad input or usage), 3 (backend or server unavailable) or 1 (a bug), the
traceback only with ``-l DEBUG``. Imports are lazy, so ``--help`` and ``--version`` load no torch.
"""

from __future__ import annotations

import argparse
import runpy
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from . import __version__, console, exits
from .errors import ConfigError, UsageError


class _Parser(argparse.ArgumentParser):
    """Usage errors as one ``UsageError`` line (exit 2) instead of argparse's usage text."""

    def error(self, message: str) -> Any:
        raise UsageError(f"{self.prog}: {message} (see '{self.prog} --help')")


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the console script; returns the exit code."""
    try:
        parser = build_parser()
        args, rest = parser.parse_known_args(sys.argv[1:] if argv is None else list(argv))
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


def build_parser() -> argparse.ArgumentParser:
    codes = ", ".join(f"{code} {text}" for code, text in exits.MEANINGS.items())
    parser = _Parser(prog="monai-triton", description=(__doc__ or "").split("\n\n")[0], epilog=f"Exit codes: {codes}.")
    parser.add_argument("--version", action="version", version=f"monai-triton {__version__}")
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    _add_exec(commands)
    _add_repo(commands)
    _add_config(commands)
    _add_serve(commands)
    _add_backends(commands)
    _add_package(commands)
    return parser


def _add_log_level(p: argparse.ArgumentParser, default: str = console.DEFAULT_LEVEL) -> None:
    p.add_argument(
        "-l", "--log-level", type=str.upper, choices=console.LEVELS, metavar="LEVEL",
        help=f"DEBUG (everything: Holoscan's log, tracebacks), INFO, WARN, ERROR or CRITICAL (default: {default})",
    )  # fmt: skip
    p.set_defaults(default_level=default)


def _add_exec(commands: argparse._SubParsersAction[Any]) -> None:
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
    _add_log_level(p)
    p.set_defaults(handler=_run_exec)


def _run_exec(args: argparse.Namespace) -> int:
    """Run the app in this process with the argv it would get from ``python APP ...``."""
    from . import interrupts

    if args.process:  # Ctrl-C / SIGTERM held back across the restart, then taken by the watcher
        interrupts.block()
    console.prepare_process(restart=args.process)  # before anything imports Holoscan
    if args.process:
        interrupts.install()
    app = args.app
    if not (app.is_file() or (app / "__main__.py").is_file()):
        raise UsageError(f"{str(app)!r} is neither a .py file nor a folder with __main__.py")
    if args.backend:
        from .preflight import check_backend

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


def _add_repo(commands: argparse._SubParsersAction[Any]) -> None:
    repo = commands.add_parser("repo", help="model repository tools: build, check, describe")
    actions = repo.add_subparsers(dest="action", required=True, metavar="ACTION")
    p = actions.add_parser("build", help="write a TorchScript model or a MONAI bundle into a Triton model repository")
    p.add_argument("-o", "--output", required=True, type=Path, help="model repository folder (created if missing)")
    p.add_argument("--name", help="model name: the folder name inside the repository (default: --like's name)")
    p.add_argument("--version", type=int, default=1, help="version folder (default: %(default)s)")
    p.add_argument("--force", action="store_true", help="replace an existing model of that name (all versions)")
    p.add_argument(
        "--whole-volume", action="store_true",
        help="also write NAME_volume: the sliding window on the server, for clients in mode=volume (repo wrap)",
    )  # fmt: skip
    _add_volume_limit(p)
    _add_model_options(p)
    _add_config_name(p)
    p.set_defaults(handler=_run_repo_build)
    p = actions.add_parser(
        "wrap", help="add NAME_volume next to model NAME: whole volumes in, MONAI's sliding window on the server"
    )
    p.add_argument("repository", type=Path, help="model repository holding NAME (with its config.pbtxt)")
    p.add_argument("--name", required=True, help="the network's model name; the new model is NAME_volume")
    p.add_argument("--network-output", metavar="NAME", help="the network output to blend (default: the first)")
    _add_volume_limit(p)
    p.add_argument(
        "--max-in-flight", type=int, default=2, metavar="N",
        help="network requests one volume keeps in flight (default: %(default)s)",
    )  # fmt: skip
    p.add_argument("--instance-kind", default="cpu", help="where the blending runs: cpu (default) or gpu")
    p.add_argument("--instance-count", type=int, default=1, help="volumes served at once (default: %(default)s)")
    p.add_argument("--force", action="store_true", help="replace an existing NAME_volume")
    _add_log_level(p)
    p.set_defaults(handler=_run_repo_wrap)
    p = actions.add_parser(
        "check", help="parse every model's config.pbtxt, compare it with the model file (and a server), list all"
    )
    p.add_argument("repository", type=Path, nargs="?", help="model repository, or one model folder")
    p.add_argument(
        "--server", metavar="URL",
        help="also list what this Triton serves and compare each local config with it "
        "(grpc://HOST:PORT, http://HOST:PORT, or HOST:PORT as the App SDK's -t)",
    )  # fmt: skip
    p.add_argument("--timeout", type=float, default=10.0, help="seconds per server call (default: %(default)s)")
    _add_config_name(p)
    _add_log_level(p)
    p.set_defaults(handler=_run_repo_check)
    p = actions.add_parser("describe", help="print a model's signature: named inputs and outputs, dtypes, shapes")
    p.add_argument("model", type=Path, help="a model file (.pt/.ts/.pt2), or a model folder <repo>/<name>")
    p.add_argument("--input-shape", action="append", type=_shape, metavar="D,D,...", help="probe shape, batch first")
    p.add_argument("--bundle-metadata", type=Path, help="MONAI bundle folder or its configs/metadata.json")
    _add_config_name(p)
    _add_log_level(p)
    p.set_defaults(handler=_run_repo_describe)


def _add_config_name(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--config-name", action="append", metavar="NAME",
        help="for a MONAI bundle: a config of configs/ to read, merged in order (default: inference)",
    )  # fmt: skip


def _add_volume_limit(p: argparse.ArgumentParser) -> None:
    from .repository.volume import DEFAULT_MAX_VOLUME_MB

    p.add_argument(
        "--max-volume-mb", type=int, default=DEFAULT_MAX_VOLUME_MB, metavar="N",
        help="the largest volume NAME_volume accepts, in MB of input (default: %(default)s; the server needs "
        "several times that, see docs/remote.md)",
    )  # fmt: skip


def _add_config(commands: argparse._SubParsersAction[Any]) -> None:
    p = commands.add_parser("config", help="print the config.pbtxt that 'repo build' would write")
    p.add_argument("--name", help="model name (default: --like's name, else the model file name without suffix)")
    _add_model_options(p)
    p.set_defaults(handler=_run_config)


def _add_model_options(p: argparse.ArgumentParser) -> None:
    """What describes the model and how Triton serves it; shared by 'repo build' and 'config'."""
    p.add_argument("model", type=Path, help="TorchScript file (.pt/.ts)")
    p.add_argument(
        "--like", type=Path, metavar="CONFIG",
        help="an existing config.pbtxt (or its model folder) to take names, dims, batching, instances, version "
        "policy, parameters and the model file name from; the options below override it",
    )  # fmt: skip
    p.add_argument(
        "--flavor", choices=["python", "libtorch"],
        help="python: a runner for the wheel's server; libtorch: NGC containers (default: --like's, else python)",
    )  # fmt: skip
    p.add_argument("--input-name", action="append", metavar="NAME", help="input tensor name; once per input, in order")
    p.add_argument("--output-name", action="append", metavar="NAME", help="output tensor name; once per output")
    p.add_argument(
        "--input-shape", action="append", type=_shape, metavar="D,D,...",
        help="example input shape, batch first; once per forward() argument (needed without MONAI metadata)",
    )  # fmt: skip
    p.add_argument("--input-dtype", action="append", metavar="DTYPE", help="per input (default: float32)")
    p.add_argument("--max-batch-size", type=int, help="0: batch dim is explicit (default: --like's, else 0)")
    p.add_argument("--bundle-metadata", type=Path, help="MONAI bundle folder or its configs/metadata.json")
    p.add_argument("--dynamic-batching", action="store_true", help="enable Triton's dynamic batcher")
    p.add_argument("--preferred-batch-size", type=int, nargs="+", default=[], metavar="N",
                   help="batch sizes the dynamic batcher aims for (enables it)")  # fmt: skip
    p.add_argument("--max-queue-delay-us", type=int, help="dynamic batcher queue delay in microseconds")
    p.add_argument("--instance-kind", help="cpu, gpu, auto (or KIND_CPU, KIND_GPU, KIND_AUTO); every group")
    p.add_argument("--instance-count", type=int, help="model instances per device")
    p.add_argument(
        "--version-policy", type=_version_policy, metavar="POLICY",
        help="which versions Triton serves: latest:N, all, or specific:1,3",
    )  # fmt: skip
    p.add_argument("--parameter", action="append", type=_parameter, metavar="KEY=VALUE",
                   help="a string parameter, e.g. DISABLE_OPTIMIZED_EXECUTION=true (repeatable)")  # fmt: skip
    p.add_argument("--model-filename", metavar="FILE", help="the TorchScript file name in the version folder")
    _add_log_level(p)


def _shape(text: str) -> tuple[int, ...]:
    try:
        dims = tuple(int(d) for d in text.replace("x", ",").split(","))
    except ValueError as exc:
        raise argparse.ArgumentTypeError(f"expected sizes like 1,1,96,96,96, got {text!r}") from exc
    if any(d < 1 for d in dims):
        raise argparse.ArgumentTypeError(f"sizes must be positive, got {text!r}")
    return dims


def _version_policy(text: str) -> Any:
    from .repository.config import VersionPolicy

    kind, _, value = text.partition(":")
    try:
        if kind == "all" and not value:
            return VersionPolicy(all=True)
        if kind == "latest":
            return VersionPolicy(latest=int(value))
        if kind == "specific":
            return VersionPolicy(specific=tuple(int(v) for v in value.split(",")))
    except (ValueError, ConfigError) as exc:
        raise argparse.ArgumentTypeError(f"{text!r}: {exc}") from exc
    raise argparse.ArgumentTypeError(f"expected latest:N, all or specific:1,3, got {text!r}")


def _parameter(text: str) -> tuple[str, str]:
    key, sep, value = text.partition("=")
    if not sep or not key:
        raise argparse.ArgumentTypeError(f"expected KEY=VALUE, got {text!r}")
    return key, value


def _model_options(args: argparse.Namespace) -> dict[str, Any]:
    """Keyword arguments of ``generate_config`` / ``build_repository`` from the shared options."""
    from .repository.config import DynamicBatching

    batching = None
    if args.dynamic_batching or args.preferred_batch_size or args.max_queue_delay_us is not None:
        batching = DynamicBatching(
            preferred_batch_sizes=tuple(args.preferred_batch_size), max_queue_delay_us=args.max_queue_delay_us or 0
        )
    return {
        "like": args.like,
        "flavor": args.flavor,
        "input_shapes": args.input_shape,
        "input_dtypes": args.input_dtype,
        "max_batch_size": args.max_batch_size,
        "bundle_metadata": args.bundle_metadata,
        "dynamic_batching": batching,
        "instance_kind": args.instance_kind,
        "instance_count": args.instance_count,
        "version_policy": args.version_policy,
        "parameters": dict(args.parameter or ()),
        "model_filename": args.model_filename,
        "input_names": args.input_name,
        "output_names": args.output_name,
    }


def _run_repo_build(args: argparse.Namespace) -> int:
    from .bundles import DEFAULT_CONFIG_NAMES
    from .repository.builder import build_repository, generate_config
    from .repository.bundle import build_bundle, bundle_target
    from .repository.volume import plan_volume, wrap_network

    options = _model_options(args)
    if bundle_target(args.model):  # a MONAI bundle: its network, names from its metadata, its configs beside
        options.pop("bundle_metadata")
        folder = build_bundle(args.model, args.output, args.name, version=args.version, force=args.force,
                              config_names=args.config_name or DEFAULT_CONFIG_NAMES, **options)  # fmt: skip
    else:
        if args.whole_volume:  # a network that cannot be wrapped is refused before anything is written
            signature, _, _ = generate_config(args.model, args.name, **options)
            plan_volume(signature, max_volume_mb=args.max_volume_mb)
        folder = build_repository(args.model, args.output, args.name, version=args.version, force=args.force,
                                  **options)  # fmt: skip
    print(f"wrote {folder}")
    if args.whole_volume:
        print(f"wrote {wrap_network(args.output, folder.name, max_volume_mb=args.max_volume_mb, force=args.force)}")
    return exits.OK


def _run_repo_wrap(args: argparse.Namespace) -> int:
    from .repository.volume import wrap_network

    folder = wrap_network(
        args.repository,
        args.name,
        output=args.network_output,
        max_volume_mb=args.max_volume_mb,
        max_in_flight=args.max_in_flight,
        instance_kind=args.instance_kind,
        instance_count=args.instance_count,
        force=args.force,
    )
    print(f"wrote {folder}")
    return exits.OK


def _run_repo_check(args: argparse.Namespace) -> int:
    from .repository.check import EntryReport, check_repository, render_reports

    if args.repository is None and args.server is None:
        raise UsageError("monai-triton repo check: give a model repository, --server URL, or both")
    from .repository.bundle import bundle_target, check_bundle

    reports: list[EntryReport] = []
    if args.repository is not None and bundle_target(args.repository):
        reports = [check_bundle(args.repository, args.config_name or ("inference",))]
    elif args.repository is not None:
        reports = check_repository(args.repository)
    if args.server is not None:
        from .repository.served import ServerView, against_server, render_served

        with ServerView(args.server, timeout_s=args.timeout) as view:
            served = view.models()
        sys.stdout.write(render_served(served, args.server))
        reports = against_server(reports, served, args.server)
        failed_served = [m.name for m in served if m.state != "READY"]
        if failed_served and args.repository is None:
            raise ConfigError(
                f"{len(failed_served)} of {len(served)} model(s) on the server are not ready: {failed_served}"
            )
    if args.repository is not None and not reports:
        print(f"warning: model repository {str(args.repository)!r} holds no models", file=sys.stderr)
        return exits.OK
    if reports:
        sys.stdout.write(render_reports(reports))
    failed = [r.name for r in reports if r.problems]
    if failed:
        raise ConfigError(f"{len(failed)} of {len(reports)} model(s) have problems (listed above): {failed}")
    return exits.OK


def _run_repo_describe(args: argparse.Namespace) -> int:
    from .repository.bundle import bundle_target, describe_bundle
    from .repository.check import describe_path, render_description

    if bundle_target(args.model):
        sys.stdout.write(render_description(describe_bundle(args.model, args.config_name or ("inference",))))
        return exits.OK
    sys.stdout.write(render_description(describe_path(args.model, args.input_shape, args.bundle_metadata)))
    return exits.OK


def _run_config(args: argparse.Namespace) -> int:
    from .repository.builder import generate_config

    name = args.name or (None if args.like else args.model.stem)
    _, _, text = generate_config(args.model, name, **_model_options(args))
    sys.stdout.write(text)
    return exits.OK


def _add_serve(commands: argparse._SubParsersAction[Any]) -> None:
    p = commands.add_parser("serve", help="serve a model repository with a local tritonserver until Ctrl-C")
    p.add_argument("repository", type=Path, help="model repository folder")
    p.add_argument("--http-port", type=int, help="default: a free port")
    p.add_argument("--grpc-port", type=int, help="default: a free port")
    p.add_argument("--metrics-port", type=int, help="default: a free port")
    p.add_argument("--server-path", type=Path, help="tritonserver binary or install folder (default: wheel)")
    p.add_argument("--startup-timeout", type=float, default=120.0, help="seconds (default: %(default)s)")
    p.add_argument("--log-path", type=Path, help="keep the server log in this file")
    _add_log_level(p, default="INFO")
    p.set_defaults(handler=_run_serve)


def _run_serve(args: argparse.Namespace) -> int:
    """Run the server in the foreground; print where it listens and what it serves once it is ready."""
    from .server import LocalTritonServer
    from .server.foreground import run_in_foreground
    from .server.health import repository_index

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
    )

    def announce(server: LocalTritonServer) -> None:
        print(f"serving {args.repository} (pid {server.pid}); Ctrl-C to stop", flush=True)
        print(f"HTTP    {server.http_url}", flush=True)
        print(f"gRPC    {server.grpc_url}", flush=True)
        print(f"metrics {server.metrics_url}", flush=True)
        print(f"log     {server.log_path}", flush=True)
        index = repository_index(server.http_url, timeout_s=10.0) or []
        for entry in sorted(index, key=lambda e: str(e.get("name"))):
            print(f"model   {entry.get('name')} version {entry.get('version') or '?'} {entry.get('state')}", flush=True)

    return run_in_foreground(server, on_ready=announce)


def _add_backends(commands: argparse._SubParsersAction[Any]) -> None:
    p = commands.add_parser("backends", help="list every backend, whether it can run here and why not, and the options")
    _add_log_level(p)
    p.set_defaults(handler=_run_backends)


def _run_backends(args: argparse.Namespace) -> int:
    from .app_settings import backend_statuses, render_backends

    sys.stdout.write(render_backends(backend_statuses()))
    return exits.OK


def _add_package(commands: argparse._SubParsersAction[Any]) -> None:
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
    _add_log_level(p, default="INFO")
    p.set_defaults(handler=_run_package)


def _run_package(args: argparse.Namespace) -> int:
    from .packaging import PackageRequest, package_app

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


def _model_folders(repository: Path) -> list[Path]:
    if not repository.is_dir():
        return [repository]  # not a folder: the server says so, with its own error
    return [p for p in repository.iterdir() if p.is_dir() and not p.name.startswith(".")]


if __name__ == "__main__":
    sys.exit(main())
