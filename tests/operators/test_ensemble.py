"""Ensembles and test-time mirroring on torch: equal to the mean of each member run alone, in a real Application."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from monai.deploy.conditions import CountCondition
from monai.deploy.core import Application, Image
from monai.networks.nets import UNet
from monai.transforms import AsDiscrete

from monai_triton_ops import (
    Ensemble,
    EnsembleInferenceOperator,
    InferenceSettings,
    Member,
    create_backend,
    run_inference,
)
from monai_triton_ops.errors import ConfigError, ModelNotFoundError, UsageError
from monai_triton_ops.pipeline import EnsemblePredictor, mirror_flips
from monai_triton_ops.pipeline.image import to_channel_first

from ..conftest import UNET_META, nd_format, save_model
from .test_operator import Sink, Source

SIZE = 32
WINDOWS = InferenceSettings(roi_size=(16, 16, 16), sw_batch_size=4, overlap=0.25)


def unet(seed: int, out_channels: int = 3) -> torch.nn.Module:
    torch.manual_seed(seed)
    return UNet(spatial_dims=3, in_channels=1, out_channels=out_channels, channels=(4, 8), strides=(2,))


@pytest.fixture(scope="module")
def models(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A models folder: three folds of one tiny UNet (3 channels), and one with 2 channels."""
    repo = tmp_path_factory.mktemp("models")
    for seed in range(3):
        save_model(unet(seed), repo / f"fold{seed}" / "1" / "model.pt", UNET_META)
    two = nd_format({"image": (1, ["2*n"] * 3, "float32")}, {"pred": (2, ["2*n"] * 3, "float32")})
    save_model(unet(7, out_channels=2), repo / "two_channels" / "1" / "model.pt", two)
    return repo


@pytest.fixture(scope="module")
def image() -> Image:
    data = np.random.default_rng(0).standard_normal((SIZE, SIZE, SIZE)).astype(np.float32)
    return Image(data, metadata={"SeriesInstanceUID": "1.2.3", "affine": np.eye(4)})


def alone(models: Path, name: str, image: Image, settings: InferenceSettings, flip: Sequence[int] = ()) -> torch.Tensor:
    """One member run alone on the (mirrored) image, its prediction mirrored back: the hand-made reference."""
    tensor = to_channel_first(image.asnumpy(), image.metadata(), spatial_rank=3, model=name)
    dims = tuple(1 + a for a in flip)
    with create_backend("torch", name, model_repository=models) as backend:
        out = run_inference(torch.flip(tensor, dims) if dims else tensor, backend, settings)
    return torch.flip(out, dims) if dims else out


def run_app(image: Image, **kwargs: Any) -> np.ndarray:
    class App(Application):
        def compose(self) -> None:
            source = Source(self, CountCondition(self, 1), image=image, name="source")
            self.infer = EnsembleInferenceOperator(self, name="ensemble", backend="torch", **kwargs)
            self.sink = Sink(self, name="sink")
            self.add_flow(source, self.infer, {("image", "image")})
            self.add_flow(self.infer, self.sink, {("seg_image", "seg_image")})

    app = App()
    app.run()
    (result,) = app.sink.received
    return np.asarray(result.asnumpy())


def test_the_ensemble_is_the_mean_of_its_members_run_alone_and_its_labels_follow_every_member(
    models: Path, image: Image
) -> None:
    names = ["fold0", "fold1", "fold2"]
    options = {"model_repository": models}
    probs = run_app(image, ensemble=Ensemble(names), settings=WINDOWS, backend_options=options)
    members = [alone(models, n, image, WINDOWS) for n in names]
    by_hand = np.asarray(torch.stack(members).mean(0)).T  # (C, W, H, D) -> the input's (D, H, W, C)
    assert np.abs(probs - by_hand).max() <= 1e-5
    assert np.abs(probs - np.asarray(members[0]).T).max() > 1e-3  # not one member's answer

    weighted = run_app(image, ensemble=Ensemble(names, weights=(1, 2, 1)), settings=WINDOWS, backend_options=options)
    by_hand = np.asarray((members[0] + 2 * members[1] + members[2]) / 4).T
    assert np.abs(weighted - by_hand).max() <= 1e-5

    post = AsDiscrete(argmax=True)
    labels = run_app(image, ensemble=Ensemble(names), settings=WINDOWS, backend_options=options, post_transforms=post)
    np.testing.assert_array_equal(labels, np.asarray(post(torch.stack(members).mean(0)))[0].T)
    changed = models.parent / "changed"  # one member's weights changed: the ensemble's labels change
    for n in names:
        save_model(unet({"fold2": 11}.get(n, int(n[-1]))), changed / n / "1" / "model.pt", UNET_META)
    relabelled = run_app(
        image,
        ensemble=Ensemble(names),
        settings=WINDOWS,
        backend_options={"model_repository": changed},
        post_transforms=post,
    )
    assert (relabelled != labels).any()


