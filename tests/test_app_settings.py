"""Deploy-time settings: the backend, the model name and every backend option, from each of the three sources.

Every option of every backend that imports here goes the whole way a user's setting goes: given on the
command line, in the environment or in the app's ``app.yaml``, read by ``init_app_context``, taken by
``InferenceOperator`` into the backend it creates, and found, typed, in that backend's options.
"""

from __future__ import annotations

import dataclasses
import os
import shutil
import types
import typing
from collections.abc import Iterator
from pathlib import Path
from typing import Any, Literal, get_args, get_origin

import pytest
from monai.deploy.core import Application

from monai_triton_ops import InferenceOperator
from monai_triton_ops.app_args import init_app_context
from monai_triton_ops.app_settings import (
    backend_option_names,
    backend_statuses,
    env_of,
    flag_of,
    model_name_for,
    read_app_environment,
    render_backends,
)
from monai_triton_ops.backends.registry import backend_class, create_backend
from monai_triton_ops.errors import ConfigError, UsageError

pytestmark = pytest.mark.usefixtures("restore_console", "clean_environ")
SOURCES = ("command line", "environment", "app.yaml")
#: A backend of each family that is usable without a server: options are checked, nothing connects.
SPECS = {
    "torch": "torch",
    "onnx": "onnx",
    "triton": "triton",
    "grpc": "grpc://127.0.0.1:1",
    "http": "http://127.0.0.1:1",
}
#: Values that pass each option's own checks, where the type alone does not give one.
SAMPLES = {
    "device": "cpu:0",
    "providers": "AzureExecutionProvider",
    "graph_optimization": "basic",
    "backend_config": "python:shm-region-prefix-name=x",
    "max_backoff_s": "2.5",
    "backoff_s": "0.5",
    "probe_backoff_s": "0.5",
    "servers": "triton-2.example:8001",
    "auth_token": "env:TRITON_TOKEN",
    "restricted_keys": "triton-admin-key=env:TRITON_ADMIN_KEY",
    "headers": "x-api-key=file:/run/secrets/api-key",
}
#: Options of TLS, which a plaintext server refuses: they go with a TLS spec.
TLS_SPEC, TLS_OPTIONS = "grpcs://127.0.0.1:1", frozenset({"root_certificates", "client_certificate", "client_key"})


@pytest.fixture(scope="module")
def fragment() -> Application:
    """One fragment for the operators of this module: they are built, never added to a graph."""
    return Application()


