"""The instance norm rewrite of ``repository/onnx_norm.py``: statistics in float64, as close to float64 as torch.

A real export (two ``InstanceNorm3d``, one affine) run by ONNX Runtime before and after, against the same
network in float64; hand-built graphs for the opset 18 form, a constant channel, and the nodes left alone.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import onnxruntime
import pytest
import torch
from onnx import helper, numpy_helper

from monai_triton_ops import create_backend
from monai_triton_ops.repository.builder import build_repository
from monai_triton_ops.repository.onnx_rewrite import rewrite_file, rewrite_graph

from ..onnx_models import save_onnx

#: One instance norm's output, rewritten, may be this far from float64 (float32 rounding of values up to ~10).
TOLERANCE = 1e-6


class TwoNorms(torch.nn.Module):
    """InstanceNorm3d (no affine, MONAI's default) -> x * 3 + 40 -> InstanceNorm3d (affine, random weights)."""

    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.plain = torch.nn.InstanceNorm3d(4)
        self.affine = torch.nn.InstanceNorm3d(4, affine=True)
        with torch.no_grad():
            self.affine.weight.uniform_(0.5, 2.0)
            self.affine.bias.uniform_(-1.0, 1.0)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.affine(self.plain(x) * 3 + 40)


def _run(model: onnx.ModelProto, x: np.ndarray) -> np.ndarray:
    session = onnxruntime.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    return np.asarray(session.run(None, {"x": x})[0])


def _ops(model: onnx.ModelProto) -> list[str]:
    return [node.op_type for node in model.graph.node]


@pytest.fixture(scope="module")
def exported(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("norm") / "two_norms.onnx"
    axes = {"x": [0, 2, 3, 4], "y": [0, 2, 3, 4]}
    return save_onnx(TwoNorms().eval(), path, [torch.zeros(1, 4, 8, 8, 8)], input_names=["x"],
                     output_names=["y"], dynamic=axes)  # fmt: skip


def test_instance_norms_take_float64_statistics_and_land_within_float32_rounding(exported: Path) -> None:
    x = (np.random.default_rng(0).standard_normal((2, 4, 32, 32, 32)) * 3 + 50).astype(np.float32)
    with torch.inference_mode():
        exact = TwoNorms().eval().double()(torch.from_numpy(x).double()).numpy()
        ours = np.abs(TwoNorms().eval()(torch.from_numpy(x)).numpy() - exact).max()  # torch, float32
    plain = onnx.load(str(exported))
    model = onnx.load(str(exported))
    assert _ops(model).count("InstanceNormalization") == 2
    assert rewrite_graph(model, norm_in_float64=False) == 0  # ONNX Runtime's own norms kept when asked
    assert rewrite_graph(model) == 2  # the default: torch's statistics
    assert "InstanceNormalization" not in _ops(model)
    # The first norm's scale and bias (Constant nodes) and the second's (initializers) are folded into copies.
    assert _ops(model).count("Constant") == _ops(plain).count("Constant") - 2
    assert not {"affine.weight", "affine.bias"} & {t.name for t in model.graph.initializer}
    onnx.checker.check_model(model, full_check=True)
    before, after = np.abs(_run(plain, x) - exact).max(), np.abs(_run(model, x) - exact).max()
    assert after <= 2 * ours, f"rewritten: {after:.2g} from float64, torch {ours:.2g}, plain export {before:.2g}"
    assert after < before / 3  # ONNX Runtime's float32 sums are measurably worse on this input (~1e-5 off)
    assert rewrite_graph(model, norm_in_float64=True) == 0  # nothing left to rewrite


def _norm_graph(
    scale: np.ndarray, bias: np.ndarray, *, opset: int = 17, scale_input: bool = False, epsilon: float = 1e-5
) -> onnx.ModelProto:
    """``y = InstanceNormalization(x, s, b)`` on ``x`` of shape ``(N, C, H, W)``; ``s`` an initializer (listed as
    a graph input too with ``scale_input``), ``b`` a ``Constant`` node."""
    elem = helper.np_dtype_to_tensor_dtype(scale.dtype)
    x = helper.make_tensor_value_info("x", elem, ["n", scale.size, "h", "w"])
    y = helper.make_tensor_value_info("y", elem, ["n", scale.size, "h", "w"])
    nodes = [
        helper.make_node("Constant", [], ["b"], value=numpy_helper.from_array(bias)),
        helper.make_node("InstanceNormalization", ["x", "s", "b"], ["y"], epsilon=epsilon),
    ]
    inputs = [x] + ([helper.make_tensor_value_info("s", elem, [scale.size])] if scale_input else [])
    graph = helper.make_graph(nodes, "g", inputs, [y], initializer=[numpy_helper.from_array(scale, "s")])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)], ir_version=8)


