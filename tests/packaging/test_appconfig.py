"""app.yaml as a MAP reads it: the sample apps' files, both spellings of the formats, and every refusal."""

from __future__ import annotations

from pathlib import Path

import pytest

from monai_triton_ops.errors import ConfigError
from monai_triton_ops.packaging.appconfig import read_app_config

ROOT = Path(__file__).resolve().parents[2]

GOOD = """\
application:
  title: Demo
  version: 1.2.3
  {formats}
  environment:
    MONAI_TRITON_BACKEND: triton
    MONAI_TRITON_ALLOW_NON_FINITE: true
    RETRIES: 3
resources:
  cpu: 1.5
  gpu: 0
  memory: 2Gi
  sharedMemory: 256Mi
"""


def write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "app.yaml"
    path.write_text(text)
    return path


def test_the_sample_apps_config_gives_formats_environment_and_resources() -> None:
    config = read_app_config(ROOT / "apps" / "brain_tissue_seg" / "app.yaml")
    assert config.title.startswith("MONAI Deploy App - Brain tissue segmentation")
    assert config.version == "0.1.0"
    assert config.input_formats == ("file",)
    assert config.output_formats == ("file",)
    assert dict(config.environment) == {
        "MONAI_TRITON_BACKEND": "torch",  # issue 16: the MAP's default backend comes from app.yaml
        "MONAI_TRITON_READY_TIMEOUT_S": "30",  # a server that is not there: exit 3 within a minute
        "MONAI_TRITON_PREVIEW": "0",
    }
    assert dict(config.resources) == {"cpu": 2, "gpu": 0, "memory": "4Gi"}


@pytest.mark.parametrize(
    "formats", ['inputFormats: ["file"]\n  outputFormats: [file]', "input-formats: [file]\n  output-formats: file"]
)
def test_both_spellings_of_the_formats_are_read(tmp_path: Path, formats: str) -> None:
    config = read_app_config(write(tmp_path, GOOD.format(formats=formats)))
    assert config.input_formats == ("file",)
    assert config.output_formats == ("file",)
    # environment values become the strings the variables will hold; booleans as the app parses them
    assert dict(config.environment) == {
        "MONAI_TRITON_BACKEND": "triton",
        "MONAI_TRITON_ALLOW_NON_FINITE": "true",
        "RETRIES": "3",
    }


def test_a_version_given_on_the_command_line_replaces_the_files(tmp_path: Path) -> None:
    path = write(tmp_path, GOOD.format(formats="inputFormats: [file]\n  outputFormats: [file]"))
    assert read_app_config(path, version="2.0.0").version == "2.0.0"


FORMATS = "inputFormats: [file]\n  outputFormats: [file]"


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        (GOOD.format(formats="outputFormats: [file]"), "application.inputFormats is missing"),
        (GOOD.format(formats="inputFormats: []\n  outputFormats: [file]"), "application.inputFormats is empty"),
        (
            GOOD.format(formats="inputFormats: [file]\n  input-formats: [network]\n  outputFormats: [file]"),
            "disagree",
        ),
        (GOOD.format(formats=FORMATS).replace("version: 1.2.3", "version: latest"), "semantic version"),
        (GOOD.format(formats=FORMATS).replace("title: Demo", "title: ''"), "application.title"),
        (GOOD.format(formats=FORMATS).replace("memory: 2Gi", "memory: 2GB"), "resources.memory"),
        (GOOD.format(formats=FORMATS).replace("cpu: 1.5", "cpu: -1"), "resources.cpu"),
        (GOOD.format(formats=FORMATS).replace("gpu: 0", "gpus: 0"), "resources.gpus is not a resource"),
        (GOOD.format(formats=FORMATS).replace("RETRIES: 3", "BAD-NAME: 3"), "not a valid variable name"),
        (GOOD.format(formats=FORMATS).replace("RETRIES: 3", "RETRIES: [3]"), "environment.RETRIES"),
        ("application: {title: x}\n", "no 'resources:' mapping"),
        ("- a list\n", "no 'application:' mapping"),
        ("application: [\n", "not valid YAML"),
    ],
)
def test_a_config_that_cannot_make_a_valid_map_is_refused_naming_the_key(
    tmp_path: Path, text: str, expected: str
) -> None:
    path = write(tmp_path, text)
    with pytest.raises(ConfigError, match=expected) as info:
        read_app_config(path)
    assert str(path) in str(info.value)


def test_a_missing_file_is_named(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="does not exist"):
        read_app_config(tmp_path / "nope.yaml")
