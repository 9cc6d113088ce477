"""The remote backend against every other way to reach a model, in one run, paths interleaved round by round.

W1, transport: an identity model (Python backend, DLPack) on 1x1xN^3 float32, per request:
    direct TorchScript (in-process identity), raw tritonclient HTTP binary, raw gRPC, raw gRPC + system
    shared memory (hand-written: one region, registered once, output read as a view), the App SDK's
    TritonRemoteModel (JSON over HTTP), and this backend over gRPC, HTTP and auto (system shm).
W2, the sample app: sliding window over the full MNI T1 (the app's own settings from the model metadata):
    in-process TorchScript vs this backend with max_in_flight 1 and 4.

A path is one entry of ``W1_PATHS`` / ``W2_PATHS``: a function taking the run's ``Bench`` and returning
``(call, close)``; another backend (the in-process ``triton`` one, say) joins with one more entry.

    .venv/bin/python benchmarks/bench_remote.py [--rounds 7] [--sizes 64 128 160] [--w2-rounds 3]
"""

from __future__ import annotations

import os

# Client and server share this host's cores: OpenMP threads left spinning after their work (the default
# policy) take the cores the other side needs. LocalTritonServer sets the same for the server.
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

import argparse
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from tritonclient.utils import shared_memory as tshm

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "apps" / "brain_tissue_seg"))

from monai_triton_ops import create_backend  # noqa: E402
from monai_triton_ops.pipeline.run import InferenceSettings, run_inference  # noqa: E402
from monai_triton_ops.server import LocalTritonServer  # noqa: E402
from tests import triton_models  # noqa: E402

REPO = ROOT / "model_repository"
SAMPLE = "brain_tissue_seg"
TIMEOUT_S = 600.0
Call = Callable[[Any], Any]
Path_ = Callable[["Bench"], tuple[Call, Callable[[], None]]]


@dataclass
class Bench:
    """What the paths share: the servers and the largest input (shared memory regions are sized for it)."""

    identity: LocalTritonServer
    sample: LocalTritonServer
    max_bytes: int
    closers: list[Callable[[], None]] = field(default_factory=list)


