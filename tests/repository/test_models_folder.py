"""``repo build`` of a models folder (every model, one repository) and ``repo describe --ensemble``."""

from __future__ import annotations

from pathlib import Path

import pytest

from monai_triton_ops.cli import main
from monai_triton_ops.repository.builder import build_repository

from ..bundles.makers import fold_bundle, resampled, unet_bundle
from ..conftest import UNET_META, nd_format, save_model
from ..operators.test_ensemble import unet


@pytest.fixture(scope="module")
def models(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The App SDK's layout, every kind: a model.ts, a Triton model folder, a bundle folder, and 2 channels."""
    tmp_path = tmp_path_factory.mktemp("kinds")
    folder = tmp_path / "models"
    save_model(unet(0), folder / "fold0" / "model.ts", UNET_META)
    build_repository(save_model(unet(1), tmp_path / "fold1.pt", UNET_META), folder, "fold1")
    unet_bundle(folder / "spleen_ct")
    two = nd_format({"image": (1, ["2*n"] * 3, "float32")}, {"pred": (2, ["2*n"] * 3, "float32")})
    save_model(unet(2, out_channels=2), folder / "two_channels" / "model.ts", two)
    return folder


def test_repo_build_writes_every_model_of_a_models_folder_into_one_repository(
    models: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    repo = tmp_path / "repo"
    assert main(["repo", "build", str(models), "-o", str(repo)]) == 0
    out = capsys.readouterr().out
    for name in ("fold0", "fold1", "spleen_ct", "two_channels"):
        assert (repo / name / "config.pbtxt").is_file(), name
        assert f"wrote {repo / name}" in out
    assert (repo / "spleen_ct" / "configs").is_dir()  # the bundle's configs beside its network
    assert main(["repo", "check", str(repo)]) == 0

    assert main(["repo", "build", str(models), "-o", str(repo)]) == 2  # already there: nothing replaced
    assert "already holds ['fold0', 'fold1', 'spleen_ct', 'two_channels']; pass --force" in capsys.readouterr().err
    (models / "notes").mkdir()  # not a model: all or nothing, nothing written
    assert main(["repo", "build", str(models), "-o", str(tmp_path / "other")]) == 2
    assert "'notes' is not a model (no config.pbtxt, bundle configs, or model.ts / model.pt)" in capsys.readouterr().err
    assert not (tmp_path / "other").exists()
    assert not [p for p in tmp_path.iterdir() if "staging" in p.name]
    (models / "notes").rmdir()


def test_repo_describe_an_ensemble_says_whether_its_members_fit(
    models: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["repo", "describe", str(models), "--ensemble", "fold0,fold1"]) == 0
    out = capsys.readouterr().out
    assert "member 'fold0' (torchscript)" in out
    assert "member 'fold1' (triton)" in out
    assert "ensemble of 2 members ['fold0', 'fold1']: 3 output channels each; they fit together" in out
    assert main(["repo", "describe", str(models), "--ensemble", "fold0,two_channels"]) == 2
    err = capsys.readouterr().err
    assert "ensemble members predict different channels: 'fold0' 3, 'two_channels' 2" in err
    assert main(["repo", "describe", str(models), "--ensemble", "fold0,fold9"]) == 2
    assert "ensemble member(s) ['fold9'] not in models folder" in capsys.readouterr().err


def test_repo_describe_an_ensemble_of_bundles_compares_their_configs(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Bundle members share the first's pre-processing, inferer and post-processing: configs that differ are refused."""
    fold_bundle(tmp_path / "fold0", 0)
    fold_bundle(tmp_path / "fold1", 1)
    fold_bundle(tmp_path / "fold3", 3, preprocessing=resampled([2.0, 2.0, 2.0]))
    assert main(["repo", "describe", str(tmp_path), "--ensemble", "fold0,fold1"]) == 0
    assert "3 output channels each; one pre-processing, inferer and post-processing" in capsys.readouterr().out
    assert main(["repo", "describe", str(tmp_path), "--ensemble", "fold0,fold3"]) == 2
    err = capsys.readouterr().err
    assert "ensemble member 'fold3' has [2.0, 2.0, 2.0] as item 'preprocessing#transforms#3#pixdim'" in err
    assert "member 'fold0' has [1.5, 1.5, 2.0]" in err
