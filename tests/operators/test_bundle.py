"""MONAI Bundles through ``InferenceOperator``, with the App SDK's own ``MonaiBundleInferenceOperator`` as reference.

Each test writes its bundles in the model zoo's layout (``tests/bundles/makers.py``): a 3D UNet with a
gaussian sliding window and ``Invertd`` in all three forms (folder + ``model.ts``, folder + ``network_def`` +
``model.pt``, one ``.ts`` with embedded configs) and a 2D RGB bundle with a ``SimpleInferer``. The App SDK
operator runs the same bundle on the same image; ``torch`` must give exactly its labels and metadata, the
Triton backends (in-process, gRPC, HTTP against a real ``tritonserver`` serving what ``repo build`` made)
identical labels. The same keywords as the App SDK operator, ``IOMapping`` and ``BundleConfigNames`` included.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from monai.deploy.core import AppContext, Application, Image, IOType
from monai.deploy.operators.monai_bundle_inference_operator import (
    BundleConfigNames,
    IOMapping,
    MonaiBundleInferenceOperator,
)

from monai_triton_ops import InferenceOperator
from monai_triton_ops.bundles import read_bundle
from monai_triton_ops.discovery import find_triton_library
from monai_triton_ops.errors import BundleError, MonaiTritonError, ServerNotFoundError
from monai_triton_ops.repository.bundle import build_bundle, cached_repository
from monai_triton_ops.server import LocalTritonServer, find_tritonserver

from ..bundles.classify import CLASSES, classify_bundle, monai_alone, png_images
from ..bundles.makers import ct_image, private_bundle_cache, rgb_bundle, rgb_image, unet_bundle

FORMS = ("ts", "pt", "archive")
MAPPING: dict[str, Any] = {
    "input_mapping": [IOMapping("image", Image, IOType.IN_MEMORY)],
    "output_mapping": [IOMapping("pred", Image, IOType.IN_MEMORY)],
}
#: The name ``repo build`` gives each bundle (its metadata's ``name``).
SERVED = {"unet": "tiny_spleen", "rgb": "tiny_endoscopy"}


class Ports:
    """What Holoscan hands ``compute()``: ``receive(port)`` and ``emit(value, port)``."""

    def __init__(self, inputs: dict[str, Any] | None = None) -> None:
        self.inputs = inputs or {}
        self.emitted: dict[str, Any] = {}

    def receive(self, name: str) -> Any:
        return self.inputs[name]

    def emit(self, value: Any, name: str) -> None:
        self.emitted[name] = value


@pytest.fixture(scope="module")
def fragment() -> Application:
    return Application()


@pytest.fixture(scope="module", autouse=True)
def bundle_cache(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """The in-process backend's cache of Triton models built from bundles, private to this module."""
    with private_bundle_cache(tmp_path_factory) as folder:
        yield folder