# -- W1 paths -------------------------------------------------------------------------------------
class _Identity(torch.nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x


def direct_torchscript(bench: Bench) -> tuple[Call, Callable[[], None]]:
    module = torch.jit.script(_Identity().eval())

    def call(x: np.ndarray) -> np.ndarray:
        with torch.inference_mode():
            return module(torch.from_numpy(x)).numpy()

    return call, lambda: None


def raw_http(bench: Bench) -> tuple[Call, Callable[[], None]]:
    client = httpclient.InferenceServerClient(bench.identity.http_address, network_timeout=TIMEOUT_S)

    def call(x: np.ndarray) -> np.ndarray:
        tensor = httpclient.InferInput("INPUT__0", list(x.shape), "FP32")
        tensor.set_data_from_numpy(x, binary_data=True)
        wanted = [httpclient.InferRequestedOutput("OUTPUT__0", binary_data=True)]
        return client.infer("identity", [tensor], outputs=wanted).as_numpy("OUTPUT__0")

    return call, client.close


def raw_grpc(bench: Bench) -> tuple[Call, Callable[[], None]]:
    client = grpcclient.InferenceServerClient(bench.identity.grpc_address)

    def call(x: np.ndarray) -> np.ndarray:
        tensor = grpcclient.InferInput("INPUT__0", list(x.shape), "FP32")
        tensor.set_data_from_numpy(x)
        return client.infer("identity", [tensor], client_timeout=TIMEOUT_S).as_numpy("OUTPUT__0")

    return call, client.close


def raw_grpc_shm(bench: Bench) -> tuple[Call, Callable[[], None]]:
    """As a careful user writes it with tritonclient's helpers: regions once, then copy in, infer, view out."""
    client = grpcclient.InferenceServerClient(bench.identity.grpc_address)
    tag = f"bench_raw_{os.getpid()}"
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
        client.infer("identity", [tensor], outputs=[output], client_timeout=TIMEOUT_S)
        return tshm.get_contents_as_numpy(regions["out"], np.float32, x.shape)

    def close() -> None:
        for kind, region in regions.items():
            client.unregister_system_shared_memory(f"{tag}_{kind}", client_timeout=10)
            tshm.destroy_shared_memory_region(region)
        client.close()

    return call, close


def app_sdk_remote_model(bench: Bench) -> tuple[Call, Callable[[], None]]:
    import logging

    from monai.deploy.core.models.triton_model import TritonRemoteModel
    from tritonclient.grpc import model_config_pb2 as pb

    logging.getLogger().setLevel(logging.WARNING)  # it logs at INFO on every call through the root logger
    config = pb.ModelConfig(name="identity")
    config.input.add(name="INPUT__0", data_type=pb.TYPE_FP32, dims=[-1] * 5)
    config.output.add(name="OUTPUT__0", data_type=pb.TYPE_FP32, dims=[-1] * 5)
    model = TritonRemoteModel("identity", bench.identity.http_address, config)
    return (lambda x: model(torch.from_numpy(x)).numpy()), model._triton_client.close


def _backend(spec: str, model: str, **options: Any) -> tuple[Call, Callable[[], None]]:
    backend = create_backend(spec, model, timeout_s=TIMEOUT_S, **options).open()
    name = backend.signature.input_names[0]
    return (lambda x: backend.infer({name: x})), backend.close


W1_PATHS: dict[str, Path_] = {
    "direct TorchScript": direct_torchscript,
    "tritonclient HTTP binary": raw_http,
    "tritonclient gRPC": raw_grpc,
    "tritonclient gRPC + system shm": raw_grpc_shm,
    "App SDK TritonRemoteModel": app_sdk_remote_model,
    "this backend gRPC": lambda b: _backend(f"{b.identity.grpc_url}?shared_memory=none", "identity"),
    "this backend HTTP": lambda b: _backend(f"{b.identity.http_url}?shared_memory=none", "identity"),
    "this backend auto (gRPC, shm)": lambda b: _backend(b.identity.grpc_url, "identity"),
    "this backend auto (HTTP, shm)": lambda b: _backend(b.identity.http_url, "identity"),
}


# -- W2 paths -------------------------------------------------------------------------------------
def _sample_run(spec: str, **options: Any) -> Path_:
    def make(bench: Bench) -> tuple[Call, Callable[[], None]]:
        from transforms import post_transforms, pre_transforms

        if spec == "torch":
            backend = create_backend("torch", SAMPLE, model_repository=REPO, **options).open()
        else:
            url = bench.sample.grpc_url if spec == "grpc" else bench.sample.http_url
            backend = create_backend(url, SAMPLE, timeout_s=TIMEOUT_S, **options).open()
        settings = InferenceSettings.from_metadata(backend.signature.metadata, request_batch_size=1)

        def call(image: torch.Tensor) -> Any:
            return run_inference(
                image, backend, settings, pre_transforms=pre_transforms(), post_transforms=post_transforms()
            )

        return call, backend.close

    return make


W2_PATHS: dict[str, Path_] = {
    "in-process TorchScript": _sample_run("torch", max_in_flight=1),
    "this backend gRPC, max_in_flight 1": _sample_run("grpc", max_in_flight=1),
    "this backend gRPC, max_in_flight 4": _sample_run("grpc", max_in_flight=4),
}


# -- running ----------------------------------------------------------------------------------------
def interleaved(paths: dict[str, Call], data: Any, rounds: int) -> dict[str, float]:
    """Median ms per path; every round runs each path once, in turn, after one warm-up call each."""
    for call in paths.values():
        call(data)
    times: dict[str, list[float]] = {label: [] for label in paths}
    for _ in range(rounds):
        for label, call in paths.items():
            start = time.perf_counter()
            call(data)
            times[label].append((time.perf_counter() - start) * 1000)
    return {label: statistics.median(values) for label, values in times.items()}


def _open(entries: dict[str, Path_], bench: Bench) -> dict[str, Call]:
    calls = {}
    for label, make in entries.items():
        call, close = make(bench)
        bench.closers.append(close)
        calls[label] = call
    return calls


def _mni_image() -> torch.Tensor:
    from atlas import load_t1

    return torch.as_tensor(load_t1().get_fdata(dtype=np.float32))[None]  # (1, X, Y, Z), as the app feeds it


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--sizes", type=int, nargs="+", default=[64, 128, 160])
    parser.add_argument("--w2-rounds", type=int, default=3)
    args = parser.parse_args()
    repo = Path(tempfile.mkdtemp(prefix="bench-remote-")) / "repo"
    triton_models.identity(repo, "identity")
    with LocalTritonServer(repo) as identity, LocalTritonServer(REPO) as sample:
        bench = Bench(identity, sample, max_bytes=4 * max(args.sizes) ** 3)
        try:
            w1 = _open(W1_PATHS, bench)
            rows = []
            for size in args.sizes:
                x = np.random.default_rng(0).standard_normal((1, 1, size, size, size)).astype(np.float32)
                rows.append((size, interleaved(w1, x, args.rounds)))
            w2 = interleaved(_open(W2_PATHS, bench), _mni_image(), args.w2_rounds)
        finally:
            for close in bench.closers:
                close()
    report(rows, w2, args)


def report(rows: list[tuple[int, dict[str, float]]], w2: dict[str, float], args: argparse.Namespace) -> None:
    print(f"torch {torch.__version__}, {os.cpu_count()} CPUs, load average {os.getloadavg()[0]:.2f} at the end")
    print(f"\nW1: median ms of {args.rounds} interleaved rounds after one warm-up\n")
    labels = list(rows[0][1])
    print("| path | " + " | ".join(f"1x1x{size}^3" for size, _ in rows) + " |")
    print("|---|" + "---:|" * len(rows))
    for label in labels:
        print(f"| {label} | " + " | ".join(f"{timings[label]:.1f}" for _, timings in rows) + " |")
    for size, t in rows:
        auto, sdk, shm = (
            t["this backend auto (gRPC, shm)"],
            t["App SDK TritonRemoteModel"],
            t["tritonclient gRPC + system shm"],
        )
        print(f"N={size}: auto is {sdk / auto:.1f}x faster than TritonRemoteModel, {auto / shm:.2f}x raw gRPC+shm")
    print(f"\nW2: sample app sliding window on the full MNI T1, median s of {args.w2_rounds} rounds\n")
    print("| path | median s | x in-process |\n|---|---:|---:|")
    base = w2["in-process TorchScript"]
    for label, ms in w2.items():
        print(f"| {label} | {ms / 1000:.2f} | {ms / base:.2f} |")


if __name__ == "__main__":
    main()
