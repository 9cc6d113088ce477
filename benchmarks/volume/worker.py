"""One link's side of ``bench_volume.py``: a local server and the client paths, driven over stdin/stdout.

Started by the driver once per case and link, inside the link's network namespace for the shaped link, so
the server and the client talk over that namespace's loopback. Commands are JSON lines on stdin, answers JSON
lines on stdout (everything else goes to stderr):

    {"do": "run", "path": LABEL}  ->  wall time, bytes the client sent and received (tensor payload), Triton's
                                      request counts of both models, bytes on the link (namespace only), labels'
                                      digest
    {"do": "probe"}               ->  a plain TCP stream's rate on this loopback
    {"do": "quit"}                ->  the server stops; the peak memory of the volume model's process
"""

from __future__ import annotations

import os

os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")  # client and server share the cores (docs/remote.md)

import argparse
import hashlib
import json
import shutil
import socket
import sys
import threading
import time
from collections.abc import Callable, Mapping
from concurrent.futures import Future
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "apps" / "brain_tissue_seg"))

from monai_triton_ops import create_backend  # noqa: E402
from monai_triton_ops.backends.base import BaseBackend  # noqa: E402
from monai_triton_ops.pipeline.run import InferenceSettings, run_inference  # noqa: E402
from monai_triton_ops.repository.builder import build_repository  # noqa: E402
from monai_triton_ops.repository.volume import volume_model_name, wrap_network  # noqa: E402
from monai_triton_ops.server import LocalTritonServer  # noqa: E402

TIMEOUT_S = 1800.0
SAMPLE = "brain_tissue_seg"
SYNTHETIC = "pointwise2"
#: (mode, shared_memory) of every path; the shaped link never uses shared memory (tensors cross the link).
PATHS: dict[str, tuple[str, str]] = {
    "window, shm": ("window", "system"),
    "window, gRPC body": ("window", "none"),
    "volume, shm": ("volume", "system"),
    "volume, gRPC body": ("volume", "none"),
}
LINK_PATHS = {
    "loopback": ("window, shm", "window, gRPC body", "volume, shm", "volume, gRPC body"),
    "1 Gbit/s": ("window, gRPC body", "volume, gRPC body"),
}


class Pointwise(torch.nn.Module):
    """Two classes from one channel, voxel by voxel (random weights): the synthetic case measures transfer,
    not compute, so its network costs next to nothing on a CPU."""

    def __init__(self) -> None:
        super().__init__()
        generator = torch.Generator().manual_seed(0)
        self.weight = torch.nn.Parameter(torch.randn(1, 2, 1, 1, 1, generator=generator))
        self.bias = torch.nn.Parameter(torch.randn(1, 2, 1, 1, 1, generator=generator))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x * self.weight + self.bias


@dataclass
class Case:
    """A network in a repository (with its ``_volume`` model), the input and what the app does around it."""

    network: str
    repo: Path
    image: torch.Tensor
    settings: Mapping[str, Any] = field(default_factory=dict)
    pre: Callable[[Any], Any] | None = None
    post: Callable[[Any], Any] | None = None


def sample_case(work: Path) -> Case:
    """The sample app's data flow on the full MNI T1: its transforms and settings, the committed model."""
    from atlas import load_t1
    from transforms import post_transforms, pre_transforms

    repo = work / "repo"
    shutil.copytree(ROOT / "model_repository" / SAMPLE, repo / SAMPLE)
    wrap_network(repo, SAMPLE)
    image = torch.as_tensor(load_t1().get_fdata(dtype=np.float32))[None]
    return Case(SAMPLE, repo, image, {"request_batch_size": 2}, pre_transforms(), post_transforms())


def synthetic_case(work: Path) -> Case:
    """512 x 512 x 300 float32 (315 MB), 96^3 windows at overlap 0.6, 2 classes: the issue's example."""
    from monai.data import save_net_with_metadata
    from monai.transforms import AsDiscrete, CastToType, Compose

    scripted = torch.jit.script(Pointwise().eval())
    tensor = {"num_channels": 1, "spatial_shape": ["*", "*", "*"], "dtype": "float32"}
    meta = {
        "network_data_format": {"inputs": {"image": tensor}, "outputs": {"pred": {**tensor, "num_channels": 2}}},
        "inference": {"roi_size": [96, 96, 96], "overlap": 0.6, "sw_batch_size": 4},
    }
    save_net_with_metadata(scripted, str(work / SYNTHETIC), meta_values=meta)
    repo = work / "repo"
    build_repository(work / f"{SYNTHETIC}.ts", repo, SYNTHETIC)
    wrap_network(repo, SYNTHETIC)
    image = torch.from_numpy(np.random.default_rng(0).standard_normal((1, 512, 512, 300), dtype=np.float32))
    return Case(SYNTHETIC, repo, image, post=Compose([AsDiscrete(argmax=True), CastToType(dtype=torch.uint8)]))


CASES = {"sample": sample_case, "512x512x300": synthetic_case}


class Counted:
    """The client's own count of what crosses the wire: the tensors of every request it sends and gets back."""

    def __init__(self, backend: BaseBackend) -> None:
        self.sent = self.received = self.requests = 0
        self._lock = threading.Lock()
        submit = backend.submit

        def counted(inputs: Mapping[str, Any], **keywords: Any) -> Future[dict[str, Any]]:
            with self._lock:
                self.sent += sum(_nbytes(v) for v in inputs.values())
                self.requests += 1
            future = submit(inputs, **keywords)
            future.add_done_callback(self._got)
            return future

        infer = backend.infer

        def counted_infer(inputs: Mapping[str, Any], **keywords: Any) -> dict[str, Any]:
            with self._lock:
                self.sent += sum(_nbytes(v) for v in inputs.values())
                self.requests += 1
            outputs = infer(inputs, **keywords)
            with self._lock:
                self.received += sum(_nbytes(v) for v in outputs.values())
            return outputs

        # the instance's own: the predictor submits, a one-request infer() may run on the caller's thread
        backend.submit = counted  # type: ignore[method-assign]
        backend.infer = counted_infer  # type: ignore[method-assign]

    def _got(self, future: Future[dict[str, Any]]) -> None:
        if not future.cancelled() and future.exception() is None:
            with self._lock:
                self.received += sum(_nbytes(v) for v in future.result().values())

    def reset(self) -> None:
        self.sent = self.received = self.requests = 0


