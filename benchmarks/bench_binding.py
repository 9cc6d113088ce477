"""Per-request time of an identity model: the in-process binding alone vs tritonclient gRPC with system shared memory.

Both paths serve the same model files (a Python-backend identity that hands its input back through DLPack,
``tests/triton_models.passthrough``) from the same wheel: in this process through ``monai_triton_ops.bindings``,
and in a local ``tritonserver`` process over gRPC on loopback with the input and output in registered system
shared-memory regions (the fastest tritonclient path; the output is copied out so that both paths hand the
caller an array it keeps). Rounds interleave the paths; the table gives medians over all rounds and the ratio
to the binding.

    .venv/bin/python benchmarks/bench_binding.py [--rounds 5] [--repeats 40] [--sizes 64 128] [--plain-grpc]
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
import uuid
from collections.abc import Callable
from pathlib import Path

import numpy as np
import tritonclient.grpc as grpcclient
import tritonclient.utils.shared_memory as shm

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from monai_triton_ops import bindings as b  # noqa: E402
from monai_triton_ops.server import LocalTritonServer  # noqa: E402
from monai_triton_ops.server.environment import assemble_backend_dir, server_environment, shm_prefix  # noqa: E402
from tests import triton_models  # noqa: E402

MODEL = "identity"
TIMEOUT_S = 60


def start_inprocess(repo: Path, workdir: Path) -> b.TRITONSERVER_Server:
    """The in-process server over ``repo``, with the Python-backend stub environment the local server uses."""
    library = b.load_library()
    assert library.install is not None  # noqa: S101 - the wheel's library sits in its install
    os.environ.update(server_environment(library.install))
    options = b.TRITONSERVER_ServerOptions()
    options.set_model_repository_path(repo).set_backend_directory(assemble_backend_dir(library.install, workdir))
    options.set_model_control_mode(b.TRITONSERVER_ModelControlMode.EXPLICIT).set_startup_model(MODEL)
    options.set_log_file(workdir.parent / "inprocess.log").set_exit_timeout(10)
    options.set_pinned_memory_pool_byte_size(0).set_gpu_metrics(False)
    options.set_backend_config("python", "shm-region-prefix-name", shm_prefix())
    server = b.TRITONSERVER_Server(options)
    options.delete()
    return server


def binding_path(server: b.TRITONSERVER_Server, x: np.ndarray) -> Callable[[], np.ndarray]:
    allocator = b.ArrayAllocator()

    def read(response: b.TRITONSERVER_InferenceResponse | None, flags: int, box: list[np.ndarray]) -> None:
        if response is not None:
            box.append(response.output_array(0))

    def infer() -> np.ndarray:
        request = b.TRITONSERVER_InferenceRequest(server, MODEL)
        request.add_input("INPUT__0", b.TRITONSERVER_DataType.FP32, x.shape)
        request.append_input_data("INPUT__0", x)
        box: list[np.ndarray] = []
        request.set_response_callback(allocator, None, read, box)
        server.infer_async(request).result(TIMEOUT_S)
        return box[0]

    return infer


class ShmGrpcPath:
    """tritonclient gRPC with the input and output in system shared memory registered once."""

    def __init__(self, address: str, x: np.ndarray) -> None:
        self.client = grpcclient.InferenceServerClient(address)
        self.x = x
        tag = uuid.uuid4().hex[:8]
        self.names = (f"bench_in_{tag}", f"bench_out_{tag}")
        self.regions = [shm.create_shared_memory_region(n, f"/{n}", x.nbytes) for n in self.names]
        for name in self.names:
            self.client.register_system_shared_memory(name, f"/{name}", x.nbytes)

    def __call__(self) -> np.ndarray:
        shm.set_shared_memory_region(self.regions[0], [self.x])
        request = grpcclient.InferInput("INPUT__0", list(self.x.shape), "FP32")
        request.set_shared_memory(self.names[0], self.x.nbytes)
        output = grpcclient.InferRequestedOutput("OUTPUT__0")
        output.set_shared_memory(self.names[1], self.x.nbytes)
        self.client.infer(MODEL, [request], outputs=[output], client_timeout=TIMEOUT_S)
        return np.array(shm.get_contents_as_numpy(self.regions[1], np.float32, self.x.shape))

    def close(self) -> None:
        for name in self.names:
            self.client.unregister_system_shared_memory(name)
        for region in self.regions:
            shm.destroy_shared_memory_region(region)
        self.client.close()


def plain_grpc_path(address: str, x: np.ndarray) -> Callable[[], np.ndarray]:
    client = grpcclient.InferenceServerClient(address)

    def infer() -> np.ndarray:
        request = grpcclient.InferInput("INPUT__0", list(x.shape), "FP32")
        request.set_data_from_numpy(x)
        return client.infer(MODEL, [request], client_timeout=TIMEOUT_S).as_numpy("OUTPUT__0")

    return infer


def timed_ms(fn: Callable[[], np.ndarray], repeats: int, expected: np.ndarray) -> list[float]:
    if not np.array_equal(fn(), expected):  # warm-up, and the path must be exact
        raise RuntimeError("a path returned a wrong result")
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        times.append((time.perf_counter() - start) * 1000)
    return times


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--repeats", type=int, default=40)
    parser.add_argument("--sizes", type=int, nargs="+", default=[64, 128])
    parser.add_argument("--plain-grpc", action="store_true", help="also time gRPC without shared memory")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="bench_binding_") as folder:
        repo = triton_models.passthrough(Path(folder) / "repo", MODEL, dims=(-1, -1, -1, -1, -1))
        server = start_inprocess(repo, Path(folder) / "backends")
        try:
            with LocalTritonServer(repo) as local:
                rows = run(server, local.grpc_address, args)
        finally:
            server.delete()
    print_table(rows)


def run(server: b.TRITONSERVER_Server, address: str, args: argparse.Namespace) -> dict[tuple[int, str], list[float]]:
    rng = np.random.default_rng(0)
    inputs = {n: rng.standard_normal((1, 1, n, n, n)).astype(np.float32) for n in args.sizes}
    paths: dict[int, dict[str, Callable[[], np.ndarray]]] = {}
    closers = []
    for n, x in inputs.items():
        grpc_shm = ShmGrpcPath(address, x)
        closers.append(grpc_shm.close)
        paths[n] = {"binding (in-process)": binding_path(server, x), "tritonclient gRPC + system shm": grpc_shm}
        if args.plain_grpc:
            paths[n]["tritonclient gRPC"] = plain_grpc_path(address, x)
    times: dict[tuple[int, str], list[float]] = {}
    try:
        for round_ in range(args.rounds):
            for n, by_name in paths.items():
                for name, fn in by_name.items():
                    times.setdefault((n, name), []).extend(timed_ms(fn, args.repeats, inputs[n]))
            print(f"round {round_ + 1}/{args.rounds} done", file=sys.stderr)
    finally:
        for close in closers:
            close()
    return times


def print_table(times: dict[tuple[int, str], list[float]]) -> None:
    print("| input | path | median ms | x binding |")
    print("|---|---|---:|---:|")
    for n in sorted({n for n, _ in times}):
        base = statistics.median(times[(n, "binding (in-process)")])
        for (size, name), values in times.items():
            if size == n:
                median = statistics.median(values)
                print(f"| 1x1x{n}^3 | {name} | {median:.2f} | {median / base:.2f} |")


if __name__ == "__main__":
    main()
