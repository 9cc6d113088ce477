"""The exact graph rewrites of ``repository/onnx_rewrite.py``: PReLU with one slope -> LeakyRelu, nothing else.

A real export (Conv3d, a one-slope PReLU, Conv3d, a per-channel PReLU) run by ONNX Runtime before and after;
hand-built graphs for the slopes that must be left alone; the ``onnx`` backend rewriting an in-memory copy
(the file unchanged) and ``repo build`` writing the rewritten copy into the entry.
"""

from __future__ import annotations

import logging
from pathlib import Path

import numpy as np
import onnx
import onnxruntime
import pytest
import torch
from onnx import TensorProto, helper, numpy_helper

from monai_triton_ops import create_backend
from monai_triton_ops.repository.builder import build_repository
from monai_triton_ops.repository.onnx_rewrite import rewrite_file, rewrite_graph, rewritten_bytes

from ..onnx_models import save_onnx

#: The rewrite must keep ONNX Runtime's outputs within this (it is exact: 0.0 is what it gives).
TOLERANCE = 1e-5


class ConvPrelu(torch.nn.Module):
    """Conv3d -> PReLU (one slope, as MONAI's ``Act.PRELU``) -> Conv3d -> PReLU (one slope per channel)."""

    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.conv1 = torch.nn.Conv3d(1, 4, 3, padding=1)
        self.act1 = torch.nn.PReLU(init=0.3)
        self.conv2 = torch.nn.Conv3d(4, 2, 3, padding=1)
        self.act2 = torch.nn.PReLU(num_parameters=2)
        with torch.no_grad():
            self.act2.weight.copy_(torch.tensor([0.1, 0.7]))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.act2(self.conv2(self.act1(self.conv1(x))))


def _ops(model: onnx.ModelProto) -> list[str]:
    return [node.op_type for node in model.graph.node]


def _run(model: onnx.ModelProto | bytes | str, x: np.ndarray) -> np.ndarray:
    data = model.SerializeToString() if isinstance(model, onnx.ModelProto) else model
    session = onnxruntime.InferenceSession(data, providers=["CPUExecutionProvider"])
    return np.asarray(session.run(None, {"x": x})[0])


@pytest.fixture(scope="module")
def exported(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("rewrite") / "conv_prelu.onnx"
    axes = {"x": [0, 2, 3, 4], "y": [0, 2, 3, 4]}
    return save_onnx(ConvPrelu().eval(), path, [torch.zeros(1, 1, 8, 8, 8)], input_names=["x"],
                     output_names=["y"], dynamic=axes)  # fmt: skip


@pytest.fixture(scope="module")
def x() -> np.ndarray:
    return np.random.default_rng(0).standard_normal((2, 1, 16, 16, 16)).astype(np.float32)


def test_a_one_slope_prelu_becomes_leaky_relu_with_the_same_outputs(exported: Path, x: np.ndarray) -> None:
    model = onnx.load(str(exported))
    assert _ops(model).count("PRelu") == 2
    assert rewrite_graph(model) == 1
    assert _ops(model).count("PRelu") == 1  # the per-channel one is left alone
    leaky = next(node for node in model.graph.node if node.op_type == "LeakyRelu")
    assert helper.get_attribute_value(leaky.attribute[0]) == pytest.approx(0.3)
    onnx.checker.check_model(model)
    before, after = _run(onnx.load(str(exported)), x), _run(model, x)
    with torch.inference_mode():
        reference = ConvPrelu().eval()(torch.from_numpy(x)).numpy()
    assert np.abs(after - before).max() <= TOLERANCE
    assert np.abs(after - reference).max() <= 1e-4
    # The comparison can fail: the same graph with a wrong alpha (Relu's 0) is far off, since the first PReLU
    # sees negative values.
    leaky.attribute[0].f = 0.0
    assert np.abs(_run(model, x) - before).max() > 1e-2


def _graph(slope: onnx.TensorProto | None, *, slope_input: bool = False, constant: bool = False) -> onnx.ModelProto:
    """``y = PRelu(x, s)``: ``s`` an initializer, an initializer listed as a graph input, or a ``Constant``."""
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 2, 4])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 2, 4])
    nodes = [helper.make_node("PRelu", ["x", "s"], ["y"])]
    inputs, initializers = [x], []
    if constant:
        nodes.insert(0, helper.make_node("Constant", [], ["s"], value=slope))
    elif slope is not None:
        initializers.append(slope)
    if slope_input or slope is None:
        inputs.append(helper.make_tensor_value_info("s", TensorProto.FLOAT, [1]))
    graph = helper.make_graph(nodes, "g", inputs, [y], initializer=initializers)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)


