"""``monai-triton repo build | wrap | check | describe`` and ``config``: model repositories from the command line."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

from .. import exits
from ..errors import ConfigError, UsageError
from .parser import add_log_level


def add_repo(commands: argparse._SubParsersAction[Any]) -> None:
    repo = commands.add_parser("repo", help="model repository tools: build, check, describe")
    actions = repo.add_subparsers(dest="action", required=True, metavar="ACTION")
    p = actions.add_parser(
        "build", help="write a TorchScript model, a MONAI bundle or a models folder into a Triton model repository"
    )
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
    add_log_level(p)
    p.set_defaults(handler=_run_repo_wrap)
    p = actions.add_parser(
        "check", help="parse every model's config.pbtxt, compare it with the model file (and a server), list all"
    )
    p.add_argument("repository", type=Path, nargs="?", help="model repository, or one model folder")
    p.add_argument(
        "--server", metavar="URL",
        help="also list what this Triton serves and compare each local config with it "
        "(grpc://HOST:PORT, grpcs://, http://HOST:PORT, https://, or HOST:PORT as the App SDK's -t)",
    )  # fmt: skip
    # client.timeouts.CONTROL_TIMEOUT_S, written out so that --help imports no server module (tests/test_cli.py)
    p.add_argument("--timeout", type=float, default=10.0, help="seconds per server call (default: %(default)s)")
    _add_credentials(p)
    _add_config_name(p)
    add_log_level(p)
    p.set_defaults(handler=_run_repo_check)
    p = actions.add_parser("describe", help="print a model's signature: named inputs and outputs, dtypes, shapes")
    p.add_argument("model", type=Path, help="a model file (.pt/.ts/.pt2), or a model folder <repo>/<name>")
    p.add_argument("--input-shape", action="append", type=_shape, metavar="D,D,...", help="probe shape, batch first")
    p.add_argument("--bundle-metadata", type=Path, help="MONAI bundle folder or its configs/metadata.json")
    p.add_argument(
        "--ensemble", metavar="A,B,...",
        help="MODEL is a models folder: describe these models as one ensemble (do they predict the same channels)",
    )  # fmt: skip
    _add_config_name(p)
    add_log_level(p)
    p.set_defaults(handler=_run_repo_describe)


def _add_config_name(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--config-name", action="append", metavar="NAME",
        help="for a MONAI bundle: a config of configs/ to read, merged in order (default: inference)",
    )  # fmt: skip


def _add_volume_limit(p: argparse.ArgumentParser) -> None:
    from ..volume_spec import DEFAULT_MAX_VOLUME_MB

    p.add_argument(
        "--max-volume-mb", type=int, default=DEFAULT_MAX_VOLUME_MB, metavar="N",
        help="the largest volume NAME_volume accepts, in MB of input (default: %(default)s; the server needs "
        "several times that, see docs/remote.md)",
    )  # fmt: skip


def add_config(commands: argparse._SubParsersAction[Any]) -> None:
    p = commands.add_parser("config", help="print the config.pbtxt that 'repo build' would write")
    p.add_argument("--name", help="model name (default: --like's name, else the model file name without suffix)")
    _add_model_options(p)
    p.set_defaults(handler=_run_config)


def _add_model_options(p: argparse.ArgumentParser) -> None:
    """What describes the model and how Triton serves it; shared by 'repo build' and 'config'."""
    p.add_argument("model", type=Path, help="TorchScript file (.pt/.ts), bundle, or (repo build) a models folder")
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
    add_log_level(p)


def _shape(text: str) -> tuple[int, ...]:
    try:
        dims = tuple(int(d) for d in text.replace("x", ",").split(","))
    except ValueError as exc:
        raise argparse.ArgumentTypeError(f"expected sizes like 1,1,96,96,96, got {text!r}") from exc
    if any(d < 1 for d in dims):
        raise argparse.ArgumentTypeError(f"sizes must be positive, got {text!r}")
    return dims


def _version_policy(text: str) -> Any:
    from ..repository.config import VersionPolicy

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
    from ..repository.config import DynamicBatching

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
    from ..bundles import DEFAULT_CONFIG_NAMES
    from ..repository.builder import build_repository, generate_config
    from ..repository.bundle import build_bundle, bundle_target
    from ..repository.models_folder import build_models_folder, is_models_folder
    from ..repository.volume import plan_volume, wrap_network

    options = _model_options(args)
    if is_models_folder(args.model):  # the App SDK's -m MODELS: every model in it, one repository
        if args.name or args.whole_volume:
            raise UsageError(f"{str(args.model)!r} is a models folder: each model keeps its folder's name; "
                             "--name and --whole-volume are for one model")  # fmt: skip
        options.pop("bundle_metadata")
        for folder in build_models_folder(args.model, args.output, force=args.force, **options):
            print(f"wrote {folder}")
        return exits.OK
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
    from ..repository.volume import wrap_network

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


def _add_credentials(p: argparse.ArgumentParser) -> None:
    """The remote backend's credential options, for ``--server``: a secret is named (env:VAR, file:PATH), never
    given, so it shows in no ``ps`` line (``client/credentials.py``)."""
    group = p.add_argument_group("server credentials (as the remote backend's options; docs/remote.md)")
    group.add_argument("--root-certificates", type=Path, metavar="PEM", help="CA of a grpcs:// or https:// server")
    group.add_argument("--client-certificate", type=Path, metavar="PEM", help="client certificate (mutual TLS)")
    group.add_argument("--client-key", type=Path, metavar="PEM", help="its key, when not in the certificate file")
    group.add_argument("--auth-token", metavar="REF", help="bearer token: env:VAR or file:PATH")
    group.add_argument("--header", action="append", default=[], metavar="NAME=REF", help="a header; repeatable")
    group.add_argument(
        "--restricted-key", action="append", default=[], metavar="NAME=REF",
        help="a Triton restricted-protocol key (NAME=env:VAR); repeatable",
    )  # fmt: skip


def _run_repo_check(args: argparse.Namespace) -> int:
    from ..repository.check import EntryReport, check_repository, render_reports

    if args.repository is None and args.server is None:
        raise UsageError("monai-triton repo check: give a model repository, --server URL, or both")
    from ..repository.bundle import bundle_target, check_bundle

    reports: list[EntryReport] = []
    if args.repository is not None and bundle_target(args.repository):
        reports = [check_bundle(args.repository, args.config_name or ("inference",))]
    elif args.repository is not None:
        reports = check_repository(args.repository)
    if args.server is not None:
        from ..client.credentials import CredentialRefs
        from ..repository.served import ServerView, against_server, render_served

        credentials = CredentialRefs(
            root_certificates=args.root_certificates, client_certificate=args.client_certificate,
            client_key=args.client_key, auth_token=args.auth_token, headers=tuple(args.header),
            restricted_keys=tuple(args.restricted_key),
        )  # fmt: skip
        with ServerView(args.server, timeout_s=args.timeout, credentials=credentials) as view:
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
    from ..repository.bundle import bundle_target, describe_bundle
    from ..repository.check import describe_path, render_description

    if args.ensemble:
        from ..repository.models_folder import describe_ensemble

        sys.stdout.write(describe_ensemble(args.model, [m.strip() for m in args.ensemble.split(",") if m.strip()]))
        return exits.OK
    if bundle_target(args.model):
        sys.stdout.write(render_description(describe_bundle(args.model, args.config_name or ("inference",))))
        return exits.OK
    sys.stdout.write(render_description(describe_path(args.model, args.input_shape, args.bundle_metadata)))
    return exits.OK


def _run_config(args: argparse.Namespace) -> int:
    from ..repository.builder import generate_config

    name = args.name or (None if args.like else args.model.stem)
    _, _, text = generate_config(args.model, name, **_model_options(args))
    sys.stdout.write(text)
    return exits.OK
