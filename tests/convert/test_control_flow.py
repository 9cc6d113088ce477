"""``convert`` of networks whose control flow depends on the data: kept and checked both ways, or one clear error.

TorchScript made by ``torch.jit.script`` keeps an ``if`` on a tensor's value, which becomes an ONNX ``If``:
converted, and checked on probe variants that take each branch. A loop whose trip count the exporter writes
as a float is a graph ONNX Runtime refuses; a ``.pt2`` holding ``torch.cond`` cannot go through the ONNX
exporter but re-exports as ``.pt2`` with its ``cond`` kept. (A Python network traced with such a branch is
refused in ``test_convert.py``.) Tiny Conv3d modules on 8^3 probes: about 2 s of CPU in all.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import onnxruntime
import pytest
import torch
from torch.export import Dim

from monai_triton_ops.cli import main
from monai_triton_ops.convert import convert
from monai_triton_ops.errors import ConversionError

SHAPE = [[2, 1, 8, 8, 8]]


class Branch(torch.nn.Module):
    """``conv(x)`` where the input's sum is positive, ``-conv(x) - 1`` elsewhere."""

    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.conv = torch.nn.Conv3d(1, 2, 3, padding=1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if bool(x.sum() > 0):
            return self.conv(x)
        return -self.conv(x) - 1.0


class FloatSteps(Branch):
    """A loop whose trip count comes from the input's values through a float (the exporter keeps the float)."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.conv(x)
        for _ in range(int(x.abs().max().item() * 3)):
            y = y + 1.0
        return y


class Cond(Branch):
    """``Branch`` written with ``torch.cond``, as ``torch.export`` keeps it."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.cond(x.sum() > 0, lambda t: self.conv(t), lambda t: -self.conv(t) - 1.0, (x,))


def _files(folder: Path) -> list[str]:
    return sorted(p.name for p in folder.iterdir())


def test_a_scripted_branch_on_the_data_becomes_an_onnx_if_checked_both_ways(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    source = tmp_path / "branch.pt"
    scripted = torch.jit.script(Branch().eval())
    scripted.save(str(source))
    out = tmp_path / "branch.onnx"
    assert main(["convert", str(source), "--to", "onnx", "-o", str(out), "--input-shape", "2,1,8,8,8"]) == 0
    printed = capsys.readouterr().out
    assert "control flow on the data kept (If x1), checked on the probe and 5 variants of it; 1 of 1 top-level If " \
        "seen taking both branches" in printed  # fmt: skip
    assert [n.op_type for n in onnx.load(str(out)).graph.node].count("If") == 1
    session = onnxruntime.InferenceSession(str(out), providers=["CPUExecutionProvider"])
    x = torch.randn(3, 1, 8, 8, 12, generator=torch.Generator().manual_seed(1))
    for image in (x.abs(), -x.abs()):  # each branch, at another batch and size than the probe's
        with torch.inference_mode():
            want = scripted(image).numpy()
        got = session.run(None, {session.get_inputs()[0].name: image.numpy()})[0]
        np.testing.assert_allclose(got, want, atol=1e-5)


def test_a_loop_onnx_runtime_refuses_is_one_error_and_nothing_is_written(tmp_path: Path) -> None:
    source = tmp_path / "steps.pt"
    torch.jit.script(FloatSteps().eval()).save(str(source))
    with pytest.raises(
        ConversionError, match=r"model 'steps': the exported ONNX graph does not load in ONNX Runtime \(.*Loop.*"
        r"nothing was written"
    ):  # fmt: skip
        convert(source, "onnx", tmp_path / "steps.onnx", input_shapes=SHAPE)
    assert _files(tmp_path) == ["steps.pt"]


def test_a_program_with_torch_cond_is_refused_for_onnx_and_keeps_its_cond_as_pt2(tmp_path: Path) -> None:
    x = torch.randn(2, 1, 8, 8, 8, generator=torch.Generator().manual_seed(2))
    program = torch.export.export(Cond().eval(), (x,), dynamic_shapes=({0: Dim.AUTO, 2: Dim.AUTO},), strict=False)
    source = tmp_path / "cond.pt2"
    torch.export.save(program, str(source))
    with pytest.raises(ConversionError, match=r"model 'cond': the \.pt2 program holds \['cond'\] \(control flow"):
        convert(source, "onnx", tmp_path / "cond.onnx", input_shapes=SHAPE)
    assert _files(tmp_path) == ["cond.pt2"]
    result = convert(source, "pt2", tmp_path / "again.pt2", input_shapes=SHAPE)
    assert result.control_flow.ops == ("cond",)
    again = torch.export.load(str(result.path)).module()
    for image in (x, -x):
        torch.testing.assert_close(again(image), program.module()(image))
