"""``monai-triton repo check`` and ``repo describe``, on real repositories built by ``repo build``."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from monai_triton_ops.cli import main

pytestmark = pytest.mark.usefixtures("restore_console")

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture
def built(model_files: dict[str, Path], tmp_path: Path) -> Path:
    repo = tmp_path / "repo"
    assert main(["repo", "build", str(model_files["unet_meta"]), "-o", str(repo), "--name", "seg"]) == 0
    assert main(["repo", "build", str(model_files["two_in_two_out"]), "-o", str(repo), "--name", "two",
                 "--input-shape", "1,2,4,4", "--input-shape", "1,1", "--input-dtype", "float32",
                 "--input-dtype", "int64", "--flavor", "libtorch"]) == 0  # fmt: skip
    return repo


def test_check_lists_every_model_with_its_tensors(built: Path, capsys: pytest.CaptureFixture[str]) -> None:
    capsys.readouterr()
    assert main(["repo", "check", str(built)]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[0].split() == ["MODEL", "KIND", "VERSIONS", "INPUTS", "OUTPUTS", "STATUS"]
    assert out[1].split() == [
        "seg", "torchscript", "1", "x", "FP32", "[-1,", "1,", "-1,", "-1,", "-1]", "OUTPUT__0", "FP32",
        "[-1,", "3,", "-1,", "-1,", "-1]", "ok",
    ]  # fmt: skip
    assert out[2].split()[:3] == ["two", "torchscript/libtorch", "1"]
    assert out[2].endswith(" ok")
    assert "image FP32 [-1, 2, -1, -1]; offset INT64 [-1, 1]" in out[2]
    assert "seg: use: the torch backend" in out
    assert "seg: use: the triton backend and monai-triton serve" in out
    assert "two: use: NGC Triton containers" in out
    assert (
        "two: not: the triton backend and monai-triton serve: config.pbtxt needs Triton's 'pytorch' backend "
        "(platform 'pytorch_libtorch'), which this server does not have (it has: python)"
    ) in out


def test_check_finds_a_config_that_contradicts_its_model_file(built: Path, capsys: pytest.CaptureFixture[str]) -> None:
    config = built / "seg" / "config.pbtxt"
    config.write_text(config.read_text().replace("dims: [-1, 1, -1, -1, -1]", "dims: [-1, 2, -1, -1, -1]"))
    shutil.copytree(built / "seg", built / "broken")
    (built / "broken" / "config.pbtxt").write_text('name: "broken" input [')
    (built / "seg" / "1" / "model.py").unlink()
    capsys.readouterr()
    assert main(["repo", "check", str(built)]) == 2
    captured = capsys.readouterr()
    assert (
        "seg: version 1: input 0 (x): config.pbtxt says FP32 [-1, 2, -1, -1, -1], the model file's "
        "metadata FP32 [-1, 1, -1, -1, -1]"
    ) in captured.out
    assert "seg: version 1: no model.py runner for the python backend" in captured.out
    assert "broken: " in captured.out
    assert "not a valid Triton model configuration" in captured.out
    assert captured.err == "error: 2 of 3 model(s) have problems (listed above): ['broken', 'seg']\n"
    assert ["broken", "-", "1", "-", "-", "1", "problem(s)"] in [line.split() for line in captured.out.splitlines()]


def test_check_of_an_empty_repository_warns(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["repo", "check", str(tmp_path)]) == 0
    assert capsys.readouterr().err == f"warning: model repository {str(tmp_path)!r} holds no models\n"
    assert main(["repo", "check", str(tmp_path / "nope")]) == 2


def test_the_committed_repository_checks_clean(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["repo", "check", str(ROOT / "model_repository")]) == 0
    assert "brain_tissue_seg" in capsys.readouterr().out


def test_describe_a_model_folder_and_a_model_file(
    built: Path, model_files: dict[str, Path], capsys: pytest.CaptureFixture[str]
) -> None:
    capsys.readouterr()
    assert main(["repo", "describe", str(built / "seg")]) == 0
    assert capsys.readouterr().out == (
        "model     seg (version 1)\n"
        "kind      torchscript\n"
        "source    config.pbtxt\n"
        "batch     explicit: the first dim of each shape\n"
        "input 0   x FP32 [-1, 1, -1, -1, -1]\n"
        "output 0  OUTPUT__0 FP32 [-1, 3, -1, -1, -1]\n"
        "use       the torch backend\n"
        "use       the triton backend and monai-triton serve\n"
        "use       remote backends (grpc://, http://) and the App SDK's TritonRemoteModel, as its client-side config\n"
        "use       NGC Triton containers with what its model.py imports (torch) installed\n"
        "(-1: any size)\n"
    )
    assert main(["repo", "describe", str(model_files["unet_probed"]), "--input-shape", "1,1,16,16,16"]) == 0
    out = capsys.readouterr().out
    assert "source    probe, checked by running the model" in out
    assert main(["repo", "describe", str(built / "nope")]) == 2
    assert "is neither a model file nor a model folder" in capsys.readouterr().err
