"""A real MLServer (Seldon's Open Inference Protocol server) on loopback, in a virtualenv of its own.

MLServer 1.7.1 pins packages that clash with ours, so it gets its own virtualenv under the project's
cache folder (``$MONAI_TRITON_CACHE``, else ``~/.cache/monai-triton``): ``mlserver-1.7.1/``, made once
(about 90 s and 330 MB here: ``python -m venv`` and ``pip install mlserver==1.7.1``) under a file lock,
then reused by every run. When the package index cannot be reached the tests are skipped, saying so.

The models are a custom runtime (numpy only, no framework): ``seg`` doubles a 5-D float tensor, ``mixed``
returns its float and int64 inputs, ``fixed`` doubles a ``[1, 4]`` tensor (no batch dim), ``bare`` doubles too
but declares no tensors (its metadata lists none).
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import shutil
import subprocess
import sys
import textwrap
from collections.abc import Iterator
from dataclasses import dataclass
from functools import partial
from pathlib import Path

import pytest

from monai_triton_ops.packaging.rootfs import cache_dir
from monai_triton_ops.server.ports import pick_free_ports

from . import peers

VERSION = "1.7.1"
INSTALL_TIMEOUT_S = 900.0
START_TIMEOUT_S = 180.0
#: pip's words when the index is out of reach (a skip, not a failure: nothing here can fix the network).
_OFFLINE = ("Failed to establish a new connection", "Temporary failure in name resolution", "No matching distribution")

RUNTIME = """\
import numpy as np
from mlserver import MLModel
from mlserver.codecs import NumpyCodec
from mlserver.types import InferenceRequest, InferenceResponse


class Double(MLModel):
    async def load(self) -> bool:
        return True

    async def predict(self, payload: InferenceRequest) -> InferenceResponse:
        x = NumpyCodec.decode_input(payload.inputs[0])
        out = NumpyCodec.encode_output("OUTPUT__0", (x * 2).astype(x.dtype))
        return InferenceResponse(model_name=self.name, outputs=[out])


class Identity(MLModel):
    async def load(self) -> bool:
        return True

    async def predict(self, payload: InferenceRequest) -> InferenceResponse:
        outputs = []
        for i, tensor in enumerate(payload.inputs):
            outputs.append(NumpyCodec.encode_output(f"OUTPUT__{i}", NumpyCodec.decode_input(tensor)))
        return InferenceResponse(model_name=self.name, outputs=outputs)
"""

SEG_SHAPE = [-1, 1, -1, -1, -1]


def _tensor(name: str, datatype: str, shape: list[int]) -> dict[str, object]:
    return {"name": name, "datatype": datatype, "shape": shape}


MODELS: dict[str, dict[str, object]] = {
    "seg": {
        "implementation": "runtime.Double",
        "inputs": [_tensor("INPUT__0", "FP32", SEG_SHAPE)],
        "outputs": [_tensor("OUTPUT__0", "FP32", SEG_SHAPE)],
    },
    "mixed": {
        "implementation": "runtime.Identity",
        "inputs": [_tensor("INPUT__0", "FP32", [-1, 3]), _tensor("INPUT__1", "INT64", [-1, 2])],
        "outputs": [_tensor("OUTPUT__0", "FP32", [-1, 3]), _tensor("OUTPUT__1", "INT64", [-1, 2])],
    },
    "fixed": {
        "implementation": "runtime.Double",
        "inputs": [_tensor("INPUT__0", "FP32", [1, 4])],
        "outputs": [_tensor("OUTPUT__0", "FP32", [1, 4])],
    },
    "bare": {"implementation": "runtime.Double"},
}


@dataclass(frozen=True)
class MLServer:
    """A running MLServer: its URLs and its log."""

    http_port: int
    grpc_port: int
    log: Path

    @property
    def http_url(self) -> str:
        return f"http://127.0.0.1:{self.http_port}"

    @property
    def grpc_url(self) -> str:
        return f"grpc://127.0.0.1:{self.grpc_port}"

    def url(self, scheme: str) -> str:
        return self.grpc_url if scheme == "grpc" else self.http_url


def mlserver_command() -> Path:
    """The ``mlserver`` program of the cached virtualenv, made first if missing (see the module docstring)."""
    root = cache_dir() / f"mlserver-{VERSION}"
    program = root / "bin" / "mlserver"
    if (root / ".installed").is_file():
        return program
    root.parent.mkdir(parents=True, exist_ok=True)
    with open(root.parent / f".mlserver-{VERSION}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # another run may be making it: wait for it, then use it
        if not (root / ".installed").is_file():
            _install(root)
    return program


def _install(root: Path) -> None:
    """A fresh virtualenv at ``root`` with MLServer; its stamp ``.installed`` last (a half-made one is redone)."""
    shutil.rmtree(root, ignore_errors=True)
    subprocess.run([sys.executable, "-m", "venv", str(root)], check=True, timeout=INSTALL_TIMEOUT_S)
    pip = [str(root / "bin" / "python"), "-m", "pip", "install", "-q", f"mlserver=={VERSION}"]
    result = subprocess.run(pip, capture_output=True, text=True, timeout=INSTALL_TIMEOUT_S, check=False)
    if result.returncode != 0:
        shutil.rmtree(root, ignore_errors=True)
        output = result.stdout + result.stderr
        if any(sign in output for sign in _OFFLINE):
            pytest.skip(f"MLServer {VERSION} cannot be installed: the package index is out of reach ({output[-300:]})")
        raise RuntimeError(f"pip install mlserver=={VERSION} failed:\n{output[-3000:]}")
    (root / ".installed").write_text(VERSION)


def write_models(folder: Path) -> Path:
    """The model folder MLServer starts from: the runtime module and one ``model-settings.json`` per model."""
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "runtime.py").write_text(textwrap.dedent(RUNTIME))
    for name, settings in MODELS.items():
        (folder / name).mkdir(exist_ok=True)
        (folder / name / "model-settings.json").write_text(json.dumps({"name": name, **settings}))
    return folder


@contextlib.contextmanager
def running(folder: Path) -> Iterator[MLServer]:
    """MLServer on 127.0.0.1 serving ``folder``'s models, ready (health and every model), stopped afterwards."""
    program = mlserver_command()
    write_models(folder)
    http_port, grpc_port = pick_free_ports(2)
    settings = {
        "host": "127.0.0.1",
        "http_port": http_port,
        "grpc_port": grpc_port,
        "metrics_endpoint": None,
        "parallel_workers": 0,  # models run in the server process: no worker processes to start
    }
    (folder / "settings.json").write_text(json.dumps(settings))
    log = folder / "mlserver.log"
    process = peers.start([str(program), "start", str(folder)], cwd=folder, log=log)
    server = MLServer(http_port, grpc_port, log)
    paths = ["/v2/health/ready", *(f"/v2/models/{name}/ready" for name in MODELS)]
    try:
        ready = partial(_answers, server.http_url, paths)
        peers.wait_until(ready, process, name="MLServer", log=server.log, timeout_s=START_TIMEOUT_S)
        yield server
    finally:
        peers.stop(process)


def _answers(base: str, paths: list[str]) -> bool:
    return all(peers.ok(base + path) for path in paths)