@pytest.fixture(scope="module")
def repo(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A repository with the tiny UNet as ``unet``, shared by the module (tests copy it to change it)."""
    from .conftest import UNET_META, save_model, tiny_unet

    folder = tmp_path_factory.mktemp("settings") / "repo"
    save_model(tiny_unet(), folder / "unet" / "1" / "model.pt", UNET_META)
    return folder


@pytest.fixture
def unet_repo(repo: Path, tmp_path: Path) -> Path:
    return Path(shutil.copytree(repo, tmp_path / "repo"))


@pytest.fixture
def clean_environ() -> Iterator[None]:
    """``app.yaml`` values are set in ``os.environ`` for the run: put the environment back afterwards."""
    saved = dict(os.environ)
    for name in [n for n in os.environ if n.startswith("MONAI_TRITON_") and n != "MONAI_TRITON_STACK_RAISED"]:
        del os.environ[name]
    os.environ.pop("TRITON_SERVER_NETLOC", None)
    os.environ.pop("HOLOSCAN_CONFIG_PATH", None)
    yield
    os.environ.clear()
    os.environ.update(saved)


def sample(option: str, hint: Any, tmp_path: Path, default: Any = None) -> str:
    """A valid value as text, other than ``default``, for an option of type ``hint``."""
    if option in SAMPLES:
        return SAMPLES[option]
    args = [a for a in get_args(hint) if a is not type(None)]
    if get_origin(hint) in (typing.Union, types.UnionType):
        return sample(option, args[0], tmp_path, default)
    if get_origin(hint) is Literal:
        return str(args[-1])
    if hint is bool:
        return "false" if default is True else "true"
    if hint is int:
        return "4"
    if hint is float:
        return "7.5"
    if hint is Path:
        return str(tmp_path / f"{option}.file")
    return "OUTPUT__0" if option == "output_name" else "value"


def typed(option: str, text: str, hint: Any, spec: str) -> Any:
    from monai_triton_ops.backends.options import parse_options

    return getattr(parse_options(backend_class(spec).options_type, {option: text}, backend=spec), option)


def app_folder(tmp_path: Path, environment: dict[str, str]) -> Path:
    """An app folder whose ``app.yaml`` has ``environment``; its path is the program name (``argv[0]``)."""
    folder = tmp_path / "app"
    folder.mkdir(exist_ok=True)
    lines = ["application:", "  title: settings test", "  environment:"]
    lines += [f"    {name}: {value!r}" for name, value in environment.items()]
    (folder / "app.yaml").write_text("\n".join(lines) + "\n")
    return folder


def context_for(tmp_path: Path, repo: Path, source: str, variable: str, flag: str, value: str, *extra: str) -> Any:
    yaml_env = {variable: value} if source == "app.yaml" else {}
    argv = [str(app_folder(tmp_path, yaml_env)), "-i", str(repo), "-o", str(tmp_path / "out"), "-m", str(repo)]
    if source == "command line":
        argv += [flag] if flag == "--preview" else [flag, value]
    elif source == "environment":
        os.environ[variable] = value
    return init_app_context([*argv, *extra])


def option_cases() -> list[tuple[str, str]]:
    names = backend_option_names()
    return [(option, next(s for s in SPECS if s in schemes)) for option, schemes in names.items()]


@pytest.mark.parametrize("source", SOURCES)
@pytest.mark.parametrize(("option", "scheme"), option_cases())
def test_every_backend_option_reaches_the_backend_from_each_source(
    fragment: Application, unet_repo: Path, tmp_path: Path, option: str, scheme: str, source: str
) -> None:
    spec = TLS_SPEC if option in TLS_OPTIONS else SPECS[scheme]
    hint = typing.get_type_hints(backend_class(spec).options_type)[option]
    default = {f.name: f.default for f in dataclasses.fields(backend_class(spec).options_type)}[option]
    value = sample(option, hint, tmp_path, default)
    context = context_for(tmp_path, unet_repo, source, env_of(option), flag_of(option), value, "--backend", spec)
    operator = InferenceOperator(fragment, app_context=context, model_name="unet", name="infer")
    assert operator.backend_options[option] == value
    backend = create_backend(operator.backend_spec, operator.model_name, **operator.backend_options)
    assert getattr(backend.options, option) == typed(option, value, hint, spec)
    assert getattr(backend.options, option) != default  # the setting changed something


@pytest.mark.parametrize("source", SOURCES)
def test_the_backend_from_each_source(fragment: Application, unet_repo: Path, tmp_path: Path, source: str) -> None:
    context = context_for(tmp_path, unet_repo, source, "MONAI_TRITON_BACKEND", "--backend", "grpc://127.0.0.1:1")
    assert (context.args["backend"], context.args["backend_source"]) == ("grpc://127.0.0.1:1", source)
    operator = InferenceOperator(fragment, app_context=context, model_name="unet", backend="torch", name="i")
    assert operator.backend_spec == "grpc://127.0.0.1:1"  # deploy-time settings win over the code's backend=


@pytest.mark.parametrize("source", SOURCES)
def test_the_model_name_from_each_source(fragment: Application, unet_repo: Path, tmp_path: Path, source: str) -> None:
    (unet_repo / "unet").rename(unet_repo / "hospital_unet")
    context = context_for(tmp_path, unet_repo, source, "MONAI_TRITON_MODEL_NAME", "--model-name", "hospital_unet")
    operator = InferenceOperator(fragment, app_context=context, model_name="unet", name="infer")
    assert operator.model_name == "hospital_unet"  # and its model entry was checked under that name


@pytest.mark.parametrize("source", SOURCES)
def test_preview_from_each_source(unet_repo: Path, tmp_path: Path, source: str) -> None:
    context = context_for(tmp_path, unet_repo, source, "MONAI_TRITON_PREVIEW", "--preview", "1")
    assert context.args["preview"] == "true"


def test_precedence_command_line_environment_app_yaml_code(
    fragment: Application, unet_repo: Path, tmp_path: Path
) -> None:
    folder = app_folder(tmp_path, {"MONAI_TRITON_TIMEOUT_S": "1", "MONAI_TRITON_MAX_IN_FLIGHT": "5"})
    os.environ["MONAI_TRITON_TIMEOUT_S"] = "2"
    argv = [str(folder), "-i", str(unet_repo), "-o", str(tmp_path / "o"), "-m", str(unet_repo), "--timeout-s", "3"]
    context = init_app_context(argv)
    code = {"timeout_s": 9.0, "max_in_flight": 9, "output_name": "OUTPUT__0"}
    op = InferenceOperator(fragment, app_context=context, model_name="unet", backend_options=code, name="i")
    assert op.backend_options["timeout_s"] == "3"  # command line over environment over app.yaml
    assert op.backend_options["max_in_flight"] == "5"  # app.yaml over code
    assert op.backend_options["output_name"] == "OUTPUT__0"  # code over the backend's default
    context = init_app_context(argv[:-2])
    assert (
        InferenceOperator(fragment, app_context=context, model_name="unet", name="j").backend_options["timeout_s"]
        == "2"
    )


def test_an_option_the_backend_lacks(unet_repo: Path, tmp_path: Path) -> None:
    argv = [str(tmp_path), "-i", str(unet_repo), "-o", str(tmp_path / "o"), "-m", str(unet_repo)]
    with pytest.raises(UsageError, match=r"--shared-memory: backend 'torch' has no option 'shared_memory'"):
        init_app_context([*argv, "--backend", "torch", "--shared-memory", "none"])
    os.environ["MONAI_TRITON_SHARED_MEMORY"] = "none"  # from the environment: meant for another backend, skipped
    assert init_app_context([*argv, "--backend", "torch"]).args["backend_options"] == "{}"
    os.environ["MONAI_TRITON_TIMEOUT_S"] = "soon"
    with pytest.raises(ConfigError, match=r"MONAI_TRITON_TIMEOUT_S \(environment\): .*timeout_s='soon'"):
        init_app_context([*argv, "--backend", "torch"])


def test_model_name_rules() -> None:
    assert model_name_for("seg", None) == "seg"
    assert model_name_for("seg", "hospital_seg") == "hospital_seg"
    assert model_name_for("seg", "seg=a,liver=b") == "a"
    assert model_name_for("other", "seg=a") == "other"
    with pytest.raises(UsageError, match="CODE=NAME"):
        model_name_for("seg", "seg=a,=b")


def test_app_yaml_errors_name_the_file(tmp_path: Path) -> None:
    bad = tmp_path / "app.yaml"
    bad.write_text("application: [unclosed\n")
    with pytest.raises(ConfigError, match=r"app\.yaml' cannot be read as YAML"):
        read_app_environment(bad)
    bad.write_text("application:\n  environment: [A, B]\n")
    with pytest.raises(ConfigError, match="environment must be a mapping"):
        read_app_environment(bad)


def test_the_backends_listing_says_what_runs_here_and_names_every_flag() -> None:
    statuses = {s.scheme: s for s in backend_statuses()}
    assert {"torch", "triton", "grpc", "http"} <= set(statuses)
    assert statuses["torch"].runs_here
    text = render_backends(list(statuses.values()))
    for option in backend_option_names():
        assert f"{flag_of(option)} " in text
        assert env_of(option) in text
    assert "command line > environment > app.yaml > code" in text


def test_the_app_sdks_netloc_in_the_environment_beats_a_backend_in_app_yaml(unet_repo: Path, tmp_path: Path) -> None:
    folder = app_folder(tmp_path, {"MONAI_TRITON_BACKEND": "torch"})
    os.environ["TRITON_SERVER_NETLOC"] = "triton.example:8000"
    context = init_app_context([str(folder), "-i", str(unet_repo), "-o", str(tmp_path / "o"), "-m", str(unet_repo)])
    assert (context.args["backend"], context.args["backend_source"]) == ("http://triton.example:8000", "environment")


def test_a_variable_set_to_app_yamls_own_value_still_beats_the_app_sdks_netloc(unet_repo: Path, tmp_path: Path) -> None:
    """``-e MONAI_TRITON_BACKEND=torch -e TRITON_SERVER_NETLOC=...``: the explicit choice wins, though it equals
    app.yaml's default (a value comparison would take it for the default and run remote)."""
    folder = app_folder(tmp_path, {"MONAI_TRITON_BACKEND": "torch"})
    os.environ["MONAI_TRITON_BACKEND"] = "torch"
    os.environ["TRITON_SERVER_NETLOC"] = "triton.example:8000"
    context = init_app_context([str(folder), "-i", str(unet_repo), "-o", str(tmp_path / "o"), "-m", str(unet_repo)])
    assert (context.args["backend"], context.args["backend_source"]) == ("torch", "environment")


def test_holoscan_config_path_is_the_apps_app_yaml(unet_repo: Path, tmp_path: Path) -> None:
    """In a MAP the app reads its defaults from ``HOLOSCAN_CONFIG_PATH`` (the image does not bake them in)."""
    beside = app_folder(tmp_path, {"MONAI_TRITON_BACKEND": "grpc://beside:8001"})
    deployed = tmp_path / "deployed.yaml"
    deployed.write_text("application:\n  environment:\n    MONAI_TRITON_BACKEND: grpc://deployed:8001\n")
    os.environ["HOLOSCAN_CONFIG_PATH"] = str(deployed)
    argv = [str(beside), "-i", str(unet_repo), "-o", str(tmp_path / "o"), "-m", str(unet_repo)]
    context = init_app_context(argv)
    assert (context.args["backend"], context.args["backend_source"]) == ("grpc://deployed:8001", "app.yaml")
    del os.environ["MONAI_TRITON_BACKEND"]  # set for the run from app.yaml
    os.environ["HOLOSCAN_CONFIG_PATH"] = str(tmp_path / "missing.yaml")
    with pytest.raises(ConfigError, match=r"missing\.yaml' \(HOLOSCAN_CONFIG_PATH\) does not exist"):
        init_app_context(argv)


def test_an_option_in_the_specs_query_ranks_as_the_spec(fragment: Application, unet_repo: Path, tmp_path: Path) -> None:
    """app.yaml's ``MONAI_TRITON_READY_TIMEOUT_S`` (the sample app's 30 s) must not silently replace the
    ``?ready_timeout_s=`` of a spec given in the environment; a spec from app.yaml yields to the variable."""
    folder = app_folder(tmp_path, {"MONAI_TRITON_READY_TIMEOUT_S": "30", "MONAI_TRITON_TIMEOUT_S": "7"})
    os.environ["MONAI_TRITON_BACKEND"] = "grpc://127.0.0.1:1?ready_timeout_s=120&timeout_s=9"
    os.environ["MONAI_TRITON_TIMEOUT_S"] = "8"
    argv = [str(folder), "-i", str(unet_repo), "-o", str(tmp_path / "o"), "-m", str(unet_repo)]
    code = {"ready_timeout_s": 5.0, "retries": 1}
    context = init_app_context(argv)
    op = InferenceOperator(fragment, app_context=context, model_name="unet", backend_options=code, name="i")
    backend = create_backend(op.backend_spec, op.model_name, **op.backend_options)
    assert backend.options.ready_timeout_s == 120  # the environment's spec over app.yaml and the code
    assert backend.options.timeout_s == 8  # equal rank: the option's own variable over the spec's query
    assert backend.options.retries == 1  # the query does not name it: the code's
    for name in ("MONAI_TRITON_BACKEND", "MONAI_TRITON_TIMEOUT_S", "MONAI_TRITON_READY_TIMEOUT_S"):
        del os.environ[name]  # the last two set for that run from app.yaml
    folder = app_folder(tmp_path, {"MONAI_TRITON_BACKEND": "grpc://127.0.0.1:1?ready_timeout_s=120"})
    os.environ["MONAI_TRITON_READY_TIMEOUT_S"] = "12"
    op = InferenceOperator(fragment, app_context=init_app_context(argv), model_name="unet", name="j")
    assert create_backend(op.backend_spec, op.model_name, **op.backend_options).options.ready_timeout_s == 12