def _nbytes(value: Any) -> int:
    return int(value.numel() * value.element_size()) if isinstance(value, torch.Tensor) else int(value.nbytes)


def link_bytes(link: str) -> int | None:
    """Bytes sent over this namespace's loopback (each byte once); ``None`` on the shared host loopback."""
    if link == "loopback":
        return None
    return int(Path("/sys/class/net/lo/statistics/tx_bytes").read_text())


def triton_counts(server: LocalTritonServer, network: str) -> dict[str, int]:
    """Successful requests of the network and of its volume model, as Triton counts them."""
    import tritonclient.grpc as grpcclient

    client = grpcclient.InferenceServerClient(server.grpc_address)
    try:
        counts = {}
        for key, name in (("network", network), ("volume", volume_model_name(network))):
            stats = client.get_inference_statistics(name, as_json=True, client_timeout=30)["model_stats"][0]
            counts[key] = int(stats.get("inference_stats", {}).get("success", {}).get("count", 0))
        return counts
    finally:
        client.close()


def settled_counts(server: LocalTritonServer, network: str) -> dict[str, int]:
    """Triton's counts once they stop moving (statistics lag the responses a little)."""
    last = triton_counts(server, network)
    for _ in range(50):
        time.sleep(0.1)
        now = triton_counts(server, network)
        if now == last:
            return now
        last = now
    return last


def peak_mb(model: str) -> float | None:
    """Peak resident memory (VmHWM) of the Python-backend process serving ``model``."""
    for proc in Path("/proc").iterdir():
        try:
            if proc.name.isdigit() and f"/{model}/1/model.py" in (proc / "cmdline").read_text():
                for line in (proc / "status").read_text().splitlines():
                    if line.startswith("VmHWM:"):
                        return int(line.split()[1]) / 1024
        except OSError:
            continue
    return None


def probe(size: int = 256 << 20) -> float:
    """Mbit/s of one plain TCP stream over 127.0.0.1 here (the link as a bulk transfer sees it)."""
    with socket.create_server(("127.0.0.1", 0)) as listener:
        port = listener.getsockname()[1]

        def drain() -> None:
            connection, _ = listener.accept()
            with connection:
                while connection.recv(1 << 20):
                    pass

        reader = threading.Thread(target=drain)
        reader.start()
        chunk = b"\0" * (1 << 20)
        start = time.perf_counter()
        with socket.create_connection(("127.0.0.1", port)) as sender:
            for _ in range(size >> 20):
                sender.sendall(chunk)
        reader.join()
        return size * 8 / (time.perf_counter() - start) / 1e6


def run(case: Case, server: LocalTritonServer, link: str, label: str, backend: BaseBackend, counter: Counted) -> dict:
    settings = InferenceSettings.from_metadata(backend.signature.metadata, **case.settings)
    counter.reset()
    before, wire = settled_counts(server, case.network), link_bytes(link)
    start = time.perf_counter()
    labels = run_inference(case.image, backend, settings, pre_transforms=case.pre, post_transforms=case.post)
    wall = time.perf_counter() - start
    after, wire_after = settled_counts(server, case.network), link_bytes(link)
    array = np.ascontiguousarray(torch.as_tensor(labels).numpy())
    return {
        "path": label,
        "wall_s": wall,
        "sent": counter.sent,
        "received": counter.received,
        "requests": counter.requests,
        "triton": {key: after[key] - before[key] for key in after},
        "link": None if wire is None or wire_after is None else wire_after - wire,
        "labels": hashlib.sha256(array.tobytes()).hexdigest()[:16],
        "classes": sorted(int(v) for v in np.unique(array)),
    }


def serve(case: Case, link: str) -> None:
    with LocalTritonServer(case.repo, startup_timeout_s=600.0) as server:
        backends, counters = {}, {}
        for label in LINK_PATHS[link]:
            mode, memory = PATHS[label]
            spec = f"{server.grpc_url}?mode={mode}&shared_memory={memory}&timeout_s={TIMEOUT_S}"
            backends[label] = create_backend(spec, case.network).open()
            counters[label] = Counted(backends[label])
        answer({"ready": list(backends), "image_bytes": _nbytes(case.image)})
        try:
            for line in sys.stdin:
                command = json.loads(line)
                if command["do"] == "quit":
                    break
                if command["do"] == "probe":
                    answer({"mbit_s": probe()})
                    continue
                label = command["path"]
                answer(run(case, server, link, label, backends[label], counters[label]))
        finally:
            for backend in backends.values():
                backend.close(timeout_s=30)
            stub_mb = peak_mb(volume_model_name(case.network))
    answer({"stub_peak_mb": stub_mb})


def answer(message: dict) -> None:
    print(json.dumps(message), flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--case", choices=sorted(CASES), required=True)
    parser.add_argument("--link", choices=sorted(LINK_PATHS), required=True)
    parser.add_argument("--work", type=Path, required=True)
    args = parser.parse_args()
    args.work.mkdir(parents=True, exist_ok=True)
    torch.set_num_threads(2)
    serve(CASES[args.case](args.work), args.link)


if __name__ == "__main__":
    main()
