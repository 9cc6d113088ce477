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
from monai_triton_ops.repository.bundle import describe_bundle

from .broken import AT_DESCRIBE, BROKEN, EXPECTED


def test_every_kind_has_its_expectation() -> None:
    assert sorted(BROKEN) == sorted(EXPECTED)
    assert len(BROKEN) >= 18


@pytest.mark.parametrize("kind", sorted(BROKEN))
def test_a_broken_bundle_gives_one_line_naming_file_and_item(
    kind: str, tmp_path: Path, capsys: pytest.CaptureFixture[str], restore_console: None
) -> None:
    path, names = BROKEN[kind](tmp_path / kind)
    ending, item, words = EXPECTED[kind]
    with pytest.raises(BundleError) as caught:
        (describe_bundle if kind in AT_DESCRIBE else read_bundle)(path, names)
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


def test_a_bundle_inferer_asking_the_network_for_its_weights_is_named(tmp_path: Path) -> None:
    """A bundle-local inferer runs on every backend, but what only a local module has (its parameters) a network on a
    server cannot give: one error names the inferer item and its file, not an AttributeError deep in the script."""
    import torch

    from monai_triton_ops.bundles import run_bundle
    from monai_triton_ops.bundles.images import image_to_tensor
    from monai_triton_ops.operators.nifti import read_nifti

    from .heads import heads_bundle, volume

    folder = heads_bundle(tmp_path / "b", inferer={"_target_": "scripts.on_device.OnDeviceInferer"})
    (folder / "scripts" / "on_device.py").write_text(
        "class OnDeviceInferer:\n"
        "    def __call__(self, inputs, network):\n"
        "        return network(inputs.to(next(network.parameters()).device))\n"
    )
    bundle = read_bundle(folder)
    image = image_to_tensor(read_nifti(volume(tmp_path / "v.nii.gz")), "image")
    with pytest.raises(BundleError, match=r"inference.json, item 'inferer': asks the network for parameters\(\)"):
        run_bundle(bundle, {"image": image}, lambda x: {"seg": torch.zeros(1), "dist": torch.zeros(1)})