def test_mirroring_is_the_mean_of_the_mirrored_images_each_flipped_back(models: Path, image: Image) -> None:
    simple = InferenceSettings(inferer="simple")
    flips = mirror_flips((0, 1, 2))
    assert len(flips) == 8
    assert flips[0] == ()
    options = {"model_repository": models}
    tta = run_app(image, ensemble=Ensemble(["fold0"], mirror_axes=(0, 1, 2)), settings=simple, backend_options=options)
    by_hand = torch.stack([alone(models, "fold0", image, simple, f) for f in flips]).mean(0)
    assert np.abs(tta - np.asarray(by_hand).T).max() <= 1e-5

    both = run_app(
        image, ensemble=Ensemble(["fold0", "fold1"], mirror_axes=(2,)), settings=simple, backend_options=options
    )
    by_hand = torch.stack([alone(models, n, image, simple, f) for n in ("fold0", "fold1") for f in ((), (2,))]).mean(0)
    assert np.abs(both - np.asarray(by_hand).T).max() <= 1e-5


def test_a_user_function_combines_the_members_predictions(models: Path, image: Image) -> None:
    simple = InferenceSettings(inferer="simple")
    ensemble = Ensemble(["fold0", "fold1"], combine=lambda predictions: torch.stack(predictions).amax(0))
    result = run_app(image, ensemble=ensemble, settings=simple, backend_options={"model_repository": models})
    by_hand = torch.maximum(alone(models, "fold0", image, simple), alone(models, "fold1", image, simple))
    np.testing.assert_array_equal(result, np.asarray(by_hand).T)


def test_bad_ensembles_are_refused_by_name_before_anything_runs(models: Path, image: Image) -> None:
    options = {"model_repository": models}
    with pytest.raises(ModelNotFoundError, match=r"ensemble member 'fold9' is not in the models folder '.*' \(models"):
        run_app(image, ensemble=Ensemble(["fold0", "fold9"]), backend_options=options)
    with pytest.raises(
        ConfigError, match="ensemble member 'two_channels' gives 2 output channels, member 'fold0' gives 3"
    ):
        run_app(image, ensemble=Ensemble(["fold0", Member("two_channels")]), backend_options=options)
    with pytest.raises(ConfigError, match="ensemble weights: 1 given for 2 members"):
        run_app(image, ensemble=Ensemble(["fold0", "fold1"], weights=(1,)), backend_options=options)
    with pytest.raises(ConfigError, match="mirror axes are spatial axes counted from 0"):
        run_app(image, ensemble=Ensemble(["fold0"], mirror_axes=(-1,)), backend_options=options)
    volume = "grpc://127.0.0.1:9?mode=volume"  # refused at start, before anything connects (nothing listens on 9)
    tta = Ensemble([Member("fold0", backend=volume)], mirror_axes=(0,))
    for ensemble in (tta, Ensemble(["fold0", Member("fold1", backend=volume)])):
        with pytest.raises(ConfigError, match=r"ensemble member 'fold\d': mode=volume sends the whole image"):
            run_app(image, ensemble=ensemble, backend_options=options)
    with pytest.raises(UsageError, match=r"mirror axes \[3\] are outside the 3 spatial axes"):
        with create_backend("torch", "fold0", model_repository=models) as backend:
            EnsemblePredictor([backend], flips=((3,),))(torch.zeros(1, 1, 8, 8, 8))


def test_each_member_takes_its_own_deploy_time_backend(models: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """``MONAI_TRITON_BACKEND='torch;fold1=grpc://...'``: fold1 remote, the others in-process (nothing connects yet)."""
    from monai.deploy.core import AppContext

    monkeypatch.setenv("MONAI_TRITON_BACKEND", "torch;fold1=grpc://127.0.0.1:9")
    monkeypatch.setenv("MONAI_TRITON_TIMEOUT_S", "7")
    context = AppContext({"model": str(models)})
    op = EnsembleInferenceOperator(Application(), app_context=context, ensemble=Ensemble(["fold0", "fold1", "fold2"]))
    specs = [spec for spec, _ in op._member_backends]
    assert specs == ["torch", "grpc://127.0.0.1:9", "torch"]
    assert all(options["timeout_s"] == "7" for _, options in op._member_backends)
