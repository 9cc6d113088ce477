"""Bundles beyond segmentation through ``InferenceOperator`` on every backend, with MONAI alone as the reference.

Two bundles in the model zoo's layout, each run by ``monai.bundle.ConfigWorkflow`` alone on the same NIfTI file:

- ``heads`` (``tests/bundles/heads.py``): a bundle-local network returning a dict of two heads, stitched by MONAI's
  ``SlidingWindowInferer``, flattened by the post-processing (``FlattenSubKeysd``), two image outputs;
- ``detect`` (``apps/bundle_detect/make_bundle.py``): a RetinaNet with a bundle-local ResNet + FPN, a
  ``RetinaNetDetector`` set up by ``detector_ops``, a bundle-local inferer, the zoo's box post-processing.

``torch`` must give MONAI alone's outputs exactly; ``triton`` (in-process), ``grpc://`` and ``http://`` (a real
``tritonserver`` serving what ``repo build`` made) the same labels, the same boxes (IoU >= 0.99 after matching,
same count) and scores within 1e-4.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from monai.data.box_utils import box_iou, convert_box_mode
from monai.deploy.core import Application, Image, IOType
from monai.deploy.operators.monai_bundle_inference_operator import IOMapping

from monai_triton_ops import InferenceOperator
from monai_triton_ops.discovery import find_triton_library
from monai_triton_ops.errors import MonaiTritonError, ServerNotFoundError
from monai_triton_ops.operators.nifti import read_nifti
from monai_triton_ops.repository.bundle import build_bundle, check_bundle, describe_bundle
from monai_triton_ops.server import LocalTritonServer, find_tritonserver

from ..bundles.heads import detection_maker, heads_bundle, run_with_monai, volume
from ..bundles.makers import private_bundle_cache

KEYS = ("heads", "detect")
OUTPUTS: dict[str, list[Any]] = {
    "heads": [IOMapping("seg", np.ndarray, IOType.IN_MEMORY), IOMapping("dist", np.ndarray, IOType.IN_MEMORY)],
    "detect": [IOMapping("pred", dict, IOType.IN_MEMORY)],
}


class Ports:
    """What Holoscan hands ``compute()``: ``receive(port)`` and ``emit(value, port)``."""

    def __init__(self, inputs: dict[str, Any]) -> None:
        self.inputs = inputs
        self.emitted: dict[str, Any] = {}

    def receive(self, name: str) -> Any:
        return self.inputs[name]

    def emit(self, value: Any, name: str) -> None:
        self.emitted[name] = value


@pytest.fixture(scope="module", autouse=True)
def bundle_cache(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    with private_bundle_cache(tmp_path_factory) as folder:
        yield folder


@pytest.fixture(scope="module")
def made(tmp_path_factory: pytest.TempPathFactory) -> dict[str, tuple[Path, Path, dict[str, Any]]]:
    """Each bundle, its input file, and MONAI alone's result on it."""
    root = tmp_path_factory.mktemp("kinds")
    maker = detection_maker()
    found = {
        "heads": (heads_bundle(root / "heads"), volume(root / "heads.nii.gz")),
        "detect": (maker.make_bundle(root), maker.write_volume(root / "ct.nii.gz")),
    }
    return {key: (bundle, path, run_with_monai(bundle, path)) for key, (bundle, path) in found.items()}


@pytest.fixture(scope="module")
def fragment() -> Application:
    return Application()


def ours(fragment: Application, key: str, bundle: Path, backend: str, path: Path) -> dict[str, Any]:
    op = InferenceOperator(
        fragment,
        bundle_path=bundle,
        backend=backend,
        input_mapping=[IOMapping("image", Image, IOType.IN_MEMORY)],
        output_mapping=OUTPUTS[key],
    )
    op.start()
    try:
        ports = Ports({"image": read_nifti(path)})
        op.compute(ports, ports, None)
    finally:
        op.stop()
    return ports.emitted


