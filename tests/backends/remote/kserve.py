"""A real KServe model server (``kserve.ModelServer``, V2 over REST and gRPC) on loopback, in a virtualenv of its own.

KServe 0.21.0 pins pandas<3 and python-dateutil<3, older than ours, so the Makefile's setup makes it a
virtualenv under the project's cache folder (``$MONAI_TRITON_CACHE``, else ``~/.cache/monai-triton``):
``kserve-0.21.0/``, its stamp ``.installed`` last. A run without it fails, saying to run ``make test``.

The server is a script of ours (:data:`SERVER`), run by that virtualenv's Python: ``seg`` doubles a 5-D float32
tensor ``[-1, 1, -1, -1, -1]`` (numpy only; outputs binary when the request asks for them, as KServe's own
models do), ``raising`` declares the same tensors and raises, which KServe answers with gRPC ``INTERNAL`` and
HTTP 500. KServe binds every address; the script binds its two ports on 127.0.0.1 instead.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from monai_triton_ops.packaging.rootfs import cache_dir
from monai_triton_ops.server.ports import pick_free_ports

from . import peers

#: The Makefile's ``KSERVE_VERSION``.
VERSION = "0.21.0"
START_TIMEOUT_S = 180.0
MODELS = ("seg", "raising")

SERVER = """\
import sys

import numpy as np
from grpc import aio
from kserve import InferOutput, InferRequest, InferResponse, Model, ModelServer
from kserve import model_server
from kserve.protocol.grpc import server as grpc_server
from kserve.protocol.rest.server import RESTServer
from kserve.utils.utils import generate_uuid

TENSOR = [-1, 1, -1, -1, -1]


class Double(Model):
    def __init__(self, name):
        super().__init__(name)
        self.ready = True

    def get_input_types(self):
        return [{"name": "INPUT__0", "datatype": "FP32", "shape": TENSOR}]

    def get_output_types(self):
        return [{"name": "OUTPUT__0", "datatype": "FP32", "shape": TENSOR}]

    async def predict(self, payload: InferRequest, headers=None, response_headers=None) -> InferResponse:
        x = payload.inputs[0].as_numpy()
        out = InferOutput("OUTPUT__0", list(x.shape), "FP32")
        out.set_data_from_numpy((x * 2).astype(np.float32), binary_data=False)  # binary if asked: InferResponse
        return InferResponse(
            payload.id or generate_uuid(), self.name, [out],
            requested_outputs=payload.request_outputs, use_binary_outputs=payload.use_binary_outputs,
        )


class Raising(Double):
    async def predict(self, payload, headers=None, response_headers=None):
        raise RuntimeError("deliberate model error")


class LoopbackREST(RESTServer):
    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.config.host = "127.0.0.1"


class LoopbackAio:
    def __getattr__(self, name):
        return getattr(aio, name)

    @staticmethod
    def server(*args, **kwargs):
        server = aio.server(*args, **kwargs)
        add = server.add_insecure_port
        server.add_insecure_port = lambda address: add("127.0.0.1:" + address.rsplit(":", 1)[1])
        return server


model_server.RESTServer = LoopbackREST
grpc_server.aio = LoopbackAio()

if __name__ == "__main__":
    http_port, grpc_port = int(sys.argv[1]), int(sys.argv[2])
    server = ModelServer(http_port=http_port, grpc_port=grpc_port, grace_period=1, enable_latency_logging=False)
    server.start([Double("seg"), Raising("raising")])
"""


@dataclass(frozen=True)
class KServe:
    """A running KServe model server: its ports and its log."""

    http_port: int
    grpc_port: int
    log: Path

    def url(self, scheme: str) -> str:
        port = self.grpc_port if scheme == "grpc" else self.http_port
        return f"{scheme}://127.0.0.1:{port}"


def python() -> Path:
    """The Python of KServe's virtualenv; a clear failure when ``make setup`` has not made it."""
    root = cache_dir() / f"kserve-{VERSION}"
    stamp = root / ".installed"
    if not stamp.is_file() or stamp.read_text().strip() != VERSION:
        raise RuntimeError(
            f"KServe {VERSION}'s virtualenv is not at {root}: `make test` makes it (its pins clash with ours)"
        )
    return root / "bin" / "python"


@contextlib.contextmanager
def running(folder: Path) -> Iterator[KServe]:
    """KServe on 127.0.0.1 with :data:`SERVER`'s models, ready (REST health, every model, the gRPC port), stopped
    afterwards."""
    program = python()
    script = folder / "server.py"
    script.write_text(SERVER)
    http_port, grpc_port = pick_free_ports(2)
    log = folder / "kserve.log"
    process = peers.start([str(program), str(script), str(http_port), str(grpc_port)], cwd=folder, log=log)
    server = KServe(http_port, grpc_port, log)
    try:
        peers.wait_until(
            lambda: _ready(server), process, name="KServe's model server", log=log, timeout_s=START_TIMEOUT_S
        )
        yield server
    finally:
        peers.stop(process)


def _ready(server: KServe) -> bool:
    base = server.url("http")
    paths = ["/v2/health/ready", *(f"/v2/models/{name}/ready" for name in MODELS)]
    return all(peers.ok(base + path) for path in paths) and peers.listening(server.grpc_port)
