"""``monai-triton repo build | describe | check`` on a MONAI Bundle (folder or ``.ts``), through the CLI."""

from __future__ import annotations

from pathlib import Path

import pytest

from monai_triton_ops.bundles import read_bundle
from monai_triton_ops.cli import main
from monai_triton_ops.repository.config import parse_config, signature_from_config

from ..bundles.makers import rgb_bundle, unet_bundle

pytestmark = pytest.mark.usefixtures("restore_console")


@pytest.mark.parametrize("form", ["pt", "archive"])
def test_repo_build_names_tensors_from_the_metadata_and_copies_the_configs(
    form: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    bundle = unet_bundle(tmp_path / "spleen", form)
    repo = tmp_path / "repo"
    assert main(["repo", "build", str(bundle), "-o", str(repo)]) == 0
    folder = repo / "tiny_spleen"  # the metadata's name
    assert capsys.readouterr().out == f"wrote {folder}\n"
    config = parse_config((folder / "config.pbtxt").read_text(), source="test", name="tiny_spleen")
    signature = signature_from_config(config)
    assert (signature.input_names, signature.output_names) == (("image",), ("pred",))
    assert [s.shape for s in (*signature.inputs, *signature.outputs)] == [(-1, 1, -1, -1, -1), (-1, 3, -1, -1, -1)]
    assert {p.name for p in (folder / "configs").iterdir()} == {"inference.json", "metadata.json"}
    copy = read_bundle(folder)  # the model folder is a bundle: what a client's bundle_path may name
    assert copy.network == folder / "1" / "model.pt"
    assert (copy.input_names, type(copy.inferer).__name__) == (["image"], "SlidingWindowInferer")


def test_repo_build_libtorch_flavour_and_name(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    repo = tmp_path / "repo"
    bundle = rgb_bundle(tmp_path / "endo")
    assert main(["repo", "build", str(bundle), "-o", str(repo), "--name", "endo", "--flavor", "libtorch"]) == 0
    text = (repo / "endo" / "config.pbtxt").read_text()
    assert 'platform: "pytorch_libtorch"' in text
    assert "dims: [-1, 3, -1, -1]" in text
    assert main(["repo", "build", str(bundle), "-o", str(repo), "--name", "endo"]) == 2  # exists: --force
    assert "already exists" in capsys.readouterr().err


def test_repo_describe_and_check_a_bundle(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    bundle = unet_bundle(tmp_path / "spleen", "pt")
    capsys.readouterr()
    assert main(["repo", "describe", str(bundle)]) == 0
    out = capsys.readouterr().out
    assert "input 0   image FP32 [-1, 1, -1, -1, -1]" in out
    assert "network_def weights" in out
    assert main(["repo", "check", str(bundle)]) == 0
    assert "tiny_spleen  MONAI bundle" in capsys.readouterr().out
    (bundle / "configs" / "metadata.json").unlink()
    assert main(["repo", "check", str(bundle)]) == 2
    captured = capsys.readouterr()
    assert "metadata.json: is missing" in captured.out
    assert "1 of 1 model(s) have problems" in captured.err


def test_the_cache_keys_models_by_content(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Two bundles of one name, different weights: two models (the in-process server holds models by name)."""
    from monai_triton_ops.repository.bundle import cached_repository

    monkeypatch.setenv("MONAI_TRITON_CACHE", str(tmp_path / "cache"))
    first = read_bundle(unet_bundle(tmp_path / "a", "pt"))
    second_folder = unet_bundle(tmp_path / "b", "pt")
    import torch

    from ..bundles.makers import UNET_DEF, network

    torch.save(network(UNET_DEF, seed=1).state_dict(), second_folder / "models" / "model.pt")
    second = read_bundle(second_folder)
    (repo_a, name_a), (repo_b, name_b) = cached_repository(first, "spleen"), cached_repository(second, "spleen")
    assert name_a != name_b
    assert name_a.startswith("spleen-")
    assert repo_a != repo_b
    again = read_bundle(unet_bundle(tmp_path / "c", "pt"))  # same content as the first, another folder
    assert cached_repository(again, "spleen") == (repo_a, name_a)


def test_repo_build_whole_volume_wraps_a_bundles_network(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    repo = tmp_path / "repo"
    assert main(["repo", "build", str(unet_bundle(tmp_path / "b")), "-o", str(repo), "--whole-volume"]) == 0
    assert capsys.readouterr().out.splitlines() == [
        f"wrote {repo / 'tiny_spleen'}",
        f"wrote {repo / 'tiny_spleen_volume'}",
    ]
