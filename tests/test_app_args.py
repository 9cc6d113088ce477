"""Backend choice at run time: command line, then environment, then the app's default."""

from __future__ import annotations

from pathlib import Path

import pytest

from monai_triton_ops.app_args import ENV_BACKEND, init_app_context, netloc_of, resolve_backend, split_backend_args
from monai_triton_ops.errors import BackendSpecError


def test_command_line_beats_environment_beats_default() -> None:
    env = {ENV_BACKEND: "grpc://triton:8001"}
    assert resolve_backend("http://triton:8000", environ=env) == "http://triton:8000"
    assert resolve_backend(None, environ=env) == "grpc://triton:8001"
    assert resolve_backend(None, environ={}) == "torch"
    assert resolve_backend(None, default="triton", environ={}) == "triton"


def test_a_typo_fails_before_anything_starts() -> None:
    with pytest.raises(BackendSpecError, match="unknown backend spec 'trition'"):
        resolve_backend("trition", environ={})


@pytest.mark.parametrize("argv", [["app", "--backend", "triton", "-i", "x"], ["app", "-i", "x", "--backend=triton"]])
def test_backend_is_taken_off_the_command_line(argv: list[str]) -> None:
    assert split_backend_args(argv) == ("triton", ["app", "-i", "x"])


def test_app_sdk_arguments_keep_working_and_the_spec_lands_in_the_context(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(ENV_BACKEND, "http://triton:8000")
    (tmp_path / "models").mkdir()
    argv = ["app", "-i", str(tmp_path), "-o", str(tmp_path / "out"), "-m", str(tmp_path / "models"), "-l", "WARN"]
    context = init_app_context(argv)
    assert context.args["backend"] == "http://triton:8000"
    assert Path(context.input_path) == tmp_path
    assert Path(context.model_path) == tmp_path / "models"
    context = init_app_context([*argv, "--backend", "torch"])
    assert context.args["backend"] == "torch"


def test_unknown_options_are_still_rejected_by_the_app_sdk_parser(tmp_path: Path) -> None:
    with pytest.raises(SystemExit):
        init_app_context(["app", "-i", str(tmp_path), "--bogus"])


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


def test_minus_t_reaches_the_context_and_the_app_sdk_still_sees_it(tmp_path: Path) -> None:
    (tmp_path / "models").mkdir()
    argv = ["app", "-i", str(tmp_path), "-o", str(tmp_path / "out"), "-m", str(tmp_path / "models"), "-t", "h:8000"]
    context = init_app_context(argv)
    assert context.args["backend"] == "http://h:8000"
    assert context.triton_server_netloc == "h:8000"
