"""``monai-triton repo build`` and ``monai-triton config`` through ``main([...])``, as a user types them."""

from __future__ import annotations

from pathlib import Path

import pytest

from monai_triton_ops.cli import main
from monai_triton_ops.repository.builder import generate_config
from monai_triton_ops.repository.config import DynamicBatching, InstanceGroup

from .conftest import snapshot

pytestmark = pytest.mark.usefixtures("restore_console")


def test_repo_build_writes_the_entry(plain_unet: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    repo = tmp_path / "repo"
    code = main(["repo", "build", str(plain_unet), "-o", str(repo), "--name", "unet", "--input-shape", "1,1,16,16,16"])
    assert code == 0
    assert capsys.readouterr().out == f"wrote {repo / 'unet'}\n"
    assert sorted(p.name for p in (repo / "unet" / "1").iterdir()) == ["model.pt", "model.py"]


def test_repo_build_refuses_a_clash_unless_forced(
    model_files: dict[str, Path], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    repo = tmp_path / "repo"
    argv = ["repo", "build", str(model_files["unet_meta"]), "-o", str(repo), "--name", "unet"]
    assert main(argv) == 0
    before = snapshot(repo)
    capsys.readouterr()
    assert main([*argv, "--flavor", "libtorch"]) == 2
    assert "error: model 'unet' already exists" in capsys.readouterr().err
    assert snapshot(repo) == before
    assert main([*argv, "--flavor", "libtorch", "--force", "--version", "2"]) == 0
    assert sorted(p.name for p in (repo / "unet").iterdir()) == ["2", "config.pbtxt"]


def test_config_prints_what_repo_build_writes(model_files: dict[str, Path], capsys: pytest.CaptureFixture[str]) -> None:
    argv = ["config", str(model_files["two_in_two_out"]), "--flavor", "libtorch", "--input-shape", "1,2,4,4",
            "--input-shape", "1x1", "--input-dtype", "float32", "--input-dtype", "int64"]  # fmt: skip
    assert main(argv) == 0
    _, _, expected = generate_config(
        model_files["two_in_two_out"], "two_in_two_out", flavor="libtorch",
        input_shapes=[(1, 2, 4, 4), (1, 1)], input_dtypes=["float32", "int64"],
    )  # fmt: skip
    assert capsys.readouterr().out == expected


def test_config_serving_options(model_files: dict[str, Path], capsys: pytest.CaptureFixture[str]) -> None:
    argv = ["config", str(model_files["unet_meta"]), "--name", "seg", "--max-batch-size", "8",
            "--preferred-batch-size", "2", "4", "--max-queue-delay-us", "250", "--instance-kind", "cpu",
            "--instance-count", "2"]  # fmt: skip
    assert main(argv) == 0
    _, _, expected = generate_config(
        model_files["unet_meta"], "seg", max_batch_size=8,
        dynamic_batching=DynamicBatching(preferred_batch_sizes=(2, 4), max_queue_delay_us=250),
        instance_groups=[InstanceGroup(kind="KIND_CPU", count=2)],
    )  # fmt: skip
    out = capsys.readouterr().out
    assert out == expected
    assert "max_queue_delay_microseconds: 250" in out
    assert "kind: KIND_CPU" in out


def test_config_with_bundle_metadata(plain_unet: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from .conftest import UNET16_META

    (tmp_path / "configs").mkdir()
    (tmp_path / "configs" / "metadata.json").write_text(__import__("json").dumps(UNET16_META))
    assert main(["config", str(plain_unet), "--bundle-metadata", str(tmp_path)]) == 0
    assert 'key: "monai_metadata"' in capsys.readouterr().out


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        ([], "pass --input-shape"),
        (["--input-shape", "1,2,16,16,16"], "to have 1 channels"),
        (["--input-shape", "1,1,16,16,16", "--dynamic-batching"], "dynamic batching needs max_batch_size > 0"),
        (["--input-shape", "1,1,16,16,16", "--instance-kind", "tpu"], "instance kind must be one of"),
        (["--name", "../up", "--input-shape", "1,1,16,16,16"], "is not a safe folder name"),
    ],
    ids=["no-shape", "wrong-channels", "batching-without-batch", "bad-kind", "unsafe-name"],
)
def test_config_errors_are_one_line_and_exit_2(
    plain_unet: Path, capsys: pytest.CaptureFixture[str], extra: list[str], message: str
) -> None:
    assert main(["config", str(plain_unet), *extra]) == 2
    captured = capsys.readouterr()
    assert captured.out == ""
    assert captured.err.startswith("error: ")
    assert message in captured.err


@pytest.mark.parametrize("shape", ["1,a,3", "1,0,3", ""])
def test_malformed_shapes_are_usage_errors(plain_unet: Path, shape: str, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["config", str(plain_unet), "--input-shape", shape]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: monai-triton config: argument --input-shape: ")
    assert err.count("\n") == 1
