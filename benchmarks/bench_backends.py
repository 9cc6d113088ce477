"""Time one request of the sample model through each path, side by side in one run.

Paths: the raw TorchScript module (the floor), our ``torch`` backend (validation, conversions), and the
committed repository on the real local tritonserver (Python-backend runner) over tritonclient gRPC and
HTTP - the path the remote backends will take. Prints medians and ratios to the raw module.

    .venv/bin/python benchmarks/bench_backends.py [--repeats 20] [--sizes 64 96]
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np
import torch
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient

from monai_triton_ops import create_backend
from monai_triton_ops.server import LocalTritonServer

ROOT = Path(__file__).resolve().parents[1]
REPO = ROOT / "model_repository"
NAME = "brain_tissue_seg"
TIMEOUT_S = 120


def median_ms(fn: Callable[[], object], repeats: int) -> float:
    fn()  # warm-up: first-call allocations and JIT profiling stay out of the figure
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        times.append((time.perf_counter() - start) * 1000)
    return statistics.median(times)


def paths(x: np.ndarray, grpc, http, backend, module) -> dict[str, Callable[[], object]]:
    name = backend.signature.inputs[0].name

    def raw() -> object:
        with torch.inference_mode():
            return module(torch.from_numpy(x)).numpy()

    def via_grpc() -> object:
        request = grpcclient.InferInput(name, list(x.shape), "FP32")
        request.set_data_from_numpy(x)
        return grpc.infer(NAME, [request], client_timeout=TIMEOUT_S).as_numpy("OUTPUT__0")

    def via_http() -> object:
        request = httpclient.InferInput(name, list(x.shape), "FP32")
        request.set_data_from_numpy(x, binary_data=True)
        return http.infer(NAME, [request]).as_numpy("OUTPUT__0")

    return {
        "raw TorchScript": raw,
        "torch backend": lambda: backend(x),
        "Triton gRPC": via_grpc,
        "Triton HTTP": via_http,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repeats", type=int, default=20)
    parser.add_argument("--sizes", type=int, nargs="+", default=[64, 96])
    args = parser.parse_args()
    module = torch.jit.load(str(REPO / NAME / "1" / "model.pt")).eval()
    rows = []
    with create_backend("torch", NAME, model_repository=REPO) as backend, LocalTritonServer(REPO) as server:
        grpc = grpcclient.InferenceServerClient(server.grpc_address)
        http = httpclient.InferenceServerClient(
            server.http_address, connection_timeout=TIMEOUT_S, network_timeout=TIMEOUT_S
        )
        try:
            for size in args.sizes:
                x = np.random.default_rng(0).standard_normal((1, 1, size, size, size)).astype(np.float32)
                timings = {
                    label: median_ms(fn, args.repeats) for label, fn in paths(x, grpc, http, backend, module).items()
                }
                base = timings["raw TorchScript"]
                rows += [(f"1x1x{size}^3", label, ms, ms / base) for label, ms in timings.items()]
        finally:
            grpc.close()
            http.close()
    print(f"torch {torch.__version__}, {torch.get_num_threads()} threads, median of {args.repeats} after 1 warm-up\n")
    print("| input | path | median ms | x raw |\n|---|---|---:|---:|")
    for size, label, ms, ratio in rows:
        print(f"| {size} | {label} | {ms:.1f} | {ratio:.2f} |")


if __name__ == "__main__":
    main()
