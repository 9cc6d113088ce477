"""Ensembles over Triton, members on different backends; inference operators side by side under Holoscan's
multi-thread and event-based schedulers. One tritonserver for the module; labels compared with torch's."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from monai.deploy.conditions import CountCondition
from monai.deploy.core import Application, Image
from monai.transforms import AsDiscrete

from monai_triton_ops import (
    Ensemble,
    EnsembleInferenceOperator,
    InferenceOperator,
    InferenceSettings,
    Member,
    create_backend,
    run_inference,
)
from monai_triton_ops.pipeline.image import to_channel_first
from monai_triton_ops.repository.builder import build_repository

from ..conftest import UNET_META, save_model
from .test_ensemble import SIZE, unet
from .test_operator import Sink, Source

pytestmark = pytest.mark.triton
SIMPLE = InferenceSettings(inferer="simple")
POST = AsDiscrete(argmax=True)
NAMES = ("fold0", "fold1")


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Path, Path, Any]]:
    """(TorchScript folder for torch, Triton repository for triton and the server, the running server)."""
    from monai_triton_ops.errors import ServerNotFoundError
    from monai_triton_ops.server import LocalTritonServer, find_tritonserver

    try:
        find_tritonserver()
    except ServerNotFoundError as exc:
        pytest.skip(f"no tritonserver: {exc}")
    plain, repo = tmp_path_factory.mktemp("plain"), tmp_path_factory.mktemp("repo")
    for seed, name in enumerate(NAMES):
        model = save_model(unet(seed), plain / name / "1" / "model.pt", UNET_META)
        build_repository(model, repo, name, flavor="python", instance_kind="cpu")
    with LocalTritonServer(repo, startup_timeout_s=180.0) as server:
        # fold0 stays loaded in the process's one in-process server for the module: every test's triton
        # operators share it (and its load) instead of starting and loading their own
        with create_backend("triton", "fold0", model_repository=repo):
            yield plain, repo, server


@pytest.fixture(scope="module")
def image() -> Image:
    data = np.random.default_rng(1).standard_normal((SIZE, SIZE, SIZE)).astype(np.float32)
    return Image(data, metadata={"SeriesInstanceUID": "1.2.3", "affine": np.eye(4)})


def torch_labels(plain: Path, image: Image, names: tuple[str, ...], flips: tuple[tuple[int, ...], ...]) -> np.ndarray:
    """The labels of the mean of each member run alone on torch over each mirrored image, flipped back."""
    tensor = to_channel_first(image.asnumpy(), image.metadata(), spatial_rank=3, model="fold0")
    outs = []
    for name in names:
        with create_backend("torch", name, model_repository=plain) as backend:
            for flip in flips:
                dims = tuple(1 + a for a in flip)
                out = run_inference(torch.flip(tensor, dims) if dims else tensor, backend, SIMPLE)
                outs.append(torch.flip(out, dims) if dims else out)
    return np.asarray(POST(torch.stack(outs).mean(0)))[0].T


class Graph(Application):
    """One source, the given operators each to a sink of its own."""

    def __init__(self, image: Image, make: dict[str, Any], scheduler: str | None = None) -> None:
        self.image, self.make, self.scheduler_name = image, make, scheduler
        super().__init__()

    def compose(self) -> None:
        from holoscan.schedulers import EventBasedScheduler, MultiThreadScheduler

        source = Source(self, CountCondition(self, 1), image=self.image, name="source")
        self.sinks = {}
        for name, make in self.make.items():
            op = make(self, name)
            self.sinks[name] = Sink(self, name=f"{name}_sink")
            self.add_flow(source, op, {("image", "image")})
            self.add_flow(op, self.sinks[name], {("seg_image", "seg_image")})
        if self.scheduler_name == "multi_thread":
            self.scheduler(MultiThreadScheduler(self, name="mt", worker_thread_number=3, stop_on_deadlock=True))
        elif self.scheduler_name == "event_based":
            self.scheduler(EventBasedScheduler(self, name="eb", worker_thread_number=3, stop_on_deadlock=True))

    def labels(self, name: str) -> np.ndarray:
        (result,) = self.sinks[name].received
        return np.asarray(result.asnumpy())


def test_an_ensemble_with_members_on_grpc_http_and_in_process_triton_gives_torchs_labels(
    served: tuple[Path, Path, Any], image: Image
) -> None:
    plain, repo, server = served
    members = [Member("fold0", backend="triton"), Member("fold1", backend=server.grpc_url)]
    ensemble = Ensemble(members, mirror_axes=(2,))
    graph = Graph(
        image,
        {
            "mixed": lambda app, name: EnsembleInferenceOperator(
                app, name=name, ensemble=ensemble, settings=SIMPLE, post_transforms=POST, model_path=repo
            ),
            "http": lambda app, name: EnsembleInferenceOperator(
                app, name=name, ensemble=Ensemble(NAMES), backend=server.http_url, settings=SIMPLE, post_transforms=POST
            ),
        },
    )
    graph.run()
    np.testing.assert_array_equal(graph.labels("mixed"), torch_labels(plain, image, NAMES, ((), (2,))))
    np.testing.assert_array_equal(graph.labels("http"), torch_labels(plain, image, NAMES, ((),)))


@pytest.mark.parametrize("scheduler", ["multi_thread", "event_based"])
def test_inference_operators_side_by_side_under_holoscans_parallel_schedulers(
    served: tuple[Path, Path, Any], image: Image, scheduler: str
) -> None:
    """Two operators on the process's one in-process server, one over gRPC and one over HTTP, all at once."""
    plain, repo, server = served

    def operator(model: str, backend: str) -> Any:
        options = {"model_repository": repo} if backend == "triton" else {}
        return lambda app, name: InferenceOperator(
            app, name=name, model_name=model, backend=backend, backend_options=options, settings=SIMPLE,
            post_transforms=POST,
        )  # fmt: skip

    graph = Graph(
        image,
        {
            "a": operator("fold0", "triton"),
            "b": operator("fold0", "triton"),
            "c": operator("fold1", server.grpc_url),
            "d": operator("fold0", server.http_url),
        },
        scheduler,
    )
    graph.run()
    for name, model in (("a", "fold0"), ("b", "fold0"), ("c", "fold1"), ("d", "fold0")):
        np.testing.assert_array_equal(graph.labels(name), torch_labels(plain, image, (model,), ((),)), err_msg=name)


