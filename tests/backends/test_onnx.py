"""ONNX models: the ``onnx`` backend's own behaviour, and one ONNX entry served on every backend that runs it.

The contract (batch split, requests in flight, deadlines, close) is ``test_contract.py``'s, which runs against
``onnx`` too. Here: the same labels as TorchScript on ``torch`` from ``onnx``, in-process ``triton`` and a real
local tritonserver over gRPC and HTTP (the runner serves the ONNX file through ONNX Runtime); what ``repo
build`` writes for Triton's own ONNX Runtime backend; session options; and bad input, each a clear error.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import numpy as np
import onnx
import pytest
import torch
from onnx import TensorProto, helper

from monai_triton_ops import create_backend
from monai_triton_ops.errors import (
    ConfigError,
    DeviceUnavailableError,
    InputValidationError,
    ModelLoadError,
    RepositoryError,
)
from monai_triton_ops.repository.builder import ONNXRUNTIME_CONFIG, build_repository
from monai_triton_ops.repository.check import check_entry
from monai_triton_ops.repository.config import read_config, signature_from_config
from monai_triton_ops.repository.onnx_model import read_onnx

from ..conftest import UNET_META, save_model, tiny_unet
from ..onnx_models import save_onnx

SIZE = 32  # the test volume: 32^3, one channel
#: What an export gives here: max abs difference of logits between ONNX Runtime and TorchScript (~1.5e-6 seen).
TOLERANCE = 1e-4


@pytest.fixture(scope="module")
def repos(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path, Path]:
    """``(torch repo, onnx repo, scratch)``: the tiny UNet as TorchScript and as ONNX (dynamic batch and spatial)."""
    root = tmp_path_factory.mktemp("onnx")
    net = tiny_unet().eval()
    torch_repo = root / "torch"
    build_repository(save_model(net, root / "unet.pt", UNET_META), torch_repo, "unet")
    dynamic = {"x": [0, 2, 3, 4], "OUTPUT__0": [0, 2, 3, 4]}
    names = {"input_names": ["x"], "output_names": ["OUTPUT__0"]}
    model = save_onnx(
        net, root / "unet.onnx", [torch.zeros(1, 1, 16, 16, 16)], dynamic=dynamic, meta=UNET_META, **names
    )
    onnx_repo = root / "onnx"
    build_repository(model, onnx_repo, "unet")
    fixed = save_onnx(net, root / "fixed.onnx", [torch.zeros(1, 1, 16, 16, 16)], **names)
    build_repository(fixed, onnx_repo, "fixed")
    return torch_repo, onnx_repo, root


@pytest.fixture(scope="module")
def image() -> np.ndarray:
    return np.random.default_rng(0).standard_normal((1, 1, SIZE, SIZE, SIZE)).astype(np.float32)


@pytest.fixture(scope="module")
def reference(repos: tuple[Path, Path, Path], image: np.ndarray) -> np.ndarray:
    with create_backend("torch", "unet", model_repository=repos[0]) as backend:
        return np.asarray(backend.infer({"x": image})["OUTPUT__0"])


@pytest.fixture(scope="module")
def server(repos: tuple[Path, Path, Path]) -> Iterator[object]:
    from monai_triton_ops.errors import ServerNotFoundError
    from monai_triton_ops.server import LocalTritonServer, find_tritonserver

    from ..server.conftest import stop_and_check

    try:
        find_tritonserver()
    except ServerNotFoundError as exc:
        pytest.skip(f"no tritonserver: {exc}")
    server = LocalTritonServer(repos[1], startup_timeout_s=300.0, stop_timeout_s=10.0)
    server.start()
    yield server
    stop_and_check(server)


def _same_labels(logits: np.ndarray, reference: np.ndarray) -> None:
    assert np.abs(logits - reference).max() <= TOLERANCE
    np.testing.assert_array_equal(logits.argmax(axis=1), reference.argmax(axis=1))


def test_onnx_gives_the_torchscript_labels_with_the_graphs_signature(
    repos: tuple[Path, Path, Path], image: np.ndarray, reference: np.ndarray
) -> None:
    with create_backend("onnx?intra_op_threads=1&graph_optimization=all", "unet", model_repository=repos[1]) as b:
        assert [t.name for t in b.signature.inputs] == ["x"]
        assert b.signature.inputs[0].shape == (-1, 1, -1, -1, -1)
        assert b.signature.metadata == UNET_META
        _same_labels(np.asarray(b.infer({"x": image})["OUTPUT__0"]), reference)


@pytest.mark.triton
def test_triton_in_process_serves_onnx_through_the_runner(
    repos: tuple[Path, Path, Path], image: np.ndarray, reference: np.ndarray
) -> None:
    from monai_triton_ops.discovery import find_triton_library
    from monai_triton_ops.errors import ServerNotFoundError

    try:
        find_triton_library()
    except ServerNotFoundError as exc:
        pytest.skip(f"no libtritonserver: {exc}")
    with create_backend("triton", "unet", model_repository=repos[1]) as backend:
        _same_labels(np.asarray(backend.infer({"x": image})["OUTPUT__0"]), reference)


@pytest.mark.triton
@pytest.mark.parametrize("scheme", ["grpc", "http"])
def test_a_remote_tritonserver_serves_onnx(
    server: object, scheme: str, image: np.ndarray, reference: np.ndarray
) -> None:
    url = getattr(server, f"{scheme}_url")
    with create_backend(url, "unet") as backend:
        assert backend.signature.metadata == UNET_META
        _same_labels(np.asarray(backend.infer({"x": image})["OUTPUT__0"]), reference)


def test_repo_build_writes_the_onnxruntime_config_beside_the_runner(repos: tuple[Path, Path, Path]) -> None:
    folder = repos[1] / "unet"
    runner = read_config(folder / "config.pbtxt", name="unet")
    assert runner.backend == "python"
    assert runner.parameters["torchscript_filename"].string_value == "model.onnx"
    ort = read_config(folder / ONNXRUNTIME_CONFIG, name="unet")
    assert ort.platform == "onnxruntime_onnx"
    assert ort.default_model_filename == "model.onnx"
    assert [list(t.dims) for t in (*ort.input, *ort.output)] == [[-1, 1, -1, -1, -1], [-1, 3, -1, -1, -1]]
    assert signature_from_config(ort) == signature_from_config(runner)
    assert (folder / "1" / "model.onnx").is_file()
    assert (folder / "1" / "model.py").is_file()
    report = check_entry(repos[1], "unet")
    assert report.kind == "onnx"
    assert not report.problems
    assert "the onnx backend" in report.uses


def test_batching_comes_from_the_graph(repos: tuple[Path, Path, Path], tmp_path: Path) -> None:
    model = read_onnx(repos[2] / "unet.onnx")
    assert model.batches
    assert model.signature("unet", max_batch_size=4).inputs[0].shape == (1, -1, -1, -1)
    build_repository(repos[2] / "unet.onnx", tmp_path, "unet", max_batch_size=4)
    assert read_config(tmp_path / "unet" / ONNXRUNTIME_CONFIG, name="unet").max_batch_size == 4
    with pytest.raises(ConfigError, match=r"model 'fixed'.*dynamic leading.*'x'.*\[1, 1, 16, 16, 16\]"):
        build_repository(repos[2] / "fixed.onnx", tmp_path, "fixed", max_batch_size=4)
    assert not (tmp_path / "fixed").exists()


def test_a_fixed_dim_the_image_does_not_fit_names_model_tensor_expected_actual(
    repos: tuple[Path, Path, Path], image: np.ndarray
) -> None:
    with create_backend("onnx", "fixed", model_repository=repos[1]) as backend:
        assert backend.signature.inputs[0].shape == (1, 1, 16, 16, 16)
        with pytest.raises(InputValidationError, match=r"'fixed'.*'x'.*16.*32"):
            backend.infer({"x": image})


def test_a_file_that_is_not_onnx_is_refused_and_nothing_is_written(tmp_path: Path) -> None:
    bad = tmp_path / "model.onnx"
    bad.write_bytes(b"not a protobuf \x00\xff" * 8)
    with pytest.raises(ModelLoadError, match=r"model 'bad'.*model\.onnx.*is not an ONNX model"):
        build_repository(bad, tmp_path / "repo", "bad")
    assert not (tmp_path / "repo").exists()
    (tmp_path / "manual" / "bad" / "1").mkdir(parents=True)
    (tmp_path / "manual" / "bad" / "1" / "model.onnx").write_bytes(bad.read_bytes())
    with pytest.raises(ModelLoadError, match=r"model 'bad'.*is not an ONNX model"):
        create_backend("onnx", "bad", model_repository=tmp_path / "manual").open()


def test_an_opset_onnx_runtime_lacks_is_a_clear_error(tmp_path: Path) -> None:
    node = helper.make_node("Relu", ["x"], ["y"])
    graph = helper.make_graph(
        [node], "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 4])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 4])],
    )  # fmt: skip
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 99)])
    (tmp_path / "future" / "1").mkdir(parents=True)
    onnx.save(model, str(tmp_path / "future" / "1" / "model.onnx"))
    with pytest.raises(ModelLoadError, match=r"model 'future'.*opset 99.*ONNX Runtime 1\.\d+"):
        create_backend("onnx", "future", model_repository=tmp_path).open()


def test_a_config_the_graph_contradicts_is_refused(repos: tuple[Path, Path, Path], tmp_path: Path) -> None:
    repo = tmp_path / "repo"
    build_repository(repos[2] / "fixed.onnx", repo, "fixed")
    config = repo / "fixed" / "config.pbtxt"
    config.write_text(config.read_text().replace("dims: [1, 1, 16, 16, 16]", "dims: [1, 1, 16, 16, 8]", 1))
    with pytest.raises(ConfigError, match=r"model 'fixed' tensor 'x': dim 4: the graph fixes 16.*says 8"):
        create_backend("onnx", "fixed", model_repository=repo).open()
    assert check_entry(repo, "fixed").problems


def test_a_torchscript_entry_points_the_way_to_the_torch_backend(repos: tuple[Path, Path, Path]) -> None:
    with pytest.raises(ConfigError, match=r"model 'unet'.*'model\.pt'.*not an ONNX file.*'torch'"):
        create_backend("onnx", "unet", model_repository=repos[0]).open()


@pytest.mark.parametrize(
    ("spec", "error", "match"),
    [
        (
            "onnx?providers=CPUExecutionProvider,CUDAExecutionProvider",
            ConfigError,
            r"CPUExecutionProvider must come last",
        ),
        ("onnx?providers=NoSuchExecutionProvider", DeviceUnavailableError, r"\['NoSuchExecutionProvider'\].*available"),
        ("onnx?graph_optimization=max", ConfigError, r"graph_optimization"),
        ("onnx?intra_op_threads=-1", ConfigError, r"intra_op_threads"),
    ],
)
def test_session_options_are_checked(repos: tuple[Path, Path, Path], spec: str, error: type, match: str) -> None:
    with pytest.raises(error, match=match):
        create_backend(spec, "unet", model_repository=repos[1]).open()


def test_providers_end_with_the_cpu_one(repos: tuple[Path, Path, Path]) -> None:
    backend = create_backend("onnx?providers=AzureExecutionProvider", "unet", model_repository=repos[1])
    assert backend.options.providers == ("AzureExecutionProvider", "CPUExecutionProvider")  # type: ignore[attr-defined]


def test_onnx_tensors_keep_their_graph_names(repos: tuple[Path, Path, Path], tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=r"keep the names of its graph"):
        build_repository(repos[2] / "unet.onnx", tmp_path, "unet", input_names=["image"])
    with pytest.raises(ConfigError, match=r"ONNX, which the libtorch backend cannot serve"):
        build_repository(repos[2] / "unet.onnx", tmp_path, "unet", flavor="libtorch")
    with pytest.raises(RepositoryError, match=r"already exists"):
        build_repository(repos[2] / "unet.onnx", repos[1], "unet")


@pytest.mark.slow
def test_the_sample_model_exported_to_onnx_gives_its_labels(tmp_path: Path) -> None:
    """The committed model through ``apps/brain_tissue_seg/export_onnx.py``: the demo's and benchmark's export."""
    import importlib.util

    root = Path(__file__).resolve().parents[2]
    spec = importlib.util.spec_from_file_location("export_onnx", root / "apps" / "brain_tissue_seg" / "export_onnx.py")
    assert spec is not None
    assert spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    build_repository(module.export_onnx(tmp_path / "model.onnx"), tmp_path / "repo", "brain_tissue_seg")
    x = np.random.default_rng(0).standard_normal((1, 1, SIZE, SIZE, SIZE)).astype(np.float32)
    with create_backend("torch", "brain_tissue_seg", model_repository=root / "model_repository") as backend:
        reference = np.asarray(backend.infer({"x": x})["OUTPUT__0"])
    with create_backend("onnx", "brain_tissue_seg", model_repository=tmp_path / "repo") as backend:
        assert backend.signature.metadata["network_data_format"]["outputs"]["pred"]["num_channels"] == 3
        _same_labels(np.asarray(backend.infer({"x": x})["OUTPUT__0"]), reference)