@pytest.mark.parametrize(
    ("model", "rewritten"),
    [
        (_graph(numpy_helper.from_array(np.array([0.25], np.float32), "s")), 1),
        (_graph(numpy_helper.from_array(np.array([[[0.25]]], np.float32), "s"), constant=True), 1),
        (_graph(numpy_helper.from_array(np.array([[0.1], [0.2]], np.float32), "s")), 0),  # per channel
        (_graph(None), 0),  # fed at run time
        (_graph(numpy_helper.from_array(np.array([0.25], np.float32), "s"), slope_input=True), 0),  # overridable
        (_graph(numpy_helper.from_array(np.array([0.1], np.float64), "s")), 0),  # float32 cannot hold 0.1 (double)
    ],
    ids=["initializer", "constant", "per-channel", "graph-input", "overridable-initializer", "inexact-double"],
)
def test_only_a_constant_single_float32_slope_is_rewritten(model: onnx.ModelProto, rewritten: int) -> None:
    copy = onnx.ModelProto()
    copy.CopyFrom(model)
    assert rewrite_graph(copy) == rewritten
    assert _ops(copy)[-1] == ("LeakyRelu" if rewritten else "PRelu")
    if rewritten:
        assert not copy.graph.initializer  # the slope no node reads any more is gone
        onnx.checker.check_model(copy)
        x = np.linspace(-2, 2, 8, dtype=np.float32).reshape(1, 2, 4)
        np.testing.assert_array_equal(_run(copy, x), np.where(x >= 0, x, np.float32(0.25) * x))


def test_files_rewrite_to_a_copy_and_in_place(exported: Path, tmp_path: Path, x: np.ndarray) -> None:
    original = exported.read_bytes()
    assert rewrite_file(exported, tmp_path / "copy.onnx") == 1
    assert exported.read_bytes() == original
    assert "LeakyRelu" in _ops(onnx.load(str(tmp_path / "copy.onnx")))
    assert rewritten_bytes(tmp_path / "copy.onnx") is None  # nothing left to rewrite
    assert rewrite_file(tmp_path / "copy.onnx", tmp_path / "again.onnx") == 0
    assert (tmp_path / "again.onnx").read_bytes() == (tmp_path / "copy.onnx").read_bytes()


def test_the_onnx_backend_rewrites_a_copy_and_repo_build_the_entry(
    exported: Path, tmp_path: Path, x: np.ndarray, caplog: pytest.LogCaptureFixture
) -> None:
    original = exported.read_bytes()
    repo = tmp_path / "repo"
    (repo / "plain" / "1").mkdir(parents=True)
    (repo / "plain" / "1" / "model.onnx").write_bytes(original)  # laid out by hand: not rewritten
    outputs = {}
    for flag in ("true", "false"):
        caplog.clear()
        with caplog.at_level(logging.DEBUG, logger="monai_triton_ops.repository.onnx_rewrite"):
            with create_backend(f"onnx?rewrite_graph={flag}", "plain", model_repository=repo) as backend:
                outputs[flag] = np.asarray(backend.infer({"x": x})["y"])
        assert ("run as LeakyRelu" in caplog.text) == (flag == "true")
    assert (repo / "plain" / "1" / "model.onnx").read_bytes() == original
    assert np.abs(outputs["true"] - outputs["false"]).max() <= TOLERANCE
    build_repository(exported, repo, "built")
    assert _ops(onnx.load(str(repo / "built" / "1" / "model.onnx"))).count("LeakyRelu") == 1
    assert exported.read_bytes() == original


def test_a_model_with_external_weights_is_loaded_from_its_path_as_it_is(exported: Path, tmp_path: Path) -> None:
    version = tmp_path / "repo" / "external" / "1"
    version.mkdir(parents=True)
    onnx.save(onnx.load(str(exported)), str(version / "model.onnx"), save_as_external_data=True,
              location="weights.bin", size_threshold=0)  # fmt: skip
    assert rewritten_bytes(version / "model.onnx") is None  # ONNX Runtime finds weights.bin beside the path
    x = np.ones((1, 1, 8, 8, 8), np.float32)
    with create_backend("onnx", "external", model_repository=tmp_path / "repo") as backend:
        np.testing.assert_allclose(backend.infer({"x": x})["y"], _run(str(exported), x), atol=TOLERANCE)
