"""Time one request of the sample model through each path, interleaved round by round in one run.

Paths: the raw TorchScript module (the floor), our ``torch`` backend (validation, worker pool, conversions),
and the committed repository on the real local tritonserver (Python-backend runner) over tritonclient gRPC
and HTTP - the path the remote backends will take. Each round times every path once, in an order rotated
from round to round, so a slow spell on a shared machine hits every path alike. Prints per path the median
time, its ratio to the raw module's median, and the median of the per-round ratios.

    .venv/bin/python benchmarks/bench_backends.py [--rounds 30] [--sizes 64 96]
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


def interleaved_ms(paths: dict[str, Callable[[], object]], rounds: int) -> dict[str, list[float]]:
    """Per path, one time per round (ms); every path once per round, the order rotated each round."""
    for fn in paths.values():
        fn()  # warm-up: first-call allocations and JIT profiling stay out of the figures
    labels = list(paths)
    times: dict[str, list[float]] = {label: [] for label in labels}
    for round_index in range(rounds):
        shift = round_index % len(labels)
        for label in labels[shift:] + labels[:shift]:
            start = time.perf_counter()
            paths[label]()
            times[label].append((time.perf_counter() - start) * 1000)
    return times


def summary(times: dict[str, list[float]], base: str) -> list[tuple[str, float, float, float]]:
    """``(path, median ms, median / base median, median of per-round ratios to base)`` per path."""
    base_median = statistics.median(times[base])
    rows = []
    for label, values in times.items():
        per_round = [value / floor for value, floor in zip(values, times[base], strict=True)]
        rows.append(
            (label, statistics.median(values), statistics.median(values) / base_median, statistics.median(per_round))
        )
    return rows


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
    parser.add_argument("--rounds", type=int, default=30)
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
                times = interleaved_ms(paths(x, grpc, http, backend, module), args.rounds)
                rows += [(f"1x1x{size}^3", *row) for row in summary(times, "raw TorchScript")]
        finally:
            grpc.close()
            http.close()
    print(
        f"torch {torch.__version__}, {torch.get_num_threads()} threads, {args.rounds} rounds after 1 warm-up, "
        "every path once per round (order rotated)\n"
    )
    print("| input | path | median ms | x raw (medians) | x raw (median per round) |\n|---|---|---:|---:|---:|")
    for size, label, ms, ratio, per_round in rows:
        print(f"| {size} | {label} | {ms:.1f} | {ratio:.3f} | {per_round:.3f} |")


if __name__ == "__main__":
    main()
