"""Reading a bundle as MONAI and the App SDK read it: configs merged, items built by MONAI, loaders dropped."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch
from monai.inferers import SimpleInferer, SlidingWindowInferer
from monai.transforms import Invertd, LoadImaged, SaveImaged

from monai_triton_ops.bundles import MetaNetwork, read_bundle, run_bundle
from monai_triton_ops.bundles.images import image_to_tensor, tensor_to_image
from monai_triton_ops.bundles.transforms import names

from .makers import ct_image, rgb_bundle, unet_bundle


@pytest.mark.parametrize("form", ["ts", "pt", "archive"])
def test_the_three_forms_read_the_same(form: str, tmp_path: Path) -> None:
    bundle = read_bundle(unet_bundle(tmp_path / "b", form))
    assert (bundle.input_names, bundle.output_names) == (["image"], ["pred"])
    assert bundle.network_is_torchscript == (form != "pt")
    assert (bundle.scripted is None) == (form != "pt")  # network_def + weights: built and checked at read time
    assert "EnsureChannelFirstd" in names(bundle.pre)


def test_loaders_and_savers_are_dropped_everything_else_kept(tmp_path: Path) -> None:
    bundle = read_bundle(unet_bundle(tmp_path / "b"))
    assert not any(isinstance(t, LoadImaged | SaveImaged) for t in (*bundle.pre.transforms, *bundle.post.transforms))
    assert names(bundle.pre) == [
        "EnsureChannelFirstd",
        "Orientationd",
        "Spacingd",
        "ScaleIntensityRanged",
        "EnsureTyped",
    ]
    assert names(bundle.post) == ["Activationsd", "Invertd", "AsDiscreted"]
    invert = bundle.post.transforms[1]
    assert isinstance(invert, Invertd)
    assert invert.transform is bundle.pre  # inverts the chain the image went through


def test_the_inferer_is_the_bundles_own_object(tmp_path: Path) -> None:
    inferer = read_bundle(unet_bundle(tmp_path / "b")).inferer
    assert isinstance(inferer, SlidingWindowInferer)
    assert (tuple(inferer.roi_size), inferer.sw_batch_size, inferer.overlap) == ((16, 16, 16), 4, 0.5)
    assert (inferer.mode, inferer.sigma_scale, inferer.padding_mode) == ("gaussian", 0.125, "constant")
    assert isinstance(read_bundle(rgb_bundle(tmp_path / "rgb")).inferer, SimpleInferer)


def test_config_names_merge_in_order_json_and_yaml(tmp_path: Path) -> None:
    """A later config replaces an item; ``+item`` extends one (MONAI's merge), YAML as JSON."""
    folder = unet_bundle(tmp_path / "b")
    (folder / "configs" / "fast.yaml").write_text(
        "inferer:\n  _target_: SlidingWindowInferer\n  roi_size: [32, 32, 32]\n  mode: constant\n"
        "+imports: ['$import numpy']\n"
    )
    bundle = read_bundle(folder, ["inference", "fast"])
    assert tuple(bundle.inferer.roi_size) == (32, 32, 32)
    assert bundle.inferer.mode == "constant"
    assert bundle.config.parser["imports"] == ["$import torch", "$import numpy"]
    assert bundle.config.file_of("inferer").endswith("fast.yaml")
    assert read_bundle(folder, ["fast", "inference"]).inferer.mode == "gaussian"  # order decides


def test_bundle_root_is_the_folder_and_its_scripts_are_importable(tmp_path: Path) -> None:
    folder = unet_bundle(tmp_path / "mybundle")
    (folder / "scripts").mkdir()
    (folder / "scripts" / "__init__.py").write_text("")
    (folder / "scripts" / "shift.py").write_text(
        "from monai.transforms import MapTransform\n\n"
        "class Shiftd(MapTransform):\n"
        "    def __init__(self, keys, by):\n        super().__init__(keys)\n        self.by = by\n\n"
        "    def __call__(self, data):\n        d = dict(data)\n"
        "        for k in self.keys:\n            d[k] = d[k] + self.by\n        return d\n"
    )
    config = json.loads((folder / "configs" / "inference.json").read_text())
    config["preprocessing"]["transforms"].append({"_target_": "scripts.shift.Shiftd", "keys": "image", "by": 1.0})
    config["root_seen"] = "$@bundle_root"
    (folder / "configs" / "inference.json").write_text(json.dumps(config))
    bundle = read_bundle(folder)
    assert names(bundle.pre)[-1] == "Shiftd"
    assert Path(bundle.config.parsed("root_seen")) == folder.resolve()


def test_post_processing_gets_the_networks_output_as_local_torchscript_gives_it(tmp_path: Path) -> None:
    """A backend returns a plain tensor; the post-processing sees a MetaTensor with the input's metadata (affine,
    applied operations), as with the local TorchScript module, so transforms that read the prediction's own meta
    (``Invertd`` without the image in the dictionary, ``Orientationd``/``Spacingd`` on ``pred``) agree.
    """
    from monai.data import MetaTensor
    from monai.transforms import Lambdad

    bundle = read_bundle(unet_bundle(tmp_path / "b", "ts", inferer={"_target_": "SimpleInferer"}))
    module = torch.jit.load(str(bundle.network))
    seen: list[object] = []
    bundle.post.transforms = (Lambdad("pred", lambda p: seen.append(p) or p), *bundle.post.transforms)

    def plain(x: torch.Tensor) -> torch.Tensor:
        return torch.as_tensor(module(x)).as_subclass(torch.Tensor).clone()

    image = ct_image((16, 24, 24))
    outputs, meta = run_bundle(bundle, {"image": image_to_tensor(image, "image")}, plain)
    local, _ = run_bundle(bundle, {"image": image_to_tensor(image, "image")}, module)
    from_backend, from_local = seen
    assert isinstance(from_backend, MetaTensor)
    assert isinstance(from_local, MetaTensor)
    np.testing.assert_array_equal(np.asarray(from_backend.affine), np.asarray(from_local.affine))
    assert len(from_backend.applied_operations) == len(from_local.applied_operations) > 0
    np.testing.assert_array_equal(np.asarray(local["pred"]), np.asarray(outputs["pred"]))
    assert tensor_to_image(outputs["pred"], meta).asnumpy().shape == image.asnumpy().shape  # inverted to its grid
    probe = MetaTensor(torch.zeros(1, 1, 16, 16, 16), affine=torch.diag(torch.tensor([2.0, 2.0, 3.0, 1.0])))
    wrapped = MetaNetwork(plain)(probe)
    assert isinstance(wrapped, MetaTensor)
    assert torch.equal(wrapped.affine, probe.affine)


def test_non_square_dicom_pixels_are_placed_as_the_dicom_standard_says() -> None:
    """PS3.3 C.7.6.2.1.1: column index i steps by the column spacing (PixelSpacing[1]) along the row direction."""
    from monai.deploy.core import Image

    row_spacing, col_spacing = 0.5, 2.0  # PixelSpacing = [0.5, 2.0]
    # What DICOMSeriesToVolumeOperator gives for identity orientation (rows along x, columns along y), slices 3 apart:
    # its NIfTI affine multiplies the row direction by the *row* spacing (and flips x, y to RAS).
    sdk_affine = np.array([[-row_spacing, 0, 0, 10.0], [0, -col_spacing, 0, 20.0], [0, 0, 3.0, -5.0], [0, 0, 0, 1]])
    metadata = {
        "SeriesInstanceUID": "1.2.3",
        "nifti_affine_transform": sdk_affine,
        "row_pixel_spacing": row_spacing,
        "col_pixel_spacing": col_spacing,
        "depth_pixel_spacing": 3.0,
    }
    tensor = image_to_tensor(Image(np.zeros((4, 6, 8), np.float32), metadata=metadata), "image")
    affine = np.asarray(tensor.affine)
    np.testing.assert_allclose(np.linalg.norm(affine[:3, :3], axis=0), [col_spacing, row_spacing, 3.0])
    np.testing.assert_allclose(affine[:3, 3], sdk_affine[:3, 3])  # the first voxel stays where it is
    np.testing.assert_allclose(np.asarray(tensor.meta["spacing"]), [col_spacing, row_spacing, 3.0])
    square = {**metadata, "col_pixel_spacing": row_spacing}
    square["nifti_affine_transform"] = np.diag([-row_spacing, -row_spacing, 3.0, 1.0])
    same = image_to_tensor(Image(np.zeros((4, 6, 8), np.float32), metadata=square), "image")
    np.testing.assert_array_equal(np.asarray(same.affine), square["nifti_affine_transform"])  # the App SDK's


def test_our_nifti_loaders_image_keeps_its_affine(tmp_path: Path) -> None:
    """NIfTI is not DICOM: its affine is right as it is, non-square voxels included (the App SDK's conversion)."""
    import nibabel as nib

    from monai_triton_ops.operators.nifti import read_nifti

    affine = np.diag([0.5, 2.0, 3.0, 1.0])
    nib.save(nib.Nifti1Image(np.zeros((8, 6, 4), np.float32), affine), tmp_path / "t.nii.gz")
    tensor = image_to_tensor(read_nifti(tmp_path / "t.nii.gz"), "image")
    np.testing.assert_array_equal(np.asarray(tensor.affine), affine)
    assert tuple(tensor.shape) == (8, 6, 4)
