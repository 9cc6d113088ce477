"""The Python-backend test models that the server, binding and backend tests share (numpy 2 safe).

Every model moves tensors with DLPack only: the 2.51 stub is built against numpy 1.x, and with numpy 2
``pb_utils.Tensor(name, ndarray)`` / ``.as_numpy()`` silently carry 0 bytes (``guard_numpy`` keeps that
broken path on purpose, for the test that our clients refuse a short output).

No model imports torch in its stub: numpy is what they need, and a stub that imports torch takes seconds
of CPU to load its model where one that imports numpy takes a fraction of one (each model of a server is
a stub process of its own). The torch runner that generated repositories hold is tested with its own
models (``tests/repository``, the contract suite).

``write_python_model`` writes any model from an ``execute`` body; the presets below are the kit the
failure-mode tests need (identity, slow, queue-limited, raising, crashing, empty output, dynamic output
size, decoupled final-only). ``passthrough`` is the smallest identity (no helpers, no parameters), for leak
loops and benchmarks that measure the transport, not the model.
"""

from __future__ import annotations

import textwrap
from collections.abc import Mapping, Sequence
from pathlib import Path

#: (name, Triton config dtype such as "TYPE_FP32", dims with -1 for dynamic)
Tensor = tuple[str, str, Sequence[int]]
#: The one-input one-output FP32 vector that most presets take and return.
FP32_IN: list[Tensor] = [("INPUT__0", "TYPE_FP32", (-1,))]
FP32_OUT: list[Tensor] = [("OUTPUT__0", "TYPE_FP32", (-1,))]

_MODEL_PY = """\
import json
import os
import time

import numpy as np
import triton_python_backend_utils as pb_utils


def get(request, name):
    tensor = pb_utils.get_input_tensor_by_name(request, name)
    return None if tensor is None else np.from_dlpack(tensor)


def put(name, value):
    if isinstance(value, pb_utils.Tensor):  # an input handed back as it is: no copy
        return pb_utils.Tensor.from_dlpack(name, value)
    # A writable C-order copy: numpy exports neither a read-only array (get's) through DLPack nor, for the
    # stub's C-order check, a fresh empty one (numpy 2 gives it zero strides; a reshaped one has real ones).
    array = np.array(value, order="C").reshape(-1)
    return pb_utils.Tensor.from_dlpack(name, array.reshape(np.shape(value)))


class TritonPythonModel:
    def initialize(self, args):
        config = json.loads(args["model_config"])
        self.params = {{k: v["string_value"] for k, v in config.get("parameters", {{}}).items()}}
        self.delay_s = float(self.params.get("delay_s", "0"))
        self.executions = 0
{initialize}

    def execute(self, requests):
        self.executions += 1
        if self.delay_s:
            time.sleep(self.delay_s)
        responses = []
        for request in requests:
{execute}
        return responses
"""

_IDENTITY_BODY = """\
outputs = [put(out, pb_utils.get_input_tensor_by_name(request, inp)) for inp, out in PAIRS]
responses.append(pb_utils.InferenceResponse(output_tensors=outputs))
"""


def write_python_model(
    repo: Path,
    name: str,
    *,
    inputs: Sequence[Tensor],
    outputs: Sequence[Tensor],
    execute: str,
    initialize: str = "",
    max_batch_size: int = 0,
    parameters: Mapping[str, str] | None = None,
    dynamic_batching: str | None = None,
    decoupled: bool = False,
    instances: int = 1,
) -> Path:
    """Write ``<repo>/<name>/config.pbtxt`` and ``1/model.py``; ``execute`` runs once per request.

    ``execute`` sees ``request``, ``responses`` (append one response per request unless decoupled),
    ``get(request, name) -> numpy.ndarray`` (read-only), ``put(name, array or input pb_utils.Tensor) ->
    pb_utils.Tensor``, ``np`` and ``self.params``.
    ``dynamic_batching`` is the block's body, e.g. ``"max_queue_delay_microseconds: 20000"``.
    """
    lines = [f'name: "{name}"', 'backend: "python"', f"max_batch_size: {max_batch_size}"]
    lines.append("input [ " + ", ".join(_tensor(t) for t in inputs) + " ]")
    lines.append("output [ " + ", ".join(_tensor(t) for t in outputs) + " ]")
    lines.append(f"instance_group [ {{ kind: KIND_CPU count: {instances} }} ]")
    if dynamic_batching is not None:
        lines.append(f"dynamic_batching {{ {dynamic_batching} }}")
    if decoupled:
        lines.append("model_transaction_policy { decoupled: true }")
    for key, value in (parameters or {}).items():
        lines.append(f'parameters {{ key: "{key}" value: {{ string_value: "{value}" }} }}')
    (repo / name / "1").mkdir(parents=True, exist_ok=True)
    (repo / name / "config.pbtxt").write_text("\n".join(lines) + "\n")
    source = _MODEL_PY.format(
        initialize=textwrap.indent(initialize or "pass", " " * 8),
        execute=textwrap.indent(execute, " " * 12),
    )
    (repo / name / "1" / "model.py").write_text(source)
    return repo


