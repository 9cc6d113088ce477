"""Dictionary transforms: ``InferenceOperator`` runs an App SDK chain as ``MonaiSegInferenceOperator`` does.

The reference is the App SDK's own operator, running the same TorchScript file in-process on the same
image with the same chain (``LoadImaged`` with an ``InMemImageReader``, orientation, resampling, intensity
scaling; ``Activationsd``, ``Invertd`` against the pre-transforms, ``AsDiscreted``): the labels must be
identical, and so must the metadata handed on.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest
from monai.deploy.core import AppContext, Application, Image
from monai.deploy.operators.monai_seg_inference_operator import (
    InfererType,
    InMemImageReader,
    MonaiSegInferenceOperator,
)
from monai.transforms import (
    Activationsd,
    AsDiscreted,
    Compose,
    EnsureChannelFirstd,
    EnsureTyped,
    Invertd,
    LoadImaged,
    Orientationd,
    ScaleIntensityRanged,
    Spacingd,
)

from monai_triton_ops import InferenceOperator, InferenceSettings
from monai_triton_ops.errors import ConfigError
from monai_triton_ops.pipeline.dictionary import has_loader, is_dictionary_transform

from ..conftest import UNET_META, save_model, tiny_unet

KEY, PRED = "img", "seg"


@pytest.fixture(scope="module")
def fragment() -> Application:
    return Application()


@pytest.fixture(scope="module")
def model_repo(tmp_path_factory: pytest.TempPathFactory) -> Path:
    repo = tmp_path_factory.mktemp("dict") / "repo"
    save_model(tiny_unet(), repo / "unet" / "1" / "model.pt", UNET_META)
    return repo


@pytest.fixture
def image() -> Image:
    rng = np.random.default_rng(1)
    data = (rng.standard_normal((18, 20, 22)) * 60 + 40).astype(np.float32)  # (D, H, W), CT-like values
    affine = np.array([[-1.5, 0, 0, 10], [0, -1.5, 0, 20], [0, 0, 2.5, -5], [0, 0, 0, 1]])
    metadata = {
        "SeriesInstanceUID": "1.2.3.4",
        "nifti_affine_transform": affine,
        "row_pixel_spacing": 1.5,
        "col_pixel_spacing": 1.5,
        "depth_pixel_spacing": 2.5,
    }
    return Image(data, metadata=metadata)


def pre(reader: Any | None) -> Compose:
    loader = [LoadImaged(keys=KEY, reader=reader)] if reader is not None else []
    return Compose(
        [
            *loader,
            EnsureChannelFirstd(keys=KEY),
            Orientationd(keys=KEY, axcodes="RAS", labels=None),
            Spacingd(keys=KEY, pixdim=[2.0, 2.0, 2.0], mode=["bilinear"]),
            ScaleIntensityRanged(keys=KEY, a_min=-57, a_max=164, b_min=0.0, b_max=1.0, clip=True),
            EnsureTyped(keys=KEY),
        ]
    )


def post(pre_transforms: Compose) -> Compose:
    return Compose(
        [
            Activationsd(keys=PRED, softmax=True),
            Invertd(keys=PRED, transform=pre_transforms, orig_keys=KEY, nearest_interp=False, to_tensor=True),
            AsDiscreted(keys=PRED, argmax=True),
        ]
    )


def sdk_labels(fragment: Application, model_repo: Path, image: Image) -> Image:
    pre_transforms = pre(InMemImageReader(image))
    operator = MonaiSegInferenceOperator(
        fragment,
        roi_size=(8, 8, 8),
        pre_transforms=pre_transforms,
        post_transforms=post(pre_transforms),
        app_context=AppContext({"model": str(model_repo / "unet" / "1" / "model.pt")}),
        overlap=0.5,
        sw_batch_size=3,
        inferer=InfererType.SLIDING_WINDOW,
        name="sdk",
    )
    operator.input_dataset_key, operator.pred_dataset_key = KEY, PRED
    return operator.compute_impl(image, None)


def test_an_app_sdk_chain_gives_the_app_sdk_operators_labels(
    fragment: Application, model_repo: Path, image: Image
) -> None:
    expected = sdk_labels(fragment, model_repo, image)
    pre_transforms = pre(InMemImageReader(image))
    operator = InferenceOperator(  # the App SDK operator's own keywords, and its keys set afterwards
        fragment,
        roi_size=(8, 8, 8),
        pre_transforms=pre_transforms,
        post_transforms=post(pre_transforms),
        overlap=0.5,
        sw_batch_size=3,
        inferer=InfererType.SLIDING_WINDOW,
        model_name="unet",
        backend="torch",
        model_path=model_repo,
        name="ours",
    )
    operator.input_dataset_key, operator.pred_dataset_key = KEY, PRED
    assert operator.dictionary_mode
    result = operator.compute_impl(image, None)  # outside a graph: opens and closes its backend
    assert operator._backend is None
    assert result.asnumpy().dtype == np.uint8
    assert result.asnumpy().shape == image.asnumpy().shape
    np.testing.assert_array_equal(result.asnumpy(), expected.asnumpy())
    assert len(np.unique(result.asnumpy())) == 3  # every label occurs: the comparison could fail
    assert result.metadata()["SeriesInstanceUID"] == "1.2.3.4"  # the image's metadata travels on


def test_a_chain_built_before_the_image_exists_needs_no_loader(
    fragment: Application, model_repo: Path, image: Image
) -> None:
    """In ``compose()`` there is no image to bind a reader to: the operator loads it as LoadImaged would."""
    bound = pre(InMemImageReader(image))
    unbound = pre(None)
    assert has_loader(bound)
    assert not has_loader(unbound)
    results = []
    for chain in (bound, unbound):
        operator = InferenceOperator(
            fragment,
            model_name="unet",
            backend="torch",
            backend_options={"model_repository": model_repo},
            settings=InferenceSettings(roi_size=(8, 8, 8), sw_batch_size=3, overlap=0.5),
            pre_transforms=chain,
            post_transforms=post(chain),
            input_dataset_key=KEY,
            pred_dataset_key=PRED,
            name="infer",
        )
        results.append(operator.compute_impl(image).asnumpy())
    np.testing.assert_array_equal(results[0], results[1])


def test_keys_that_the_transforms_do_not_use_are_named(fragment: Application, model_repo: Path, image: Image) -> None:
    chain = pre(None)
    operator = InferenceOperator(
        fragment,
        model_name="unet",
        backend="torch",
        model_path=model_repo,
        settings=InferenceSettings(roi_size=(8, 8, 8)),
        pre_transforms=chain,
        post_transforms=post(chain),
        input_dataset_key=KEY,
        name="infer",
    )  # pred_dataset_key stays "pred", which the post-transforms do not know
    with pytest.raises(ConfigError, match=r"post-transforms failed .*\[.img., .pred.\].*pred_dataset_key .pred."):
        operator.compute_impl(image)


def test_array_transforms_stay_array_transforms() -> None:
    from monai.transforms import AsDiscrete, EnsureType

    assert not is_dictionary_transform(Compose([EnsureType(), AsDiscrete(argmax=True)]))
    assert is_dictionary_transform(Compose([Compose([EnsureTyped(keys="x")])]))
    assert not is_dictionary_transform(None)


def test_sdk_keywords_and_settings_do_not_mix(fragment: Application, model_repo: Path) -> None:
    with pytest.raises(ConfigError, match="either settings or settings_overrides"):
        InferenceOperator(
            fragment,
            model_name="unet",
            backend="torch",
            model_path=model_repo,
            settings=InferenceSettings(roi_size=(8, 8, 8)),
            roi_size=(16, 16, 16),
            name="x",
        )
    with pytest.raises(ConfigError, match="is a file; give the model repository folder"):
        InferenceOperator(
            fragment, model_name="unet", backend="torch", model_path=model_repo / "unet" / "1" / "model.pt", name="y"
        )


def test_preview_after_invertd_and_a_warning_where_the_grid_differs(
    fragment: Application, model_repo: Path, image: Image, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    for inverted in (True, False):
        chain = pre(None)
        post_chain = post(chain) if inverted else Compose([AsDiscreted(keys=PRED, argmax=True)])
        operator = InferenceOperator(
            fragment,
            model_name="unet",
            backend="torch",
            model_path=model_repo,
            settings=InferenceSettings(roi_size=(8, 8, 8)),
            pre_transforms=chain,
            post_transforms=post_chain,
            input_dataset_key=KEY,
            pred_dataset_key=PRED,
            label_names={1: "one", 2: "two"},
            name="infer",
        )
        operator.preview, operator.preview_folder = True, tmp_path / str(inverted)
        result = operator.compute_impl(image)
        assert result.asnumpy().dtype == np.uint8
        assert (tmp_path / str(inverted) / "preview.png").is_file() == inverted
    assert "no preview written" in caplog.text
    assert "need an Invertd" in caplog.text
