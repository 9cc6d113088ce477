"""The App SDK operator inside a real Holoscan ``Application``: ports, lifecycle, metadata."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest
from monai.deploy.conditions import CountCondition
from monai.deploy.core import Application, Image, Operator, OperatorSpec
from monai.transforms import AsDiscrete

from monai_triton_ops import InferenceOperator, InferenceSettings, create_backend, run_inference
from monai_triton_ops.app_args import ENV_BACKEND
from monai_triton_ops.backends.base import BackendState, BaseBackend
from monai_triton_ops.errors import BackendStateError, ConfigError
from monai_triton_ops.pipeline.image import to_channel_first

from ..conftest import UNET_META, tiny_unet


class Source(Operator):
    def __init__(self, fragment: Any, *args: Any, image: Image, **kwargs: Any) -> None:
        self.image = image
        super().__init__(fragment, *args, **kwargs)

    def setup(self, spec: OperatorSpec) -> None:
        spec.output("image")

    def compute(self, op_input: Any, op_output: Any, context: Any) -> None:
        op_output.emit(self.image, "image")


class Sink(Operator):
    def __init__(self, fragment: Any, *args: Any, **kwargs: Any) -> None:
        self.received: list[Image] = []
        super().__init__(fragment, *args, **kwargs)

    def setup(self, spec: OperatorSpec) -> None:
        spec.input("seg_image")

    def compute(self, op_input: Any, op_output: Any, context: Any) -> None:
        self.received.append(op_input.receive("seg_image"))


class OneShotApp(Application):
    def __init__(self, image: Image, **operator_kwargs: Any) -> None:
        self.image = image
        self.operator_kwargs = operator_kwargs
        super().__init__()

    def compose(self) -> None:
        source = Source(self, CountCondition(self, 1), image=self.image, name="source")
        self.infer = InferenceOperator(self, name="infer", **self.operator_kwargs)
        self.sink = Sink(self, name="sink")
        self.add_flow(source, self.infer, {("image", "image")})
        self.add_flow(self.infer, self.sink, {("seg_image", "seg_image")})


@pytest.fixture
def image() -> Image:
    data = np.random.default_rng(0).standard_normal((10, 12, 16)).astype(np.float32)  # (D, H, W)
    return Image(data, metadata={"SeriesInstanceUID": "1.2.3", "affine": np.diag([1.0, 2.0, 3.0, 1.0])})


def test_the_operator_runs_in_an_application_and_keeps_geometry(unet_repo: Path, image: Image) -> None:
    settings = InferenceSettings(roi_size=(8, 8, 8), sw_batch_size=2, overlap=0.25)
    post = AsDiscrete(argmax=True)
    app = OneShotApp(
        image,
        model_name="unet",
        backend="torch",
        backend_options={"model_repository": unet_repo},
        settings=settings,
        post_transforms=post,
    )
    app.run()
    (seg,) = app.sink.received
    assert seg.asnumpy().shape == image.asnumpy().shape
    assert seg.metadata()["SeriesInstanceUID"] == "1.2.3"
    with create_backend("torch", "unet", model_repository=unet_repo) as backend:
        tensor = to_channel_first(image.asnumpy(), image.metadata(), spatial_rank=3, model="unet")
        expected = run_inference(tensor, backend, settings, post_transforms=post)
    np.testing.assert_array_equal(seg.asnumpy(), np.asarray(expected[0]).T)
    with pytest.raises(BackendStateError):  # stop() released the backend
        app.infer.backend  # noqa: B018


def test_start_opens_and_stop_closes_the_backend(
    unet_repo: Path, image: Image, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(ENV_BACKEND, "torch")
    app = OneShotApp(image, model_name="unet", backend_options={"model_repository": unet_repo})
    app.compose()
    op = app.infer
    assert op.backend_spec == "torch"
    op.start()
    backend = op.backend
    assert backend.state is BackendState.OPEN
    result = op.compute_impl(image)
    assert result.asnumpy().shape == (*image.asnumpy().shape, 3)  # logits: channel last, like the input order
    op.stop()
    op.stop()  # idempotent
    assert backend.state is BackendState.CLOSED


def test_the_spec_comes_from_the_environment_when_the_app_gives_none(
    unet_repo: Path, image: Image, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(ENV_BACKEND, "grpc://triton.example:8001")
    app = OneShotApp(image, model_name="unet", backend_options={"model_repository": unet_repo})
    app.compose()
    assert app.infer.backend_spec == "grpc://triton.example:8001"


def test_a_backend_factory_and_settings_from_the_models_metadata(make_repo, image: Image) -> None:
    meta = {**UNET_META, "inference": {"roi_size": [8, 8, 8], "sw_batch_size": 4, "overlap": 0.25}}
    repo = make_repo("unet", tiny_unet(), meta)
    created = []

    def factory() -> BaseBackend:
        created.append(create_backend("torch", "unet", model_repository=repo, max_in_flight=3))
        return created[-1]

    app = OneShotApp(image, model_name="unet", backend=factory, settings_overrides={"request_batch_size": 2})
    app.compose()
    op = app.infer
    assert op.backend_spec is None
    op.start()
    assert op.backend is created[0]
    assert op.settings == InferenceSettings(roi_size=(8, 8, 8), sw_batch_size=4, overlap=0.25, request_batch_size=2)
    result = op.compute_impl(image)
    op.stop()
    with create_backend("torch", "unet", model_repository=repo) as backend:
        tensor = to_channel_first(image.asnumpy(), image.metadata(), spatial_rank=3, model="unet")
        expected = run_inference(tensor, backend, InferenceSettings(roi_size=(8, 8, 8), sw_batch_size=2))
    np.testing.assert_array_equal(result.asnumpy(), np.asarray(expected).T)
    with pytest.raises(ConfigError, match="either settings or settings_overrides"):
        InferenceOperator(app, model_name="unet", settings=InferenceSettings(), settings_overrides={"progress": True})