def assert_same(key: str, got: dict[str, Any], want: dict[str, Any], *, exact: bool) -> None:
    if key == "heads":
        seg, labels = np.asarray(got["seg"]), np.asarray(want["seg"])
        assert seg.shape == labels.shape
        assert len(np.unique(labels)) > 1, "MONAI alone gave one label: the comparison would prove nothing"
        assert int(np.count_nonzero(seg != labels)) == 0
        compare = np.testing.assert_array_equal if exact else _close
        compare(np.asarray(got["dist"]), np.asarray(want["dist"]))
        return
    boxes, scores, labels = (np.asarray(got["pred"][k]) for k in ("box", "label_scores", "label"))
    want_boxes, want_scores, want_labels = (np.asarray(want[k]) for k in ("box", "label_scores", "label"))
    assert len(want_boxes) > 0, "MONAI alone found no boxes: the comparison would prove nothing"
    if exact:
        for a, b in ((boxes, want_boxes), (scores, want_scores), (labels, want_labels)):
            np.testing.assert_array_equal(a, b)
        return
    assert len(boxes) == len(want_boxes)
    iou = box_iou(
        convert_box_mode(torch.as_tensor(boxes), src_mode="cccwhd"),
        convert_box_mode(torch.as_tensor(want_boxes), src_mode="cccwhd"),
    ).numpy()
    match = iou.argmax(axis=1)
    assert sorted(match.tolist()) == list(range(len(want_boxes))), "two boxes matched one of MONAI's"
    assert iou[np.arange(len(boxes)), match].min() >= 0.99
    np.testing.assert_allclose(scores, want_scores[match], atol=1e-4, rtol=0)
    np.testing.assert_array_equal(labels, want_labels[match])


def _close(a: np.ndarray, b: np.ndarray) -> None:
    np.testing.assert_allclose(a, b, atol=1e-5, rtol=0)


@pytest.mark.parametrize("key", KEYS)
def test_torch_gives_monai_alones_outputs_exactly(fragment: Application, made: dict, key: str) -> None:
    bundle, path, reference = made[key]
    assert_same(key, ours(fragment, key, bundle, "torch", path), reference, exact=True)


def test_a_detection_follows_the_networks_weights(fragment: Application, made: dict, tmp_path: Path) -> None:
    """The boxes come from the network that ran: other weights, other boxes (and the first run found some)."""
    bundle, path, _ = made["detect"]
    other = detection_maker().make_bundle(tmp_path, seed=1)
    first = ours(fragment, "detect", bundle, "torch", path)["pred"]
    second = ours(fragment, "detect", other, "torch", path)["pred"]
    assert len(first["box"]) > 0
    same = np.shape(first["box"]) == np.shape(second["box"]) and np.allclose(first["box"], second["box"])
    assert not same


def test_repo_describe_lists_every_head_with_dynamic_dims(made: dict, caplog: pytest.LogCaptureFixture) -> None:
    """RetinaNet's dict of lists: one Triton output per head and feature level, spatial dims dynamic; the input
    dtype the network takes on the CPU (float32), not the metadata's float16, and the log says so."""
    with caplog.at_level("INFO"):
        signature = describe_bundle(made["detect"][0]).signature
    names = [f"{head}_{level}" for head in ("classification", "box_regression") for level in range(3)]
    assert list(signature.output_names) == names
    assert [o.shape for o in signature.outputs] == [(-1, 3, -1, -1, -1)] * 3 + [(-1, 18, -1, -1, -1)] * 3
    assert signature.inputs[0].dtype == "FP32"
    assert "declares input 'image' as float16; the network takes torch.float32" in caplog.text
    assert check_bundle(made["detect"][0]).problems == ()  # repo check: built and run as a run builds it
    heads = describe_bundle(made["heads"][0]).signature
    assert list(heads.output_names) == ["seg", "dist"]
    assert [o.shape for o in heads.outputs] == [(-1, 3, -1, -1, -1), (-1, 1, -1, -1, -1)]


@pytest.mark.triton
def test_triton_in_process_gives_the_same_results(fragment: Application, made: dict) -> None:
    try:
        find_triton_library()
    except MonaiTritonError as exc:
        pytest.skip(f"no libtritonserver here: {exc}")
    for key in KEYS:
        bundle, path, reference = made[key]
        assert_same(key, ours(fragment, key, bundle, "triton", path), reference, exact=False)


@pytest.fixture(scope="module")
def server(made: dict, tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalTritonServer]:
    """One real tritonserver serving what ``repo build`` made of both bundles."""
    try:
        find_tritonserver()
    except ServerNotFoundError as exc:
        pytest.skip(f"no tritonserver: {exc}")
    repo = tmp_path_factory.mktemp("served") / "repo"
    for key in KEYS:
        build_bundle(made[key][0], repo)
    with LocalTritonServer(repo, startup_timeout_s=180.0) as running:
        yield running


@pytest.mark.triton
@pytest.mark.parametrize("scheme", ["grpc", "http"])
def test_a_remote_server_gives_the_same_results(
    fragment: Application, made: dict, server: LocalTritonServer, scheme: str
) -> None:
    url = server.grpc_url if scheme == "grpc" else server.http_url
    for key in KEYS:
        bundle, path, reference = made[key]
        assert_same(key, ours(fragment, key, bundle, url, path), reference, exact=False)
