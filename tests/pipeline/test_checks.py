"""What would silently spoil a result is refused, with how much and where; errors name the image."""

from __future__ import annotations

import logging

import numpy as np
import pytest
import torch

from monai_triton_ops.errors import InferenceTimeoutError, InputDataError, InputValidationError
from monai_triton_ops.pipeline.checks import check_finite, image_context
from monai_triton_ops.pipeline.run import InferenceSettings


def test_nan_and_inf_are_refused_with_their_count_and_place() -> None:
    image = torch.zeros(2, 10, 12, 8)
    image[1, 3, 4, 5] = float("nan")
    image[1, 6, 4, 2] = float("nan")
    image[0, 7, 9, 5] = float("inf")
    with pytest.raises(InputDataError) as caught:
        check_finite(image, model="seg")
    assert str(caught.value) == (
        "model 'seg': the input image has 3 non-finite voxel(s) (2 NaN, 1 Inf) of 1920 (shape [2, 10, 12, 8], "
        "channel first); first at channel 0, voxel (7, 9, 5), all within voxels 3..7 x 4..9 x 2..5; "
        "fix the image, or pass --allow-non-finite to run on it anyway"
    )


def test_allowed_non_finite_voxels_pass_with_a_warning(caplog: pytest.LogCaptureFixture) -> None:
    image = np.ones((1, 4, 4, 4), np.float32)
    image[0, 1, 1, 1] = np.nan
    with caplog.at_level(logging.WARNING):
        assert check_finite(image, model="seg", allow=True) == 1
    assert "1 non-finite voxel(s)" in caplog.text
    assert "kept because non-finite voxels are allowed" in caplog.text


def test_finite_and_integer_images_pass() -> None:
    assert check_finite(torch.ones(1, 3, 3, 3), model="seg") == 0
    assert check_finite(np.full((1, 3, 3, 3), 7, np.int16), model="seg") == 0


def test_errors_inside_inference_name_the_image_and_the_patches() -> None:
    settings = InferenceSettings(roi_size=(32, 32, 32), sw_batch_size=4)
    with pytest.raises(InputValidationError) as caught, image_context(torch.zeros(2, 48, 40, 32), settings, model="m"):
        raise InputValidationError("model 'm' input 'x': expected shape [-1, 1, -1, -1, -1], got [4, 2, 32, 32, 32]")
    assert str(caught.value).endswith(
        "; the image is [2, 48, 40, 32] (channel first, before pre-transforms), "
        "sent in sliding-window patches of [32, 32, 32], up to 4 per request"
    )
    whole = InferenceSettings(inferer="simple")
    with (
        pytest.raises(InputValidationError, match=r"sent whole in one request$"),
        image_context(torch.zeros(1, 8, 8, 8), whole, model="m"),
    ):
        raise InputValidationError("bad")
    with pytest.raises(InferenceTimeoutError, match=r"^late$"), image_context(torch.zeros(1), whole, model="m"):
        raise InferenceTimeoutError("late")
