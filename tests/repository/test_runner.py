"""The runner's pure helpers, in-process (the whole runner runs in test_served_models.py, inside Triton)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from monai_triton_ops.repository.runner import model as runner
from monai_triton_ops.repository.runner.model import name_results, same_item_shapes, split_batch, unalias
from monai_triton_ops.signature import triton_dtypes


def test_results_are_named_like_the_in_process_backend() -> None:
    a, b = torch.zeros(1), torch.ones(1)
    assert name_results("m", ["OUTPUT__0"], a) == {"OUTPUT__0": a}
    assert name_results("m", ["OUTPUT__0", "OUTPUT__1"], (a, b)) == {"OUTPUT__0": a, "OUTPUT__1": b}
    assert name_results("m", ["probs", "labels"], {"labels": b, "probs": a}) == {"probs": a, "labels": b}
    assert name_results("m", ["OUTPUT__0", "OUTPUT__1"], {"x": a, "y": b}) == {"OUTPUT__0": a, "OUTPUT__1": b}


@pytest.mark.parametrize("result", [(torch.zeros(1),), (torch.zeros(1), 3), 5], ids=["too-few", "not-tensor", "int"])
def test_results_that_do_not_fit_the_config(result: object) -> None:
    with pytest.raises(TypeError, match="model 'm' returned"):
        name_results("m", ["OUTPUT__0", "OUTPUT__1"], result)


def test_requests_stack_only_when_every_item_shape_matches() -> None:
    one = [torch.zeros(1, 2, 4), torch.zeros(1, 1)]
    two = [torch.zeros(3, 2, 4), torch.zeros(3, 1)]
    assert same_item_shapes([one, two])
    assert not same_item_shapes([one, [torch.zeros(1, 2, 6), torch.zeros(1, 1)]])


def test_stacked_outputs_are_split_back_per_request() -> None:
    stacked = {"OUTPUT__0": torch.arange(6).view(6, 1)}
    parts = split_batch(stacked, [1, 3, 2])
    assert [p["OUTPUT__0"].flatten().tolist() for p in parts] == [[0], [1, 2, 3], [4, 5]]
    with pytest.raises(ValueError, match=r"output 'OUTPUT__0' has shape \[6, 1\], expected a batch dim of 5"):
        split_batch(stacked, [2, 3])


def test_outputs_that_alias_an_input_are_copied() -> None:
    x = torch.ones(2)
    fresh = x + 1
    out = unalias({"same": x, "view": x[:1], "fresh": fresh}, [x])
    assert out["same"] is not x
    assert torch.equal(out["same"], x)
    assert out["view"].untyped_storage().data_ptr() != x.untyped_storage().data_ptr()
    assert out["fresh"] is fresh


def test_the_runner_knows_every_dtype_dlpack_can_carry() -> None:
    assert sorted(runner.TORCH_DTYPES) == sorted(f"TYPE_{d}" for d in triton_dtypes() if d != "BYTES")


@pytest.mark.parametrize(
    ("parameters", "optimized", "inference_mode", "threads"),
    [({}, True, True, None), ({"DISABLE_OPTIMIZED_EXECUTION": "true", "INFERENCE_MODE": "false",
                                "INTRA_OP_THREAD_COUNT": "1"}, False, False, 1)],
    ids=["defaults", "libtorch-parameters"],
)  # fmt: skip
def test_the_runner_honours_the_libtorch_parameters(
    tmp_path: Path, parameters: dict[str, str], optimized: bool, inference_mode: bool, threads: int | None
) -> None:
    """What a config taken from an NGC deployment (--like) asks of the model, the python runner does too."""
    (tmp_path / "1").mkdir()
    torch.jit.save(torch.jit.script(torch.nn.ReLU()), str(tmp_path / "1" / "net.ts"))
    values = {"torchscript_filename": "net.ts", **parameters}
    config = {
        "name": "relu", "max_batch_size": 0, "input": [{"name": "INPUT_0", "data_type": "TYPE_FP32"}],
        "output": [{"name": "OUTPUT_0", "data_type": "TYPE_FP32"}],
        "parameters": {k: {"string_value": v} for k, v in values.items()},
    }  # fmt: skip
    before = torch.get_num_threads()
    model = runner.TritonPythonModel()
    try:
        model.initialize({"model_config": json.dumps(config), "model_repository": str(tmp_path), "model_version": "1"})
        assert (model.optimized, model.inference_mode) == (optimized, inference_mode)
        assert torch.get_num_threads() == (threads or before)
        out = model._run([torch.tensor([-1.0, 2.0])])
    finally:
        torch.set_num_threads(before)
    assert list(out) == ["OUTPUT_0"]
    assert out["OUTPUT_0"].tolist() == [0.0, 2.0]
    assert out["OUTPUT_0"].is_inference() == inference_mode
