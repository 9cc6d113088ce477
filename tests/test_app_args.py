"""An app's command line: backend choice, the App SDK's options, and the checks that run before the graph."""

from __future__ import annotations

from pathlib import Path

import pytest

from monai_triton_ops import exits
from monai_triton_ops.app_args import (
    ENV_ALLOW_NON_FINITE,
    ENV_BACKEND,
    app_help,
    app_parser,
    init_app_context,
    netloc_of,
    resolve_backend,
    run_app,
    split_backend_args,
)
from monai_triton_ops.backends import registry
from monai_triton_ops.backends.mock import MockBackend
from monai_triton_ops.errors import (
    BackendSpecError,
    BackendUnavailableError,
    ConfigError,
    InputDataError,
    ModelNotFoundError,
    UsageError,
)

pytestmark = pytest.mark.usefixtures("restore_console")


@pytest.fixture
def http_filled(monkeypatch: pytest.MonkeyPatch) -> None:
    """The ``http`` scheme filled by a stand-in, so that no server is needed to check the arguments."""
    monkeypatch.setattr(registry, "_registry", dict(registry._registry))
    registry.register_backend("http", MockBackend, takes_urls=True, clobber=True)


@pytest.fixture
def argv(tmp_path: Path) -> list[str]:
    (tmp_path / "models").mkdir()
    return ["app", "-i", str(tmp_path), "-o", str(tmp_path / "out"), "-m", str(tmp_path / "models")]


def test_command_line_beats_environment_beats_default() -> None:
    env = {ENV_BACKEND: "grpc://triton:8001"}
    assert resolve_backend("http://triton:8000", environ=env) == "http://triton:8000"
    assert resolve_backend(None, environ=env) == "grpc://triton:8001"
    assert resolve_backend(None, environ={}) == "torch"
    assert resolve_backend(None, default="triton", environ={}) == "triton"


def test_a_typo_fails_before_anything_starts() -> None:
    with pytest.raises(BackendSpecError, match=r"unknown backend spec 'trition'"):
        resolve_backend("trition", environ={})


@pytest.mark.parametrize("line", [["app", "--backend", "triton", "-i", "x"], ["app", "-i", "x", "--backend=triton"]])
def test_backend_is_taken_off_the_command_line(line: list[str]) -> None:
    assert split_backend_args(line) == ("triton", ["app", "-i", "x"])
    assert split_backend_args([*line, "--allow-non-finite"]) == ("triton", ["app", "-i", "x"])


