"""``repo build model.onnx``'s ``configs/onnxruntime.pbtxt`` holds what Triton's own ``onnxruntime`` backend checks.

The bundled server has no ``onnxruntime`` backend, so the file is checked as that backend checks it
(``onnxruntime_backend/src/onnxruntime.cc``): it parses as Triton's ``ModelConfig`` (``tritonclient``'s
``model_config_pb2``, strict text format); inputs and outputs are both given, so the backend skips its
auto-complete and takes ``max_batch_size`` as written; every config tensor is a graph tensor of the same
type (``ValidateInputs`` / ``ValidateOutputs``), with the graph's dims (-1 where dynamic), the batch axis
left out when ``max_batch_size > 0`` and then dynamic in every graph tensor (``AutoCompleteMaxBatch``'s
rule). The graph is read by ONNX Runtime itself. Three tiny exports, well under a second of CPU.
"""

from __future__ import annotations

from pathlib import Path

import onnxruntime
import pytest
import torch
from google.protobuf import text_format
from tritonclient.grpc import model_config_pb2

from monai_triton_ops.repository.builder import ONNXRUNTIME_CONFIG, build_repository

from ..conftest import TWO_META, TwoInTwoOut
from ..onnx_models import save_onnx

#: ONNX Runtime's type names -> Triton's (``ModelConfigDataTypeToOnnxDataType`` in reverse).
TRITON_TYPES = {"tensor(float)": "TYPE_FP32", "tensor(int64)": "TYPE_INT64", "tensor(bool)": "TYPE_BOOL"}


class Conv(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.conv = torch.nn.Conv3d(1, 3, 3, padding=1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.conv(x)


def _problems(folder: Path) -> list[str]:
    """What Triton's onnxruntime backend would refuse in ``folder``'s ``configs/onnxruntime.pbtxt``."""
    config = text_format.Parse((folder / ONNXRUNTIME_CONFIG).read_text(), model_config_pb2.ModelConfig())
    problems = []
    if config.platform != "onnxruntime_onnx" and config.backend != "onnxruntime":
        problems.append(f"platform {config.platform!r}, backend {config.backend!r}")
    if config.name != folder.name:
        problems.append(f"name {config.name!r} is not the folder's {folder.name!r}")
    model = folder / "1" / (config.default_model_filename or "model.onnx")
    session = onnxruntime.InferenceSession(str(model), providers=["CPUExecutionProvider"])
    graph = {t.name: t for t in (*session.get_inputs(), *session.get_outputs())}
    if not config.input or not config.output:
        problems.append("inputs or outputs missing: the backend would auto-complete the config itself")
    declared = [*config.input, *config.output]
    if sorted(t.name for t in declared) != sorted(graph):
        problems.append(f"tensors {sorted(t.name for t in declared)}, graph {sorted(graph)}")
    for tensor in declared:
        found = graph.get(tensor.name)
        if found is None:
            continue
        dims = [d if isinstance(d, int) else -1 for d in found.shape]
        if config.max_batch_size > 0:
            if dims[:1] != [-1]:
                problems.append(f"{tensor.name}: max_batch_size {config.max_batch_size} but graph batch {dims[:1]}")
            dims = dims[1:]
        if list(tensor.dims) != dims:
            problems.append(f"{tensor.name}: dims {list(tensor.dims)}, graph {dims}")
        wanted = TRITON_TYPES[found.type]
        if model_config_pb2.DataType.Name(tensor.data_type) != wanted:
            problems.append(f"{tensor.name}: {model_config_pb2.DataType.Name(tensor.data_type)}, graph {wanted}")
    return problems


@pytest.mark.parametrize("max_batch_size", [0, 4])
def test_the_onnxruntime_config_is_what_tritons_onnxruntime_backend_checks(tmp_path: Path, max_batch_size: int) -> None:
    conv = save_onnx(
        Conv(), tmp_path / "conv.onnx", [torch.zeros(2, 1, 8, 8, 8)], input_names=["image"], output_names=["pred"],
        dynamic={"image": [0, 2, 3, 4], "pred": [0, 2, 3, 4]},
    )  # fmt: skip
    folder = build_repository(conv, tmp_path / "repo", "conv", max_batch_size=max_batch_size)
    assert _problems(folder) == []
    config = text_format.Parse((folder / ONNXRUNTIME_CONFIG).read_text(), model_config_pb2.ModelConfig())
    assert config.max_batch_size == max_batch_size
    assert [list(t.dims) for t in config.input] == [[-1, 1, -1, -1, -1][1 if max_batch_size else 0 :]]


def test_names_types_and_fixed_dims_of_a_two_input_two_output_graph_match_triton_s_check(tmp_path: Path) -> None:
    two = save_onnx(
        TwoInTwoOut(), tmp_path / "two.onnx", [torch.zeros(2, 1, 4, 4), torch.zeros(2, dtype=torch.int64)],
        input_names=["image", "offset"], output_names=["doubled", "positive"], meta=TWO_META,
    )  # fmt: skip
    folder = build_repository(two, tmp_path / "repo", "two")
    assert _problems(folder) == []
    text = (folder / ONNXRUNTIME_CONFIG).read_text()
    for line in ("data_type: TYPE_INT64", "data_type: TYPE_BOOL", "dims: [2, 1, 4, 4]"):
        assert line in text
    wrong = text.replace("TYPE_INT64", "TYPE_INT32")  # the check itself can fail
    (folder / ONNXRUNTIME_CONFIG).write_text(wrong)
    assert _problems(folder) == ["offset: TYPE_INT32, graph TYPE_INT64"]
