"""Broken bundles: each gives one clear error naming the bundle's file and its config item, and no traceback.

Each is read as ``monai-triton repo describe`` reads it, in process through the CLI's edge (``cli.main``),
so what is checked is exactly what a user sees: one ``error:`` line and exit code 2.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from monai_triton_ops import cli, exits
from monai_triton_ops.bundles import read_bundle
from monai_triton_ops.errors import BundleError

from .broken import BROKEN, EXPECTED


def test_every_kind_has_its_expectation() -> None:
    assert sorted(BROKEN) == sorted(EXPECTED)
    assert len(BROKEN) >= 10


@pytest.mark.parametrize("kind", sorted(BROKEN))
def test_a_broken_bundle_gives_one_line_naming_file_and_item(
    kind: str, tmp_path: Path, capsys: pytest.CaptureFixture[str], restore_console: None
) -> None:
    path, names = BROKEN[kind](tmp_path / kind)
    ending, item, words = EXPECTED[kind]
    with pytest.raises(BundleError) as caught:
        read_bundle(path, names)
    error = caught.value
    assert error.file.rstrip("/").endswith(ending) or f"{ending}" in error.file, error.file
    assert error.item == item
    assert re.search(words, str(error)), str(error)
    if kind == "plain_torchscript":  # repo describe takes a plain TorchScript file as a model, rightly
        return
    capsys.readouterr()
    argv = ["repo", "describe", str(path)] + [arg for name in names for arg in ("--config-name", name)]
    assert cli.main(argv) == exits.USAGE
    lines = [line for line in capsys.readouterr().err.splitlines() if line.startswith(("error:", "Traceback"))]
    assert lines == [f"error: {error}"]
    if item:
        assert f"item {item!r}" in lines[0]


def test_the_error_of_a_transform_that_fails_on_the_image_names_the_item(tmp_path: Path) -> None:
    """A transform that builds but fails on the data: the item and file, not a bare MONAI traceback."""
    import torch

    from monai_triton_ops.bundles import run_bundle
    from monai_triton_ops.bundles.images import image_to_tensor

    from .makers import ct_image, unet_bundle

    bundle = read_bundle(unet_bundle(tmp_path / "b"))
    image = image_to_tensor(ct_image(), "image")
    from monai.transforms import EnsureChannelFirstd

    bundle.pre.transforms = (*bundle.pre.transforms, EnsureChannelFirstd(keys="label"))  # no such key
    with pytest.raises(BundleError, match=r"inference.json, item 'preprocessing': failed on this image"):
        run_bundle(bundle, {"image": image}, lambda x: torch.zeros(1))