@pytest.mark.parametrize("opset", [17, 18])
def test_both_forms_of_the_reductions_and_a_constant_channel(opset: int) -> None:
    scale, bias = np.array([2.0, -0.5, 1.0], np.float32), np.array([0.25, 1.0, -3.0], np.float32)
    model = _norm_graph(scale, bias, opset=opset)
    assert rewrite_graph(model, norm_in_float64=True) == 1
    onnx.checker.check_model(model, full_check=True)
    assert ("axes" in {a.name for n in model.graph.node for a in n.attribute}) == (opset < 18)
    x = np.random.default_rng(1).standard_normal((2, 3, 20, 25)).astype(np.float32) * 7 + 100
    x[1, 2] = 9.5  # a constant channel: variance 0, output exactly its bias
    x64 = x.astype(np.float64)
    mean, var = x64.mean(axis=(2, 3), keepdims=True), x64.var(axis=(2, 3), keepdims=True)
    exact = (x64 - mean) / np.sqrt(var + np.float32(1e-5)) * scale[:, None, None] + bias[:, None, None]
    y = _run(model, x)
    assert np.isfinite(y).all()
    np.testing.assert_allclose(y, exact, rtol=0, atol=TOLERANCE)
    assert (y[1, 2] == -3.0).all()


@pytest.mark.parametrize(
    "model",
    [
        _norm_graph(np.ones(3, np.float32), np.zeros(3, np.float32), scale_input=True),  # overridable at run time
        _norm_graph(np.ones(3, np.float64), np.zeros(3, np.float64)),  # double: ONNX Runtime's own is double
        _norm_graph(np.ones(3, np.float32), np.zeros(2, np.float32)),  # lengths disagree: not ours to judge
    ],
    ids=["scale-a-graph-input", "double", "mismatched"],
)
def test_other_instance_norms_are_left_alone(model: onnx.ModelProto) -> None:
    before = model.SerializeToString()
    assert rewrite_graph(model, norm_in_float64=True) == 0
    assert model.SerializeToString() == before


def test_repo_build_rewrites_instance_norms_by_default(exported: Path, tmp_path: Path) -> None:
    build_repository(exported, tmp_path / "repo", "norm")
    entry = tmp_path / "repo" / "norm" / "1" / "model.onnx"
    assert "InstanceNormalization" not in _ops(onnx.load(str(entry)))  # the in-process runner and Triton get it
    assert rewrite_file(exported, tmp_path / "norm32.onnx", norm_in_float64=False) == 0
    assert _ops(onnx.load(str(tmp_path / "norm32.onnx"))).count("InstanceNormalization") == 2


def test_the_onnx_backend_rewrites_at_load_unless_told_not_to(exported: Path, tmp_path: Path) -> None:
    (tmp_path / "repo" / "norms" / "1").mkdir(parents=True)
    (tmp_path / "repo" / "norms" / "1" / "model.onnx").write_bytes(exported.read_bytes())  # by hand: as exported
    x = (np.random.default_rng(2).standard_normal((1, 4, 32, 32, 32)) * 3 + 50).astype(np.float32)
    with torch.inference_mode():
        exact = TwoNorms().eval().double()(torch.from_numpy(x).double()).numpy()
    errors = {}
    for option in ("", "?norm_in_float64=false"):
        with create_backend(f"onnx{option}", "norms", model_repository=tmp_path / "repo") as backend:
            errors[option] = np.abs(np.asarray(backend.infer({"x": x})["y"]) - exact).max()
    assert errors[""] < errors["?norm_in_float64=false"] / 3, errors
    np.testing.assert_allclose(
        errors["?norm_in_float64=false"], np.abs(_run(onnx.load(str(exported)), x) - exact).max()
    )
