"""The Holoscan-free data flow: transforms, inferer and backend, and the App SDK voxel order."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch
from monai.transforms import AsDiscrete, Compose, NormalizeIntensity

from monai_triton_ops import InferenceSettings, create_backend, run_inference
from monai_triton_ops.errors import ConfigError, InputDataError
from monai_triton_ops.pipeline.image import affine_of, from_channel_first, to_channel_first


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"inferer": "sliding_window"}, "roi_size"),
        ({"inferer": "sliding_window", "roi_size": (8, 0, 8)}, "roi_size"),
        ({"inferer": "patches"}, "inferer must be"),
        ({"inferer": "simple", "overlap": 1.0}, "overlap"),
        ({"inferer": "simple", "sw_batch_size": 0}, "sw_batch_size"),
        ({"inferer": "simple", "mode": "median"}, "mode"),
        ({"request_batch_size": 0}, "request_batch_size"),
        ({"sigma_scale": 0.0}, "sigma_scale must be > 0"),
        ({"sigma_scale": (0.1, float("nan"), 0.1)}, "sigma_scale must be > 0"),
        ({"padding_mode": "edge"}, "padding_mode must be one of constant, reflect, replicate, circular"),
        ({"cval": float("inf")}, "cval must be a finite number"),
    ],
)
def test_settings_are_validated_with_the_field_named(kwargs: dict, match: str) -> None:
    with pytest.raises(ConfigError, match=match):
        InferenceSettings(**kwargs)


def test_settings_default_to_simple_and_to_sliding_window_when_a_patch_size_is_given() -> None:
    assert InferenceSettings().inferer == "simple"
    assert InferenceSettings(roi_size=(8, 8, 8)).inferer == "sliding_window"


def test_settings_from_metadata_take_the_models_inference_block_and_the_overrides() -> None:
    meta = {"inference": {"roi_size": [96, 96, 96], "sw_batch_size": 4, "overlap": 0.25, "note": "ignored"}}
    settings = InferenceSettings.from_metadata(meta, request_batch_size=2, progress=True)
    assert settings == InferenceSettings(
        roi_size=(96, 96, 96), sw_batch_size=4, overlap=0.25, request_batch_size=2, progress=True
    )
    assert InferenceSettings.from_metadata({}).inferer == "simple"
    assert InferenceSettings.from_metadata(meta, overlap=0.5).overlap == 0.5
    with pytest.raises(ConfigError, match=r"no field\(s\) \['sw_batch'\]"):
        InferenceSettings.from_metadata(meta, sw_batch=2)
    with pytest.raises(ConfigError, match="'inference' must be an object"):
        InferenceSettings.from_metadata({"inference": [96]})


def test_sliding_window_and_simple_agree_on_a_whole_image(unet_repo: Path) -> None:
    image = np.random.default_rng(0).standard_normal((1, 12, 16, 8)).astype(np.float32)
    with create_backend("torch", "unet", model_repository=unet_repo) as backend:
        simple = run_inference(image, backend, InferenceSettings(inferer="simple"))
        window = run_inference(image, backend, InferenceSettings(roi_size=(12, 16, 8)))
        patched = run_inference(image, backend, InferenceSettings(roi_size=(8, 8, 8), sw_batch_size=3, overlap=0.5))
    assert simple.shape == window.shape == patched.shape == (3, 12, 16, 8)
    torch.testing.assert_close(torch.as_tensor(window), torch.as_tensor(simple), rtol=1e-5, atol=1e-5)


def test_pre_and_post_transforms_shape_the_result(unet_repo: Path) -> None:
    image = (np.random.default_rng(0).random((1, 8, 8, 8)) * 1000).astype(np.int16)
    pre = Compose([NormalizeIntensity(dtype=np.float32)])
    post = Compose([AsDiscrete(argmax=True)])
    with create_backend("torch", "unet", model_repository=unet_repo) as backend:
        labels = run_inference(
            image, backend, InferenceSettings(inferer="simple"), pre_transforms=pre, post_transforms=post
        )
        logits = backend(pre(image)[None])
    assert tuple(labels.shape) == (1, 8, 8, 8)
    np.testing.assert_array_equal(np.asarray(labels[0]), logits[0].argmax(0).numpy())


def test_wrong_dtype_without_pre_transforms_names_the_tensor(unet_repo: Path) -> None:
    with (
        create_backend("torch", "unet", model_repository=unet_repo) as backend,
        pytest.raises(ValueError, match="expected dtype FP32, got INT16"),
    ):
        run_inference(np.zeros((1, 8, 8, 8), np.int16), backend, InferenceSettings(inferer="simple"))


def test_a_2d_image_for_a_3d_model_is_refused_before_inference(unet_repo: Path) -> None:
    with create_backend("torch", "unet", model_repository=unet_repo) as backend:
        with pytest.raises(InputDataError, match=r"model 'unet' input '\w+' expects 3D images .* got a 2D image"):
            run_inference(np.zeros((1, 64, 64), np.float32), backend, InferenceSettings(inferer="simple"))


def test_app_sdk_voxel_order_round_trips_and_keeps_the_affine() -> None:
    dhw = np.arange(2 * 3 * 4, dtype=np.float32).reshape(2, 3, 4)
    affine = np.diag([2.0, 3.0, 4.0, 1.0])
    tensor = to_channel_first(dhw, {"nifti_affine_transform": affine}, spatial_rank=3, model="m")
    assert tuple(tensor.shape) == (1, 4, 3, 2)  # (C, W, H, D)
    assert tensor[0, 3, 2, 1] == dhw[1, 2, 3]
    np.testing.assert_array_equal(tensor.affine.numpy(), affine)
    np.testing.assert_array_equal(from_channel_first(tensor), dhw)
    multichannel = np.stack([dhw, -dhw], axis=-1)  # (D, H, W, C)
    tensor = to_channel_first(multichannel, {}, spatial_rank=3, model="m")
    assert tuple(tensor.shape) == (2, 4, 3, 2)
    np.testing.assert_array_equal(from_channel_first(tensor), multichannel)


@pytest.mark.parametrize(
    ("shape", "match"), [((0, 4, 4), "empty"), ((4, 4), "expects 3D images"), ((2, 2, 2, 2, 2), "5 dims")]
)
def test_unusable_images_are_input_data_errors(shape: tuple[int, ...], match: str) -> None:
    with pytest.raises(InputDataError, match=match):
        to_channel_first(np.zeros(shape, np.float32), {}, spatial_rank=3, model="m")


def test_affine_lookup_prefers_the_generic_key_and_ignores_malformed_values() -> None:
    assert affine_of({}) is None
    assert affine_of({"affine": [[1, 2]]}) is None
    np.testing.assert_array_equal(
        affine_of({"affine": np.eye(4) * 2, "nifti_affine_transform": np.eye(4)}), np.eye(4) * 2
    )
