"""Every way to reach a model that the benchmark compares, as ``label -> make(bench) -> (call, close)``.

W1 (transport) sends 1x1xN^3 float32 to an identity model and takes its output back:
    in this process: TorchScript called directly (the floor), the ``torch`` backend, the ``triton`` backend
    (Triton in-process); through a local ``tritonserver``: the ``grpc://`` and ``http://`` backends (shared
    memory ``auto``, and ``none``), tritonclient by hand (gRPC + system shared memory, gRPC, HTTP binary), and
    the App SDK's ``TritonRemoteModel`` (JSON over HTTP).
W2 (the sample app) runs the sliding window over the full MNI T1 with the app's own transforms and settings:
    the ``torch``, ``triton``, ``grpc://`` and ``http://`` backends, and ``TritonRemoteModel`` as the predictor.

Only public APIs: ``create_backend``, ``LocalTritonServer``, ``tritonclient``, the App SDK. The identity model
behind the Triton paths is a Python-backend model (torch in the stub, DLPack); behind the in-process TorchScript
paths it is TorchScript returning a copy (as any real model returns a new tensor).
"""

from __future__ import annotations

import logging
import os
from collections.abc import Callable
from contextlib import ExitStack
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch

from monai_triton_ops import create_backend
from monai_triton_ops.pipeline.run import InferenceSettings, run_inference
from monai_triton_ops.repository.builder import build_repository
from monai_triton_ops.repository.config import read_config
from monai_triton_ops.server import LocalTritonServer

ROOT = Path(__file__).resolve().parents[2]
SAMPLE_REPO = ROOT / "model_repository"
SAMPLE = "brain_tissue_seg"
IDENTITY = "identity"
TIMEOUT_S = 600.0
Call = Callable[[Any], Any]
Make = Callable[["Bench"], tuple[Call, Callable[[], None]]]


@dataclass
class Bench:
    """What the paths share: the servers (started when a path first needs one), the repositories, the largest input.

    ``stack`` stops the servers; ``closers`` close the paths (before the servers stop).
    """

    stack: ExitStack
    identity_repo: Path  # Python-backend identity (Triton paths)
    torch_repo: Path  # TorchScript identity (the torch backend)
    max_bytes: int
    closers: list[Callable[[], None]] = field(default_factory=list)
    _servers: dict[Path, LocalTritonServer] = field(default_factory=dict)

    @property
    def identity_server(self) -> LocalTritonServer:
        return self._server(self.identity_repo)

    @property
    def sample_server(self) -> LocalTritonServer:
        return self._server(SAMPLE_REPO)

    def _server(self, repo: Path) -> LocalTritonServer:
        if repo not in self._servers:
            self._servers[repo] = self.stack.enter_context(LocalTritonServer(repo, startup_timeout_s=300))
        return self._servers[repo]