@pytest.fixture(scope="module")
def bundles(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("bundles")
    found = {form: unet_bundle(root / f"unet_{form}", form) for form in FORMS}
    found["rgb"] = rgb_bundle(root / "rgb")
    found["classify"] = classify_bundle(root / "classify")
    return found


def image_for(key: str) -> Image:
    return rgb_image() if key == "rgb" else ct_image()


def run_operator(op: Any, image: Image) -> Image:
    ports = Ports({"image": image})
    op.compute(ports, ports, None)
    result = ports.emitted["pred"]
    assert isinstance(result, Image)
    return result


@pytest.fixture(scope="module")
def references(fragment: Application, bundles: dict[str, Path]) -> dict[str, Image]:
    """The App SDK operator's output for each bundle on its image."""
    found = {}
    for key, path in bundles.items():
        if key == "classify":  # its reference is MONAI alone (test_classification_on_every_triton_backend)
            continue
        op = MonaiBundleInferenceOperator(fragment, app_context=AppContext({}), bundle_path=path, **MAPPING)
        found[key] = run_operator(op, image_for(key))
    return found


def ours(fragment: Application, bundle: Path | None, backend: str, image: Image, **keywords: Any) -> Image:
    names = BundleConfigNames(config_names=["inference"])
    op = InferenceOperator(
        fragment, bundle_path=bundle, backend=backend, bundle_config_names=names, **{**MAPPING, **keywords}
    )
    op.start()
    try:
        return run_operator(op, image)
    finally:
        op.stop()


def assert_same(got: Image, want: Image, *, metadata: bool = True) -> None:
    assert got.asnumpy().shape == want.asnumpy().shape
    different = int(np.count_nonzero(got.asnumpy() != want.asnumpy()))
    assert different == 0, f"{different} of {want.asnumpy().size} voxels differ from the App SDK operator's"
    assert len(np.unique(want.asnumpy())) > 1, "the reference is one label only: the comparison would prove nothing"
    if metadata:
        assert sorted(got.metadata()) == sorted(want.metadata())
        np.testing.assert_array_equal(np.asarray(got.metadata()["affine"]), np.asarray(want.metadata()["affine"]))


@pytest.mark.parametrize("key", [*FORMS, "rgb"])
def test_torch_gives_the_app_sdk_operators_labels(
    fragment: Application, bundles: dict[str, Path], references: dict[str, Image], key: str
) -> None:
    image = image_for(key)
    got = ours(fragment, bundles[key], "torch", image)
    assert_same(got, references[key])
    if key != "rgb":  # Invertd took the labels back to the input's grid (the network saw a resampled one)
        assert got.asnumpy().shape == image.asnumpy().shape


def test_the_bundle_is_found_where_the_app_sdk_looks(
    fragment: Application, bundles: dict[str, Path], references: dict[str, Image], tmp_path: Path
) -> None:
    """No ``bundle_path``: the app's ``-m`` is the bundle, or a repository whose NAME folder ``repo build`` made."""
    image = ct_image()
    context = AppContext({"model": str(bundles["archive"])})
    op = InferenceOperator(fragment, app_context=context, backend="torch", **MAPPING)
    op.start()
    try:
        assert_same(run_operator(op, image), references["archive"])
    finally:
        op.stop()
    build_bundle(bundles["pt"], tmp_path / "repo")
    op = InferenceOperator(
        fragment, app_context=AppContext({"model": str(tmp_path / "repo")}), backend="torch", **MAPPING
    )
    assert op.model_name == SERVED["unet"]
    op.start()
    try:
        assert_same(run_operator(op, image), references["pt"])
    finally:
        op.stop()


def test_ports_are_the_mappings_labels(fragment: Application, bundles: dict[str, Path]) -> None:
    """The spleen app wires ``pred``: the labels are the ports, and must be the network's names."""
    op = InferenceOperator(fragment, bundle_path=bundles["ts"], backend="torch", **MAPPING)
    assert (op._bundle.input_ports, op._bundle.output_ports) == (("image",), ("pred",))
    wrong = {**MAPPING, "output_mapping": [IOMapping("seg", Image, IOType.IN_MEMORY)]}
    with pytest.raises(BundleError, match=r"metadata.json.*network_data_format#outputs.*\['seg'\]"):
        InferenceOperator(fragment, bundle_path=bundles["ts"], backend="torch", **wrong)


@pytest.mark.triton
def test_triton_in_process_builds_the_models_itself_and_shares_one_server(
    fragment: Application, bundles: dict[str, Path], references: dict[str, Image], bundle_cache: Path, tmp_path: Path
) -> None:
    """No repository given: each operator builds its Triton model from its bundle into the cache (once per content);
    two bundle operators of one app (the App SDK's multi-AI example has several) run on one in-process server."""
    try:
        find_triton_library()
    except MonaiTritonError as exc:
        pytest.skip(f"no libtritonserver here: {exc}")
    from monai_triton_ops.backends.inprocess import shared

    names = BundleConfigNames(config_names=["inference"])
    ops = {
        key: InferenceOperator(
            fragment, bundle_path=bundles[key], backend="triton", bundle_config_names=names, **MAPPING
        )
        for key in ("archive", "rgb")
    }
    servers = []
    try:
        for op in ops.values():
            op.start()
            servers.append(shared.current())
        assert servers[0] is not None
        assert servers[0] is servers[1]
        for key, op in ops.items():
            assert_same(run_operator(op, image_for(key)), references[key], metadata=False)
        assert_classifies(fragment, bundles["classify"], "triton", tmp_path)  # on the server the others hold open
    finally:
        for op in ops.values():
            op.stop()
    for key in ops:
        name = SERVED["rgb" if key == "rgb" else "unet"]
        built = {p: p.stat().st_mtime_ns for p in bundle_cache.glob(f"bundles/*/{name}-*/config.pbtxt")}
        repository, served = cached_repository(read_bundle(bundles[key]), name)
        entry = repository / served / "config.pbtxt"
        assert entry in built  # the run built it where the cache looks
        assert entry.stat().st_mtime_ns == built[entry]  # and the same content is found, not built again


@pytest.fixture(scope="module")
def server(bundles: dict[str, Path], tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalTritonServer]:
    """One real tritonserver serving what ``repo build`` made of the 3D and the 2D bundle."""
    try:
        find_tritonserver()
    except ServerNotFoundError as exc:
        pytest.skip(f"no tritonserver: {exc}")
    repo = tmp_path_factory.mktemp("served") / "repo"
    build_bundle(bundles["ts"], repo)
    build_bundle(bundles["rgb"], repo)
    build_bundle(bundles["classify"], repo)
    with LocalTritonServer(repo, startup_timeout_s=180.0) as running:
        yield running


@pytest.mark.triton
@pytest.mark.parametrize("scheme", ["grpc", "http"])
@pytest.mark.parametrize("key", ["ts", "rgb"])
def test_remote_server_gives_identical_labels(
    fragment: Application,
    bundles: dict[str, Path],
    references: dict[str, Image],
    server: LocalTritonServer,
    scheme: str,
    key: str,
) -> None:
    """The server holds the network; the client reads pre/post-processing from its local bundle."""
    url = server.grpc_url if scheme == "grpc" else server.http_url
    got = ours(fragment, bundles[key], url, image_for(key))
    assert_same(got, references[key], metadata=False)


def assert_classifies(fragment: Application, bundle: Path, backend: str, folder: Path) -> None:
    """The zoo-shaped classification bundle: the class and scores (within 1e-4) of the bundle run by MONAI alone."""
    from .test_classify import classify

    files = png_images(folder, count=2)
    results = classify(fragment, bundle, files, dict, backend=backend)
    for result, want in zip(results, monai_alone(bundle, files), strict=True):
        assert result["predicted_class"] == CLASSES[int(np.argmax(want))]
        np.testing.assert_allclose(np.array(list(result["probabilities"].values())), want, rtol=0, atol=1e-4)


@pytest.mark.triton
@pytest.mark.parametrize("scheme", ["grpc", "http"])
def test_classification_on_a_remote_server(
    fragment: Application, bundles: dict[str, Path], server: LocalTritonServer, tmp_path: Path, scheme: str
) -> None:
    url = server.grpc_url if scheme == "grpc" else server.http_url
    assert_classifies(fragment, bundles["classify"], url, tmp_path)


def test_the_bundle_it_cannot_find_is_named_with_where_it_looked(
    fragment: Application, bundles: dict[str, Path], tmp_path: Path
) -> None:
    (tmp_path / "empty").mkdir()
    with pytest.raises(BundleError, match=r"is neither a bundle nor a Triton repository"):
        InferenceOperator(fragment, app_context=AppContext({"model": str(tmp_path / "empty")}), **MAPPING)
    repo = tmp_path / "repo"
    build_bundle(bundles["ts"], repo)
    build_bundle(bundles["rgb"], repo)
    with pytest.raises(BundleError, match=r"exactly one model folder.*pass bundle_path= or model_name="):
        InferenceOperator(fragment, app_context=AppContext({"model": str(repo)}), backend="torch", **MAPPING)
    op = InferenceOperator(
        fragment, app_context=AppContext({"model": str(repo)}), model_name=SERVED["rgb"], backend="torch", **MAPPING
    )
    assert op.bundle is not None
    assert op.bundle.path == repo / SERVED["rgb"]


def test_a_numpy_frame_in_gives_the_app_sdk_operators_labels(
    fragment: Application, bundles: dict[str, Path], references: dict[str, Image]
) -> None:
    """The App SDK operator takes a bare channel-last array too (a video frame): so does ours."""
    frame = rgb_image().asnumpy()
    sdk = MonaiBundleInferenceOperator(fragment, app_context=AppContext({}), bundle_path=bundles["rgb"], **MAPPING)
    ports = Ports({"image": frame})
    sdk.compute(ports, ports, None)
    want = ports.emitted["pred"]
    ours = InferenceOperator(fragment, bundle_path=bundles["rgb"], backend="torch", **MAPPING)
    ours.start()
    try:
        ours.compute(ports, ports, None)
    finally:
        ours.stop()
    assert_same(ports.emitted["pred"], want)


def test_a_maps_models_folder_holding_the_bundle(
    fragment: Application, bundles: dict[str, Path], references: dict[str, Image], tmp_path: Path
) -> None:
    """``/opt/holoscan/models/NAME/``: the bundle folder's files (``package -m BUNDLE``) or its one ``.ts``."""
    import shutil

    shutil.copytree(bundles["pt"], tmp_path / "folder" / "spleen")
    (tmp_path / "file" / "spleen").mkdir(parents=True)
    shutil.copyfile(bundles["archive"], tmp_path / "file" / "spleen" / "model.ts")
    for models, key in ((tmp_path / "folder", "pt"), (tmp_path / "file", "archive")):
        op = InferenceOperator(fragment, app_context=AppContext({"model": str(models)}), backend="torch", **MAPPING)
        op.start()
        try:
            assert_same(run_operator(op, ct_image()), references[key])
        finally:
            op.stop()
