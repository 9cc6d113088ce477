"""The remote and in-process Triton backends against every other way to reach a model, in one run, interleaved.

W1, transport: an identity model (Python backend, DLPack) on 1x1xN^3 float32, per request:
    direct TorchScript (in-process identity), raw tritonclient HTTP binary, raw gRPC, raw gRPC + system
    shared memory (hand-written: one region, registered once, output read as a view), the App SDK's
    TritonRemoteModel (JSON over HTTP), the remote backend over gRPC, HTTP and auto (system shm), and the
    in-process ``triton`` backend on the same model files.
W2, the sample app: sliding window over the full MNI T1 (the app's own settings from the model metadata):
    in-process TorchScript vs the remote backend with max_in_flight 1 and 4 and the in-process ``triton``
    backend, on the committed repository.

A path is one entry of ``W1_PATHS`` / ``W2_PATHS``: a function taking the run's ``Bench`` and returning
``(call, close)``; another backend (the in-process ``triton`` one, say) joins with one more entry.

    .venv/bin/python benchmarks/bench_remote.py [--rounds 7] [--repeats 5] [--sizes 64 128 160] [--w2-rounds 3]
        [--paths LABEL ...] [--baseline DIR]

``--baseline DIR`` puts another commit's remote backend in the same run (``git archive REV monai_triton_ops |
tar -x -C DIR``; auto over both protocols, and ``shared_memory=none`` over both), so a change to the request path
is measured side by side with what it replaced.
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
    identity_repo: Path
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
    "in-process triton backend": lambda b: _backend("triton", "identity", model_repository=b.identity_repo),
}


def baseline_paths(tree: Path) -> dict[str, Path_]:
    """The remote backend of another commit, side by side with this one in the same run.

    Its package is copied under another name (``mto_baseline``; the package imports itself relatively) and its
    ``RemoteBackend`` is made directly, past the registry, whose targets name this checkout's modules.
    """
    import importlib
    import shutil

    folder = Path(tempfile.mkdtemp(prefix="bench-baseline-"))
    shutil.copytree(tree / "monai_triton_ops", folder / "mto_baseline")
    sys.path.insert(0, str(folder))
    backend = importlib.import_module("mto_baseline.backends.remote.backend")
    options = importlib.import_module("mto_baseline.backends.remote.options")

    def make(url: Callable[[Bench], str], memory: str = "auto") -> Path_:
        def open_(bench: Bench) -> tuple[Call, Callable[[], None]]:
            settings = options.RemoteOptions(timeout_s=TIMEOUT_S, shared_memory=memory)
            model = backend.RemoteBackend("identity", urls=(url(bench),), options=settings)
            model.open()
            return (lambda x: model.infer({"INPUT__0": x})), model.close

        return open_

    return {
        "baseline auto (gRPC, shm)": make(lambda b: b.identity.grpc_url),
        "baseline auto (HTTP, shm)": make(lambda b: b.identity.http_url),
        "baseline gRPC": make(lambda b: b.identity.grpc_url, "none"),
        "baseline HTTP": make(lambda b: b.identity.http_url, "none"),
    }


# -- W2 paths -------------------------------------------------------------------------------------
def _sample_run(spec: str, **options: Any) -> Path_:
    def make(bench: Bench) -> tuple[Call, Callable[[], None]]:
        from transforms import post_transforms, pre_transforms

        if spec in ("torch", "triton"):
            backend = create_backend(spec, SAMPLE, model_repository=REPO, timeout_s=TIMEOUT_S, **options).open()
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
    "in-process triton backend, max_in_flight 1": _sample_run("triton", max_in_flight=1),
    "in-process triton backend, max_in_flight 4": _sample_run("triton", max_in_flight=4),
}


# -- running ----------------------------------------------------------------------------------------
#: Paths too slow to repeat within a round (seconds per call): timed once per round.
ONCE_PER_ROUND = frozenset({"App SDK TritonRemoteModel"})
Times = dict[str, list[list[float]]]  # label -> per round, the ms of each call
#: label -> per round, this process's CPU time per call in us (every thread; the server's processes not included)
Cpu = dict[str, list[float]]


def interleaved(paths: dict[str, Call], data: Any, rounds: int, repeats: int = 1) -> tuple[Times, Cpu]:
    """Every round runs each path in turn (``repeats`` calls each, once for the slow ones), after a warm-up.

    Besides each call's wall time, the client's CPU time per call: on a machine shared with other work the
    wall time swings with their load, the CPU a path costs the client much less.
    """
    for call in paths.values():
        call(data)
    times: Times = {label: [] for label in paths}
    cpu: Cpu = {label: [] for label in paths}
    for _ in range(rounds):
        for label, call in paths.items():
            calls = []
            cpu_start = time.process_time()
            for _ in range(1 if label in ONCE_PER_ROUND else repeats):
                start = time.perf_counter()
                call(data)
                calls.append((time.perf_counter() - start) * 1000)
            cpu[label].append((time.process_time() - cpu_start) * 1e6 / len(calls))
            times[label].append(calls)
    return times, cpu


def median(times: Times, label: str) -> float:
    return statistics.median(t for calls in times[label] for t in calls)


def round_ratios(times: Times, label: str, base: str) -> list[float]:
    """Per round: this path's median / the base's median in the same round (load hits both alike)."""
    rounds = zip(times[label], times[base], strict=True)
    return [statistics.median(a) / statistics.median(b) for a, b in rounds]


def ratio(times: Times, label: str, base: str) -> float:
    """Median over rounds of :func:`round_ratios`."""
    return statistics.median(round_ratios(times, label, base))


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
    parser.add_argument("--repeats", type=int, default=5, help="W1 calls per path per round (slow paths: 1)")
    parser.add_argument("--sizes", type=int, nargs="+", default=[64, 128, 160])
    parser.add_argument("--w2-rounds", type=int, default=3, help="0 skips W2")
    parser.add_argument("--paths", nargs="+", help="W1 paths to run (labels; default all)")
    parser.add_argument(
        "--baseline",
        type=Path,
        help="another commit's tree (git archive REV | tar -x -C DIR): its remote backend joins W1 as 'baseline'",
    )
    args = parser.parse_args()
    repo = Path(tempfile.mkdtemp(prefix="bench-remote-")) / "repo"
    triton_models.identity(repo, "identity")
    entries = {k: v for k, v in W1_PATHS.items() if not args.paths or k in args.paths}
    if args.baseline is not None:  # the baseline of each path run (`baseline X` beside `this backend X`)
        baseline = baseline_paths(args.baseline)
        entries.update({k: v for k, v in baseline.items() if k.replace("baseline", "this backend", 1) in entries})
    with LocalTritonServer(repo) as identity, LocalTritonServer(REPO) as sample:
        bench = Bench(identity, sample, max_bytes=4 * max(args.sizes) ** 3, identity_repo=repo)
        try:
            w1 = _open(entries, bench)
            rows = []
            for size in args.sizes:
                x = np.random.default_rng(0).standard_normal((1, 1, size, size, size)).astype(np.float32)
                rows.append((size, *interleaved(w1, x, args.rounds, args.repeats)))
            w2 = interleaved(_open(W2_PATHS, bench), _mni_image(), args.w2_rounds)[0] if args.w2_rounds else None
        finally:
            for close in bench.closers:
                close()
    report(rows, w2, args)


#: (path, base) pairs whose per-round ratios the issues' floors are about.
W1_RATIOS = [
    ("this backend auto (gRPC, shm)", "tritonclient gRPC + system shm"),
    ("this backend auto (HTTP, shm)", "tritonclient gRPC + system shm"),
    ("this backend gRPC", "tritonclient gRPC"),
    ("baseline auto (gRPC, shm)", "tritonclient gRPC + system shm"),
    ("baseline auto (HTTP, shm)", "tritonclient gRPC + system shm"),
    ("this backend auto (gRPC, shm)", "baseline auto (gRPC, shm)"),
    ("this backend auto (HTTP, shm)", "baseline auto (HTTP, shm)"),
    ("this backend HTTP", "tritonclient HTTP binary"),
    ("baseline gRPC", "tritonclient gRPC"),
    ("baseline HTTP", "tritonclient HTTP binary"),
    ("this backend gRPC", "baseline gRPC"),
    ("this backend HTTP", "baseline HTTP"),
    ("App SDK TritonRemoteModel", "this backend auto (gRPC, shm)"),
    ("in-process triton backend", "this backend auto (gRPC, shm)"),
    ("in-process triton backend", "this backend auto (HTTP, shm)"),
    ("in-process triton backend", "tritonclient gRPC + system shm"),
]


#: The path the client CPU table measures every other against.
CPU_BASE = "tritonclient gRPC + system shm"


def report(rows: list[tuple[int, Times, Cpu]], w2: Times | None, args: argparse.Namespace) -> None:
    print(f"torch {torch.__version__}, {os.cpu_count()} CPUs, load average {os.getloadavg()[0]:.2f} at the end")
    print(
        f"\nW1: median ms per request, {args.rounds} interleaved rounds of {args.repeats} calls per path "
        f"(1 for {', '.join(sorted(ONCE_PER_ROUND))}) after one warm-up\n"
    )
    labels = list(rows[0][1])
    print("| path | " + " | ".join(f"1x1x{size}^3" for size, _, _ in rows) + " |")
    print("|---|" + "---:|" * len(rows))
    for label in labels:
        print(f"| {label} | " + " | ".join(f"{median(times, label):.2f}" for _, times, _ in rows) + " |")
    pairs = [(a, b) for a, b in W1_RATIOS if a in labels and b in labels]
    if pairs:
        print("\nPer-round ratios (median over rounds of a / b in the same round):\n")
        print("| a | b | " + " | ".join(f"1x1x{size}^3" for size, _, _ in rows) + " |")
        print("|---|---|" + "---:|" * len(rows))
        for a, b in pairs:
            print(f"| {a} | {b} | " + " | ".join(f"{ratio(times, a, b):.2f}" for _, times, _ in rows) + " |")
        print("\nPer-round ratios of each round (a / b), the spread behind the medians above:\n")
        for size, times, _ in rows:
            for a, b in pairs:
                spread = " ".join(f"{x:.2f}" for x in round_ratios(times, a, b))
                print(f"- 1x1x{size}^3 {a} / {b}: {spread}")
    base = CPU_BASE if CPU_BASE in labels else labels[0]
    print("\nClient CPU per request, us (this process, every thread; median over rounds), and its excess over")
    print(f"{base} in the same round:\n")
    print("| path | " + " | ".join(f"1x1x{size}^3 | excess" for size, _, _ in rows) + " |")
    print("|---|" + "---:|---:|" * len(rows))
    for label in labels:
        cells = []
        for _, _, cpu in rows:
            excess = statistics.median(c - b for c, b in zip(cpu[label], cpu[base], strict=True))
            cells.append(f"{statistics.median(cpu[label]):.0f} | {excess:+.0f}")
        print(f"| {label} | " + " | ".join(cells) + " |")
    if w2 is None:
        return
    base = "in-process TorchScript"
    print(f"\nW2: sample app sliding window on the full MNI T1, {args.w2_rounds} interleaved rounds\n")
    print(f"| path | median s | x {base} (per round) |\n|---|---:|---:|")
    for label in w2:
        print(f"| {label} | {median(w2, label) / 1000:.2f} | {ratio(w2, label, base):.2f} |")


if __name__ == "__main__":
    main()