class Copy(torch.nn.Module):
    """The TorchScript identity: a new tensor holding the input, as a real model's output is new memory."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x.clone()


def write_identity_repositories(folder: Path) -> tuple[Path, Path]:
    """``(python-backend identity repository, TorchScript identity repository)`` under ``folder``."""
    from tests import triton_models  # the project's Python-backend test models (run.py puts the root on sys.path)

    python_repo = triton_models.identity(folder / "python_repo", IDENTITY)
    scripted = folder / "copy.pt"
    torch.jit.save(torch.jit.script(Copy().eval()), str(scripted))
    torch_repo = folder / "torch_repo"
    build_repository(scripted, torch_repo, IDENTITY, input_shapes=[(1, 1, 8, 8, 8)])
    return python_repo, torch_repo


# -- W1 ---------------------------------------------------------------------------------------------------------
def direct_torchscript(bench: Bench) -> tuple[Call, Callable[[], None]]:
    module = torch.jit.load(str(bench.torch_repo / IDENTITY / "1" / "model.pt")).eval()

    def call(x: np.ndarray) -> np.ndarray:
        with torch.inference_mode():
            return module(torch.from_numpy(x)).numpy()

    return call, lambda: None


def backend(spec: str, model: str = IDENTITY, **options: Any) -> Make:
    """A path through ``create_backend(spec, model)``; ``spec`` ``torch``/``triton`` or ``grpc``/``http`` (local)."""

    def make(bench: Bench) -> tuple[Call, Callable[[], None]]:
        where: dict[str, Any] = {}
        if spec == "torch":
            where["model_repository"] = bench.torch_repo
        elif spec == "triton":
            where["model_repository"] = bench.identity_repo
        url = {"grpc": bench.identity_server.grpc_url, "http": bench.identity_server.http_url}.get(spec, spec)
        opened = create_backend(url, model, timeout_s=TIMEOUT_S, **where, **options).open()
        name = opened.signature.input_names[0]
        return (lambda x: opened.infer({name: x})), opened.close

    return make


def raw_http(bench: Bench) -> tuple[Call, Callable[[], None]]:
    import tritonclient.http as httpclient

    client = httpclient.InferenceServerClient(bench.identity_server.http_address, network_timeout=TIMEOUT_S)

    def call(x: np.ndarray) -> np.ndarray:
        tensor = httpclient.InferInput("INPUT__0", list(x.shape), "FP32")
        tensor.set_data_from_numpy(x, binary_data=True)
        wanted = [httpclient.InferRequestedOutput("OUTPUT__0", binary_data=True)]
        return client.infer(IDENTITY, [tensor], outputs=wanted).as_numpy("OUTPUT__0")

    return call, client.close


def raw_grpc(bench: Bench) -> tuple[Call, Callable[[], None]]:
    import tritonclient.grpc as grpcclient

    client = grpcclient.InferenceServerClient(bench.identity_server.grpc_address)

    def call(x: np.ndarray) -> np.ndarray:
        tensor = grpcclient.InferInput("INPUT__0", list(x.shape), "FP32")
        tensor.set_data_from_numpy(x)
        return client.infer(IDENTITY, [tensor], client_timeout=TIMEOUT_S).as_numpy("OUTPUT__0")

    return call, client.close


def raw_grpc_shm(bench: Bench) -> tuple[Call, Callable[[], None]]:
    """As a careful user writes it with tritonclient's helpers: regions once, then copy in, infer, read a view."""
    import tritonclient.grpc as grpcclient
    from tritonclient.utils import shared_memory as tshm

    client = grpcclient.InferenceServerClient(bench.identity_server.grpc_address)
    tag = f"bench_run_{os.getpid()}"
    regions = {}
    for kind in ("in", "out"):
        name = f"{tag}_{kind}"
        regions[kind] = tshm.create_shared_memory_region(name, f"/{name}", bench.max_bytes, create_only=True)
        client.register_system_shared_memory(name, f"/{name}", bench.max_bytes, client_timeout=10)

    def call(x: np.ndarray) -> np.ndarray:
        tshm.set_shared_memory_region(regions["in"], [x])
        tensor = grpcclient.InferInput("INPUT__0", list(x.shape), "FP32")
        tensor.set_shared_memory(f"{tag}_in", x.nbytes)
        output = grpcclient.InferRequestedOutput("OUTPUT__0")
        output.set_shared_memory(f"{tag}_out", x.nbytes)
        client.infer(IDENTITY, [tensor], outputs=[output], client_timeout=TIMEOUT_S)
        return tshm.get_contents_as_numpy(regions["out"], np.float32, x.shape)

    def close() -> None:
        for kind, region in regions.items():
            client.unregister_system_shared_memory(f"{tag}_{kind}", client_timeout=10)
            tshm.destroy_shared_memory_region(region)
        client.close()

    return call, close


def app_sdk_identity(bench: Bench) -> tuple[Call, Callable[[], None]]:
    model = _remote_model(IDENTITY, bench.identity_server, bench.identity_repo)
    return (lambda x: model(torch.from_numpy(x)).numpy()), model._triton_client.close


def _remote_model(name: str, server: LocalTritonServer, repo: Path) -> Any:
    """The App SDK's client, made as its model loader makes it: the model's config.pbtxt and the server's netloc."""
    from monai.deploy.core.models.triton_model import TritonRemoteModel

    logging.getLogger().setLevel(logging.WARNING)  # it logs every call at INFO through the root logger
    return TritonRemoteModel(name, server.http_address, read_config(repo / name / "config.pbtxt", name=name))