@pytest.mark.usefixtures("http_filled")
def test_app_sdk_arguments_keep_working_and_our_options_land_in_the_context(
    argv: list[str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(ENV_BACKEND, "http://triton:8000")
    monkeypatch.delenv(ENV_ALLOW_NON_FINITE, raising=False)
    context = init_app_context([*argv, "-l", "WARN"])
    assert context.args["backend"] == "http://triton:8000"
    assert context.args["allow_non_finite"] == "false"
    assert Path(context.input_path) == tmp_path
    assert Path(context.model_path) == tmp_path / "models"
    context = init_app_context([*argv, "--backend", "torch", "--allow-non-finite"])
    assert context.args["backend"] == "torch"
    assert context.args["allow_non_finite"] == "true"
    monkeypatch.setenv(ENV_ALLOW_NON_FINITE, "1")
    assert init_app_context(argv).args["allow_non_finite"] == "true"


def test_a_backend_that_cannot_load_is_refused_while_parsing_with_exit_code_3(
    argv: list[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(registry, "_registry", dict(registry._registry))
    registry.register_backend("planned", "monai_triton_ops.backends.not_built_here:Planned", hint="a later release")
    with pytest.raises(
        BackendUnavailableError, match=r"backend 'planned' cannot be imported .*a later release"
    ) as caught:
        init_app_context([*argv, "--backend", "planned"])
    assert exits.exit_code(caught.value) == exits.UNAVAILABLE


def test_unknown_options_are_one_usage_error(argv: list[str]) -> None:
    with pytest.raises(UsageError, match=r"^app: unrecognized arguments: --bogus \(see 'app --help'\)$"):
        init_app_context([*argv, "--bogus"])


def test_paths_are_checked_before_the_app_sdk_sees_them(argv: list[str], tmp_path: Path) -> None:
    with pytest.raises(InputDataError, match=r"input '.*nope' does not exist"):
        init_app_context([*argv, "-i", str(tmp_path / "nope")])
    with pytest.raises(ModelNotFoundError, match=r"model repository '.*nope' does not exist"):
        init_app_context([*argv, "-m", str(tmp_path / "nope")])
    blocker = tmp_path / "file"
    blocker.write_text("")
    with pytest.raises(InputDataError, match=r"output folder '.*file/out' cannot be created: Not a directory"):
        init_app_context([*argv, "-o", str(blocker / "out")])
    (tmp_path / "models" / "seg" / "1").mkdir(parents=True)
    (tmp_path / "models" / "seg" / "config.pbtxt").write_text('name: "seg" input [ {')
    with pytest.raises(ConfigError, match=r"seg/config.pbtxt: not a valid Triton model configuration"):
        init_app_context(argv)
    assert not (tmp_path / "out").exists()  # every failure above came before the output folder


def test_help_lists_every_option_with_a_text() -> None:
    parser = app_parser("seg")
    for action in parser._actions:
        assert action.help, f"{action.option_strings} has no help"
    text = app_help(type("SegApp", (), {"__doc__": "Segment things."}), "apps/seg")
    assert text.startswith("usage: seg ")
    assert "Segment things." in text
    for option in ("-i", "-o", "-m", "-w", "-t", "-l", "--backend", "--allow-non-finite", "Exit codes"):
        assert option in text


class _FailingApp:
    """Stands in for an Application whose compose() finds the input unusable."""

    def __init__(self, argv: list[str]) -> None:
        self.argv = argv

    def run(self) -> None:
        raise InputDataError(f"input {self.argv[2]!r} holds no DICOM series\nsecond line")


def test_run_app_turns_a_failure_into_one_line_and_an_exit_code(capsys: pytest.CaptureFixture[str]) -> None:
    assert run_app(_FailingApp, ["app", "-i", "in"]) == exits.USAGE
    err = capsys.readouterr().err
    assert err == "error: input 'in' holds no DICOM series [1 more line(s) with -l DEBUG]\n"
    assert run_app(_FailingApp, ["app", "-i", "in", "-l", "DEBUG"]) == exits.USAGE
    err = capsys.readouterr().err
    assert "Traceback (most recent call last)" in err
    assert err.splitlines()[-1].startswith("error: input 'in'")


def test_run_app_answers_help_itself(capsys: pytest.CaptureFixture[str]) -> None:
    assert run_app(_FailingApp, ["apps/seg", "--help"]) == exits.OK
    out = capsys.readouterr().out
    assert "Stands in for an Application" in out
    assert "--backend SPEC" in out


def test_the_default_backend_is_the_registry_s() -> None:
    from monai_triton_ops import app_args

    assert app_args.DEFAULT_BACKEND == registry.DEFAULT_BACKEND


def test_the_app_sdk_netloc_selects_the_remote_backend_and_backend_wins() -> None:
    env = {"TRITON_SERVER_NETLOC": "triton:8000"}
    assert resolve_backend(None, environ=env) == "http://triton:8000"
    assert resolve_backend(None, environ={}, netloc="127.0.0.1:8000") == "http://127.0.0.1:8000"
    assert resolve_backend(None, environ={ENV_BACKEND: "torch"}, netloc="h:8000") == "http://h:8000"  # -t is CLI
    assert resolve_backend(None, environ={ENV_BACKEND: "grpc://h:8001"} | env) == "grpc://h:8001"
    assert resolve_backend("torch", environ=env, netloc="h:8000") == "torch"  # an explicit --backend wins
    assert netloc_of(["app", "-i", "x", "-t", "h:8000"]) == "h:8000"
    assert netloc_of(["app", "--triton-server-netloc=h:9"]) == "h:9"
    assert netloc_of(["app", "-i", "x"]) is None


def test_minus_t_reaches_the_context_and_the_app_sdk_still_sees_it(argv: list[str]) -> None:
    context = init_app_context([*argv, "-t", "h:8000"])
    assert context.args["backend"] == "http://h:8000"
    assert context.triton_server_netloc == "h:8000"
