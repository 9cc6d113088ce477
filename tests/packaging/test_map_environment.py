"""An app started the way a MAP starts it: no options, everything from HOLOSCAN_* (app_args' part of issue 16)."""

from __future__ import annotations

from pathlib import Path

import pytest

from monai_triton_ops.app_args import ENV_MODEL_PATH, init_app_context
from monai_triton_ops.errors import ConfigError, ModelNotFoundError

pytestmark = pytest.mark.usefixtures("restore_console")


@pytest.fixture
def holoscan_env(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    (tmp_path / "in").mkdir()
    (tmp_path / "in" / "x.nii.gz").write_bytes(b"\0")
    (tmp_path / "models").mkdir()
    monkeypatch.setenv("HOLOSCAN_INPUT_PATH", str(tmp_path / "in"))
    monkeypatch.setenv("HOLOSCAN_OUTPUT_PATH", str(tmp_path / "out"))
    monkeypatch.setenv(ENV_MODEL_PATH, str(tmp_path / "models"))
    monkeypatch.delenv("MONAI_TRITON_BACKEND", raising=False)
    return tmp_path


def test_paths_come_from_the_holoscan_variables(holoscan_env: Path) -> None:
    context = init_app_context(["app"])
    assert context.input_path == str(holoscan_env / "in")
    assert context.output_path == str(holoscan_env / "out")
    assert context.model_path == str(holoscan_env / "models")
    assert (holoscan_env / "out").is_dir()


def test_a_model_path_variable_that_leads_nowhere_fails_naming_it(
    holoscan_env: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(ENV_MODEL_PATH, str(holoscan_env / "elsewhere"))
    with pytest.raises(ModelNotFoundError, match=f"{ENV_MODEL_PATH}"):
        init_app_context(["app"])


def test_the_model_configs_under_the_variable_are_checked_too(holoscan_env: Path) -> None:
    (holoscan_env / "models" / "seg").mkdir()
    (holoscan_env / "models" / "seg" / "config.pbtxt").write_text("this is { not a config")
    with pytest.raises(ConfigError, match=r"config\.pbtxt"):
        init_app_context(["app"])