APP_SDK = "App SDK TritonRemoteModel"
W1_PATHS: dict[str, Make] = {
    "TorchScript, called directly": direct_torchscript,
    "torch backend": backend("torch"),
    "triton backend (in-process)": backend("triton"),
    "grpc backend (shm auto)": backend("grpc"),
    "http backend (shm auto)": backend("http"),
    "grpc backend (shm none)": backend("grpc", shared_memory="none"),
    "http backend (shm none)": backend("http", shared_memory="none"),
    "tritonclient gRPC + shm, by hand": raw_grpc_shm,
    "tritonclient gRPC": raw_grpc,
    "tritonclient HTTP binary": raw_http,
    APP_SDK: app_sdk_identity,
}
#: (path, base) pairs whose per-round ratios the tables show
W1_RATIOS = [
    ("torch backend", "TorchScript, called directly"),
    ("triton backend (in-process)", "grpc backend (shm auto)"),
    ("grpc backend (shm auto)", "tritonclient gRPC + shm, by hand"),
    ("http backend (shm auto)", "tritonclient gRPC + shm, by hand"),
    (APP_SDK, "grpc backend (shm auto)"),
]


# -- W2 ---------------------------------------------------------------------------------------------------------
def sample_run(spec: str, **options: Any) -> Make:
    """The sample app's inference on one volume through ``spec`` (``torch``, ``triton``, ``grpc``, ``http``)."""

    def make(bench: Bench) -> tuple[Call, Callable[[], None]]:
        from transforms import post_transforms, pre_transforms

        server = bench.sample_server
        url = {"grpc": server.grpc_url, "http": server.http_url}.get(spec, spec)
        where = {"model_repository": SAMPLE_REPO} if spec in ("torch", "triton") else {}
        opened = create_backend(url, SAMPLE, timeout_s=TIMEOUT_S, **where, **options).open()
        settings = InferenceSettings.from_metadata(opened.signature.metadata, request_batch_size=1)

        def call(image: torch.Tensor) -> Any:
            return run_inference(
                image, opened, settings, pre_transforms=pre_transforms(), post_transforms=post_transforms()
            )

        return call, opened.close

    return make


def sample_app_sdk(bench: Bench) -> tuple[Call, Callable[[], None]]:
    """``TritonRemoteModel`` as the sliding window's predictor, with the same transforms and settings."""
    from monai.inferers import SlidingWindowInferer
    from transforms import post_transforms, pre_transforms

    model = _remote_model(SAMPLE, bench.sample_server, SAMPLE_REPO)
    with create_backend("torch", SAMPLE, model_repository=SAMPLE_REPO) as local:  # the same metadata, read once
        settings = InferenceSettings.from_metadata(local.signature.metadata)
    inferer = SlidingWindowInferer(
        roi_size=settings.roi_size or (), sw_batch_size=settings.sw_batch_size, overlap=settings.overlap,
        mode=settings.mode,
    )  # fmt: skip

    def call(image: torch.Tensor) -> Any:
        batch = torch.as_tensor(pre_transforms()(image)).unsqueeze(0)
        return post_transforms()(inferer(batch, model)[0])

    return call, model._triton_client.close


W2_PATHS: dict[str, Make] = {
    "torch backend": sample_run("torch", max_in_flight=1),
    "triton backend, 1 in flight": sample_run("triton", max_in_flight=1),
    "triton backend, 4 in flight": sample_run("triton", max_in_flight=4),
    "grpc backend, 1 in flight": sample_run("grpc", max_in_flight=1),
    "grpc backend, 4 in flight": sample_run("grpc", max_in_flight=4),
    "http backend, 4 in flight": sample_run("http", max_in_flight=4),
    APP_SDK: sample_app_sdk,
}
W2_BASE = "torch backend"


def mni_image() -> torch.Tensor:
    """The full MNI T1 as the app feeds it: (1, X, Y, Z) float32."""
    from atlas import load_t1

    return torch.as_tensor(load_t1().get_fdata(dtype=np.float32))[None]


def open_paths(entries: dict[str, Make], bench: Bench) -> dict[str, Call]:
    """Open every path (its closer is kept by ``bench``)."""
    calls = {}
    for label, make in entries.items():
        call, close = make(bench)
        bench.closers.append(close)
        calls[label] = call
    return calls