def _tensor(tensor: Tensor) -> str:
    name, dtype, dims = tensor
    return f'{{ name: "{name}" data_type: {dtype} dims: [ {", ".join(str(d) for d in dims)} ] }}'


def identity(
    repo: Path,
    name: str = "identity",
    *,
    dtypes: Sequence[str] = ("TYPE_FP32",),
    dims: Sequence[int] = (-1, -1, -1, -1, -1),
    max_batch_size: int = 0,
    delay_s: float = 0.0,
    dynamic_batching: str | None = None,
    instances: int = 1,
) -> Path:
    """``OUTPUT__i = INPUT__i`` for each dtype given (mixed dtypes in one model), optionally slowed down."""
    pairs = [(f"INPUT__{i}", f"OUTPUT__{i}") for i in range(len(dtypes))]
    return write_python_model(
        repo,
        name,
        inputs=[(inp, dtype, dims) for (inp, _), dtype in zip(pairs, dtypes, strict=True)],
        outputs=[(out, dtype, dims) for (_, out), dtype in zip(pairs, dtypes, strict=True)],
        execute=f"PAIRS = {pairs!r}\n" + _IDENTITY_BODY,
        max_batch_size=max_batch_size,
        parameters={"delay_s": str(delay_s)} if delay_s else None,
        dynamic_batching=dynamic_batching,
        instances=instances,
    )


def slow(repo: Path, name: str = "slow", *, delay_s: float = 0.3, max_queue_size: int | None = None) -> Path:
    """FP32 identity that sleeps ``delay_s`` per execution; with ``max_queue_size`` a bounded queue."""
    batching = None
    if max_queue_size is not None:
        batching = f"default_queue_policy {{ max_queue_size: {max_queue_size} }}"
    max_batch_size = 1 if batching else 0
    return identity(repo, name, dims=(-1,), max_batch_size=max_batch_size, delay_s=delay_s, dynamic_batching=batching)


def raising(repo: Path, name: str = "raising", *, message: str = "deliberate model error") -> Path:
    """Every request gets an error response carrying ``message`` (a model-reported error, never retried)."""
    return write_python_model(
        repo,
        name,
        inputs=FP32_IN,
        outputs=FP32_OUT,
        execute=f"responses.append(pb_utils.InferenceResponse(error=pb_utils.TritonError({message!r})))\n",
    )


def crashing(repo: Path, name: str = "crashing") -> Path:
    """Identity, but the stub process exits (``os._exit(1)``) when the input's first value is negative."""
    return write_python_model(
        repo,
        name,
        inputs=FP32_IN,
        outputs=FP32_OUT,
        execute=(
            'tensor = pb_utils.get_input_tensor_by_name(request, "INPUT__0")\n'
            "x = np.from_dlpack(tensor)\n"
            "if x.size and float(x.reshape(-1)[0]) < 0:\n"
            "    os._exit(1)\n"
            'responses.append(pb_utils.InferenceResponse(output_tensors=[put("OUTPUT__0", tensor)]))\n'
        ),
    )


def empty_output(repo: Path, name: str = "empty_output") -> Path:
    """``EMPTY`` is a (0, 4) FP32 tensor next to ``OUTPUT__0 = INPUT__0``: the zero-byte output case."""
    return write_python_model(
        repo,
        name,
        inputs=FP32_IN,
        outputs=[("OUTPUT__0", "TYPE_FP32", (-1,)), ("EMPTY", "TYPE_FP32", (-1, 4))],
        execute=(
            'x = pb_utils.get_input_tensor_by_name(request, "INPUT__0")\n'
            'outs = [put("OUTPUT__0", x), put("EMPTY", np.empty((0, 4), dtype=np.float32))]\n'
            "responses.append(pb_utils.InferenceResponse(output_tensors=outs))\n"
        ),
    )


def dynamic_output(repo: Path, name: str = "dynamic_output") -> Path:
    """``OUTPUT__0`` holds ``int(SIZE[0])`` FP32 values ``0, 1, ...``: its size is only known after inference."""
    return write_python_model(
        repo,
        name,
        inputs=[("SIZE", "TYPE_INT64", (1,))],
        outputs=FP32_OUT,
        execute=(
            'n = int(get(request, "SIZE")[0])\n'
            'outs = [put("OUTPUT__0", np.arange(n, dtype=np.float32))]\n'
            "responses.append(pb_utils.InferenceResponse(output_tensors=outs))\n"
        ),
    )


