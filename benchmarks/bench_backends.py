"""Time one request of the sample model through each path, interleaved round by round in one run.

Paths: the raw TorchScript module (the floor), our ``torch`` backend (validation, worker pool, conversions),
and the committed repository on the real local tritonserver (Python-backend runner) over tritonclient gRPC
and HTTP - the path the remote backends will take. Each round times every path once, in an order rotated
from round to round, so a slow spell on a shared machine hits every path alike. Prints per path the median
time, its ratio to the raw module's median, the median of the per-round ratios, and the minimum.

    .venv/bin/python benchmarks/bench_backends.py [--rounds 30] [--sizes 64 96]
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Callable
from contextlib import ExitStack
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
#: Calls per path before timing: TorchScript's profiling executor optimises the graph on its second run.
WARM_UP = 2


def interleaved_ms(paths: dict[str, Callable[[], object]], rounds: int) -> dict[str, list[float]]:
    """Per path, one time per round (ms); every path once per round, the order rotated each round."""
    for fn in paths.values():
        for _ in range(WARM_UP):  # first-call allocations and TorchScript's profiling runs stay out of the figures
            fn()
    labels = list(paths)
    times: dict[str, list[float]] = {label: [] for label in labels}
    for round_index in range(rounds):
        shift = round_index % len(labels)
        for label in labels[shift:] + labels[:shift]:
            start = time.perf_counter()
            paths[label]()
            times[label].append((time.perf_counter() - start) * 1000)
    return times


def summary(times: dict[str, list[float]], base: str) -> list[tuple[str, float, float, float, float, float]]:
    """Per path: median ms, median / base median, median of per-round ratios, min ms, min / base min.

    On a shared machine the per-round ratio and the minimum are the steadier figures: a slow spell
    hits both paths of a round, and the fastest run is the one least disturbed.
    """
    base_median, base_min = statistics.median(times[base]), min(times[base])
    rows = []
    for label, values in times.items():
        per_round = statistics.median(value / floor for value, floor in zip(values, times[base], strict=True))
        median = statistics.median(values)
        rows.append((label, median, median / base_median, per_round, min(values), min(values) / base_min))
    return rows


def paths(x: np.ndarray, clients, backend, module) -> dict[str, Callable[[], object]]:
    name = backend.signature.inputs[0].name

    def raw() -> object:
        with torch.inference_mode():
            return module(torch.from_numpy(x)).numpy()

    grpc, http = clients if clients is not None else (None, None)

    def via_grpc() -> object:
        request = grpcclient.InferInput(name, list(x.shape), "FP32")
        request.set_data_from_numpy(x)
        return grpc.infer(NAME, [request], client_timeout=TIMEOUT_S).as_numpy("OUTPUT__0")

    def via_http() -> object:
        request = httpclient.InferInput(name, list(x.shape), "FP32")
        request.set_data_from_numpy(x, binary_data=True)
        return http.infer(NAME, [request]).as_numpy("OUTPUT__0")

    timed: dict[str, Callable[[], object]] = {"raw TorchScript": raw, "torch backend": lambda: backend(x)}
    if clients is not None:
        timed |= {"Triton gRPC": via_grpc, "Triton HTTP": via_http}
    return timed


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=30)
    parser.add_argument("--sizes", type=int, nargs="+", default=[64, 96])
    parser.add_argument("--torch-only", action="store_true", help="raw TorchScript and the torch backend only")
    args = parser.parse_args()
    module = torch.jit.load(str(REPO / NAME / "1" / "model.pt")).eval()
    with create_backend("torch", NAME, model_repository=REPO) as backend, ExitStack() as stack:
        clients = None if args.torch_only else _clients(stack)
        rows = []
        for size in args.sizes:
            x = np.random.default_rng(0).standard_normal((1, 1, size, size, size)).astype(np.float32)
            times = interleaved_ms(paths(x, clients, backend, module), args.rounds)
            rows += [(f"1x1x{size}^3", *row) for row in summary(times, "raw TorchScript")]
    print(
        f"torch {torch.__version__}, {torch.get_num_threads()} threads, {args.rounds} rounds after "
        f"{WARM_UP} warm-up calls, every path once per round (order rotated)\n"
    )
    print(
        "| input | path | median ms | x raw (medians) | x raw (median per round) | min ms | x raw (mins) |\n"
        "|---|---|---:|---:|---:|---:|---:|"
    )
    for size, label, ms, ratio, per_round, fastest, min_ratio in rows:
        print(f"| {size} | {label} | {ms:.1f} | {ratio:.3f} | {per_round:.3f} | {fastest:.1f} | {min_ratio:.3f} |")


def _clients(stack: ExitStack) -> tuple[grpcclient.InferenceServerClient, httpclient.InferenceServerClient]:
    """The local tritonserver on the committed repository and a gRPC and an HTTP client, closed by ``stack``."""
    server = stack.enter_context(LocalTritonServer(REPO))
    grpc = grpcclient.InferenceServerClient(server.grpc_address)
    stack.callback(grpc.close)
    http = httpclient.InferenceServerClient(
        server.http_address, connection_timeout=TIMEOUT_S, network_timeout=TIMEOUT_S
    )
    stack.callback(http.close)
    return grpc, http


if __name__ == "__main__":
    main()
