"""TorchScript (and ONNX) runner for the Triton Python backend; copied verbatim to ``<repo>/<name>/<version>/model.py``.

It loads the TorchScript file named by the ``torchscript_filename`` parameter (``model.pt`` by
default) from its version folder, takes tensor names (any names: inputs are passed to ``forward`` in
config order, outputs named in config order) and dtypes from the model configuration, and runs the
module under ``torch.inference_mode``. It honours the libtorch backend's parameters that mean
something here, so a configuration taken from an NGC deployment behaves the same:
``DISABLE_OPTIMIZED_EXECUTION`` (TorchScript's graph optimiser off), ``INFERENCE_MODE`` (``false``:
``torch.no_grad`` instead) and ``INTRA_OP_THREAD_COUNT`` (torch threads of this instance's process).

Tensors cross the Triton boundary by DLPack only: the Python backend stub is built against numpy
1.x, and with numpy 2 ``pb_utils.Tensor(name, ndarray)`` and ``.as_numpy()`` silently carry 0 bytes.
The file needs nothing but torch and the backend's ``triton_python_backend_utils``, so it runs in
any Triton container with torch installed. A model file ending in ``.onnx`` is run by ONNX Runtime on the
CPU instead (``onnxruntime`` installed too): the bundled server has no ONNX Runtime backend of its own. One
ending in ``.pt2`` is a ``torch.export`` program (``torch.export.load``), which Triton's libtorch backend cannot load.
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping, Sequence
from typing import Any

import torch
import torch.utils.dlpack

try:
    import triton_python_backend_utils as pb_utils  # type: ignore[import-not-found]
except ImportError:  # imported outside Triton, e.g. to test the pure helpers below
    pb_utils = None

TORCHSCRIPT_PARAMETER = "torchscript_filename"
#: A model file with this suffix runs through ONNX Runtime instead of TorchScript.
ONNX_SUFFIX = ".onnx"
#: A model file with this suffix is a ``torch.export`` program, loaded with ``torch.export.load``.
PT2_SUFFIX = ".pt2"
DEFAULT_FILENAME = "model.pt"
_TRUE = ("true", "1", "yes", "on")
#: Triton config dtype -> torch dtype (BYTES has none: DLPack cannot carry it).
TORCH_DTYPES = {
    "TYPE_BOOL": torch.bool,
    "TYPE_UINT8": torch.uint8,
    "TYPE_UINT16": torch.uint16,
    "TYPE_UINT32": torch.uint32,
    "TYPE_UINT64": torch.uint64,
    "TYPE_INT8": torch.int8,
    "TYPE_INT16": torch.int16,
    "TYPE_INT32": torch.int32,
    "TYPE_INT64": torch.int64,
    "TYPE_FP16": torch.float16,
    "TYPE_FP32": torch.float32,
    "TYPE_FP64": torch.float64,
    "TYPE_BF16": torch.bfloat16,
}


class TritonPythonModel:
    """One instance per Triton model instance: ``initialize`` once, ``execute`` per batch of requests."""

    def initialize(self, args: dict[str, str]) -> None:
        config = json.loads(args["model_config"])
        self.name = config["name"]
        self.input_names = [t["name"] for t in config["input"]]
        self.outputs = [(t["name"], _torch_dtype(self.name, t)) for t in config["output"]]
        self.batching = int(config.get("max_batch_size", 0)) > 0
        parameters = {k: str(v.get("string_value", "")) for k, v in config.get("parameters", {}).items()}
        filename = parameters.get(TORCHSCRIPT_PARAMETER) or DEFAULT_FILENAME
        path = os.path.join(args["model_repository"], args["model_version"], filename)
        self.optimized = parameters.get("DISABLE_OPTIMIZED_EXECUTION", "").lower() not in _TRUE
        self.inference_mode = parameters.get("INFERENCE_MODE", "true").lower() in _TRUE
        threads = parameters.get("INTRA_OP_THREAD_COUNT", "")
        if threads.isdigit() and int(threads) > 0:
            torch.set_num_threads(int(threads))
        self.device = _device(args)
        if path.lower().endswith(ONNX_SUFFIX):
            self.device = torch.device("cpu")  # ONNX Runtime's CPU provider: its tensors are host memory
            self.module: Any = OnnxModule(path, self.input_names, int(threads) if threads.isdigit() else 0)
        elif path.lower().endswith(PT2_SUFFIX):
            self.module = torch.export.load(path).module().to(self.device)  # exported in eval mode; no eval()
        else:
            self.module = torch.jit.load(path, map_location=self.device)  # type: ignore[no-untyped-call]
            self.module.eval()

    def execute(self, requests: list[Any]) -> list[Any]:
        """Stack same-shaped requests into one batch when the model batches; else run each alone."""
        if self.batching and len(requests) > 1:
            batched = self._execute_stacked(requests)
            if batched is not None:
                return batched
        return [self._execute_one(request) for request in requests]

    def finalize(self) -> None:
        self.module = None

    def _execute_one(self, request: Any) -> Any:
        try:
            outputs = self._run(self._inputs(request))
            return pb_utils.InferenceResponse(output_tensors=[_to_triton(n, t) for n, t in outputs.items()])
        except Exception as exc:  # every failure goes back to its caller as that request's error
            return _error(self.name, exc)

    def _execute_stacked(self, requests: list[Any]) -> list[Any] | None:
        try:
            per_request = [self._inputs(request) for request in requests]
        except Exception:  # a bad request: let each one fail on its own
            return None
        if not same_item_shapes(per_request):
            return None
        sizes = [tensors[0].shape[0] for tensors in per_request]
        try:
            stacked = [torch.cat(column) for column in zip(*per_request, strict=True)]
            parts = split_batch(self._run(stacked), sizes)
        except Exception as exc:  # one failure fails the whole batch: they ran as one
            return [_error(self.name, exc) for _ in requests]
        return [
            pb_utils.InferenceResponse(output_tensors=[_to_triton(n, t) for n, t in part.items()]) for part in parts
        ]

    def _inputs(self, request: Any) -> list[torch.Tensor]:
        tensors = []
        for name in self.input_names:
            tensor = pb_utils.get_input_tensor_by_name(request, name)
            if tensor is None:
                raise ValueError(f"input '{name}' is missing")
            tensors.append(torch.utils.dlpack.from_dlpack(tensor.to_dlpack()).to(self.device))
        return tensors

    def _run(self, inputs: list[torch.Tensor]) -> dict[str, torch.Tensor]:
        grad_off = torch.inference_mode() if self.inference_mode else torch.no_grad()
        with grad_off, torch.jit.optimized_execution(self.optimized):  # type: ignore[attr-defined]
            result = self.module(*inputs)
        outputs = name_results(self.name, [n for n, _ in self.outputs], result)
        for name, dtype in self.outputs:
            if outputs[name].dtype != dtype:
                raise TypeError(f"output '{name}': the model returned {outputs[name].dtype}, the config says {dtype}")
        return unalias(outputs, inputs)


class OnnxModule:
    """An ONNX file run by ONNX Runtime, called like a TorchScript module: tensors in, a tuple of tensors out.

    Inputs are fed by the configuration's names when the graph has them, else by position (config order);
    torch and numpy share the memory both ways, so nothing is copied here.
    """

    def __init__(self, path: str, input_names: Sequence[str], threads: int = 0) -> None:
        import onnxruntime

        settings = onnxruntime.SessionOptions()
        settings.intra_op_num_threads = threads
        settings.add_session_config_entry("session.intra_op.allow_spinning", "0")  # leave idle cores to others
        settings.log_severity_level = 3
        self.session = onnxruntime.InferenceSession(path, sess_options=settings, providers=["CPUExecutionProvider"])
        graph = [i.name for i in self.session.get_inputs()]
        self.feeds = list(input_names) if set(input_names) == set(graph) else graph

    def __call__(self, *inputs: torch.Tensor) -> tuple[torch.Tensor, ...]:
        feeds = {name: tensor.detach().cpu().numpy() for name, tensor in zip(self.feeds, inputs, strict=True)}
        return tuple(torch.from_numpy(array) for array in self.session.run(None, feeds))


def name_results(model: str, names: Sequence[str], result: Any) -> dict[str, torch.Tensor]:
    """Name a model's raw result as the configuration does (same rules as the in-process backend).

    A tensor is the first output; a tuple/list maps by position; a dict maps by key when its keys
    are the configured names, else by insertion order. Nested results (a dict of lists of tensors, as
    RetinaNet's heads give, one tensor per feature level) map their tensors depth-first in order
    (``flatten_result``).
    """
    keyed = isinstance(result, Mapping) and set(result) == set(names)
    if keyed and all(isinstance(result[n], torch.Tensor) for n in names):
        return {n: result[n] for n in names}
    values = flatten_result(model, result)
    if len(values) != len(names):
        raise TypeError(f"model '{model}' returned {len(values)} tensor(s), the config declares outputs {list(names)}")
    return dict(zip(names, values, strict=True))


def flatten_result(model: str, result: Any) -> list[torch.Tensor]:
    """A result's tensors depth-first: dict values in insertion order, tuple/list items in order."""
    if isinstance(result, torch.Tensor):
        return [result]
    if isinstance(result, Mapping):
        items: list[Any] = list(result.values())
    elif isinstance(result, tuple | list):
        items = list(result)
    else:
        raise TypeError(f"model '{model}' returned {type(result).__name__}, expected tensors")
    flat: list[torch.Tensor] = []
    for item in items:
        flat.extend(flatten_result(model, item))
    return flat


def same_item_shapes(per_request: Sequence[Sequence[torch.Tensor]]) -> bool:
    """Whether requests can be stacked: every input has the same shape after the batch dim everywhere."""
    first = [t.shape[1:] for t in per_request[0]]
    return all([t.shape[1:] for t in tensors] == first for tensors in per_request[1:])


def split_batch(outputs: Mapping[str, torch.Tensor], sizes: Sequence[int]) -> list[dict[str, torch.Tensor]]:
    """Cut stacked outputs back into one dict per request, along the batch dim."""
    total = sum(sizes)
    for name, tensor in outputs.items():
        if tensor.dim() == 0 or tensor.shape[0] != total:
            raise ValueError(f"output '{name}' has shape {list(tensor.shape)}, expected a batch dim of {total}")
    pieces = {name: torch.split(tensor, list(sizes)) for name, tensor in outputs.items()}
    return [{name: pieces[name][i] for name in outputs} for i in range(len(sizes))]


def unalias(outputs: dict[str, torch.Tensor], inputs: Sequence[torch.Tensor]) -> dict[str, torch.Tensor]:
    """Copy outputs that share memory with an input: input buffers belong to Triton, not to the response."""
    owned = {t.untyped_storage().data_ptr() for t in inputs}
    return {n: t.clone() if t.untyped_storage().data_ptr() in owned else t for n, t in outputs.items()}


def _to_triton(name: str, tensor: torch.Tensor) -> Any:
    capsule = torch.utils.dlpack.to_dlpack(tensor.contiguous())  # type: ignore[attr-defined]
    return pb_utils.Tensor.from_dlpack(name, capsule)


def _error(model: str, exc: Exception) -> Any:
    """An error response: the caller gets the last line (TorchScript puts a traceback before it), the log all."""
    lines = [line.strip() for line in str(exc).splitlines() if line.strip()]
    message = f"model '{model}': {lines[-1] if lines else type(exc).__name__}"
    pb_utils.Logger.log_error(f"{message}\n{exc}")
    return pb_utils.InferenceResponse(output_tensors=[], error=pb_utils.TritonError(message))


def _torch_dtype(model: str, tensor: Mapping[str, Any]) -> torch.dtype:
    data_type = tensor["data_type"]
    if data_type not in TORCH_DTYPES:
        raise ValueError(f"model '{model}' output '{tensor['name']}': data_type {data_type} cannot be served")
    return TORCH_DTYPES[data_type]


def _device(args: Mapping[str, str]) -> torch.device:
    if args.get("model_instance_kind") == "GPU":
        return torch.device(f"cuda:{args.get('model_instance_device_id', '0')}")
    return torch.device("cpu")