def decoupled_final_only(repo: Path, name: str = "decoupled_final_only") -> Path:
    """Decoupled model that sends no response, only the FINAL flag: the NULL-response callback case."""
    return write_python_model(
        repo,
        name,
        inputs=FP32_IN,
        outputs=FP32_OUT,
        execute=(
            "sender = request.get_response_sender()\nsender.send(flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL)\n"
        ),
        decoupled=True,
    )


def guard_numpy(repo: Path, name: str = "guard_numpy") -> Path:
    """Builds its output with ``pb_utils.Tensor(name, ndarray)``: under numpy 2 it arrives with 0 bytes."""
    return write_python_model(
        repo,
        name,
        inputs=FP32_IN,
        outputs=FP32_OUT,
        execute=(
            'x = get(request, "INPUT__0")\n'
            'outs = [pb_utils.Tensor("OUTPUT__0", np.ascontiguousarray(x))]\n'
            "responses.append(pb_utils.InferenceResponse(output_tensors=outs))\n"
        ),
    )


def bytes_count(repo: Path, name: str = "bytes_count") -> Path:
    """``COUNT`` = number of elements of the BYTES input ``TEXT``, read from its shape only.

    The 2.51 stub decodes BYTES data wrongly under numpy 2 (it has no DLPack path), but Triton checks
    the serialized elements against the shape before the model runs, so the wire format is exercised.
    """
    return write_python_model(
        repo,
        name,
        inputs=[("TEXT", "TYPE_STRING", (-1,))],
        outputs=[("COUNT", "TYPE_INT64", (1,))],
        execute=(
            'shape = pb_utils.get_input_tensor_by_name(request, "TEXT").shape()\n'
            "count = np.array([int(shape[0])], dtype=np.int64)\n"
            'responses.append(pb_utils.InferenceResponse(output_tensors=[put("COUNT", count)]))\n'
        ),
    )


def jitter(repo: Path, name: str = "jitter", *, low_s: float = 0.05, high_s: float = 0.15, instances: int = 2) -> Path:
    """FP32 identity that sleeps a random time in ``[low_s, high_s]`` per request (deadline races)."""
    return write_python_model(
        repo,
        name,
        inputs=FP32_IN,
        outputs=FP32_OUT,
        execute=(
            "import random\n"
            f"time.sleep(random.uniform({low_s}, {high_s}))\n"
            'y = put("OUTPUT__0", pb_utils.get_input_tensor_by_name(request, "INPUT__0"))\n'
            "responses.append(pb_utils.InferenceResponse(output_tensors=[y]))\n"
        ),
        instances=instances,
    )


def passthrough_source(*, delay_s: float = 0.0, load_s: float = 0.0, error: str | None = None) -> str:
    """The ``model.py`` of :func:`passthrough` (for a test that hands Triton the files itself)."""
    return _PASSTHROUGH_PY.format(delay_s=delay_s, load_s=load_s, error=error)


_PASSTHROUGH_PY = """\
import time

import triton_python_backend_utils as pb_utils

DELAY_S = {delay_s!r}
LOAD_S = {load_s!r}
ERROR = {error!r}


class TritonPythonModel:
    def initialize(self, args):
        if LOAD_S:
            time.sleep(LOAD_S)

    def execute(self, requests):
        if DELAY_S:
            time.sleep(DELAY_S)
        responses = []
        for request in requests:
            if ERROR:
                responses.append(pb_utils.InferenceResponse(error=pb_utils.TritonError(ERROR)))
                continue
            tensor = pb_utils.get_input_tensor_by_name(request, "INPUT__0")
            output = pb_utils.Tensor.from_dlpack("OUTPUT__0", tensor)
            responses.append(pb_utils.InferenceResponse(output_tensors=[output]))
        return responses
"""


def passthrough(
    repo: Path,
    name: str = "passthrough",
    *,
    dtype: str = "TYPE_FP32",
    dims: Sequence[int] = (-1,),
    delay_s: float = 0.0,
    instances: int = 1,
    load_s: float = 0.0,
    error: str | None = None,
) -> Path:
    """``OUTPUT__0 = INPUT__0`` handed back as the stub's own tensor through DLPack, nothing else imported.

    ``load_s``: its ``initialize`` takes that long (a model loading); ``error``: every request fails with it.
    """
    (repo / name / "1").mkdir(parents=True, exist_ok=True)
    config = [
        f'name: "{name}"',
        'backend: "python"',
        "max_batch_size: 0",
        "input [ " + _tensor(("INPUT__0", dtype, dims)) + " ]",
        "output [ " + _tensor(("OUTPUT__0", dtype, dims)) + " ]",
        f"instance_group [ {{ kind: KIND_CPU count: {instances} }} ]",
    ]
    (repo / name / "config.pbtxt").write_text("\n".join(config) + "\n")
    (repo / name / "1" / "model.py").write_text(passthrough_source(delay_s=delay_s, load_s=load_s, error=error))
    return repo