def test_an_ensemble_of_bundle_folds_over_grpc_gives_torchs_labels(
    served: tuple[Path, Path, Any], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Folds of one bundle whose networks are the served ``fold0`` and ``fold1``: the bundles give the pre- and
    post-processing here, the server the networks; with mirroring, as on torch."""
    from monai.deploy.core import IOType
    from monai.deploy.operators.monai_bundle_inference_operator import IOMapping

    from ..bundles.makers import LABELS_POST, ct_image, fold_bundle
    from .test_ensemble_bundles import run

    monkeypatch.setenv("MONAI_TRITON_CACHE", str(tmp_path / "cache"))  # torch's models, built from the bundles
    for seed, name in enumerate(NAMES):
        fold_bundle(tmp_path / "models" / name, seed, postprocessing=LABELS_POST)
    _, _, server = served
    mapping = {
        "input_mapping": [IOMapping("image", Image, IOType.IN_MEMORY)],
        "output_mapping": [IOMapping("pred", Image, IOType.IN_MEMORY)],
    }
    labels = {
        backend: run(
            EnsembleInferenceOperator(
                Application(), ensemble=Ensemble(NAMES, mirror_axes=(2,)), backend=backend,
                model_path=tmp_path / "models", **mapping,
            ),
            ct_image((32, 32, 32)),
        ).asnumpy()
        for backend in ("torch", server.grpc_url)
    }  # fmt: skip
    assert len(np.unique(labels["torch"])) > 1
    np.testing.assert_array_equal(labels[server.grpc_url], labels["torch"])
