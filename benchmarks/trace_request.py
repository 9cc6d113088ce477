"""What one remote request runs: the package's functions called, and their modules, on every thread.

    .venv/bin/python benchmarks/trace_request.py [--baseline DIR]

One identity model on a real local tritonserver; for each path (gRPC and HTTP, with and without system shared
memory; ``infer()`` and ``submit().result()``) one warm request is traced with ``sys.setprofile`` on every thread
(``threading.setprofile`` for the pools' threads): each Python call of a function of the package counts once, and the
modules it belongs to are listed. ``--baseline DIR`` (a ``git archive REV monai_triton_ops | tar -x -C DIR`` tree)
traces that commit's remote backend in the same run, beside this one.
"""

from __future__ import annotations

import argparse
import importlib
import shutil
import sys
import tempfile
import threading
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from types import FrameType
from typing import Any

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from monai_triton_ops.server import LocalTritonServer  # noqa: E402
from tests import triton_models  # noqa: E402

PATHS = {
    "gRPC, shm": ("grpc", "system"),
    "gRPC, body": ("grpc", "none"),
    "HTTP, shm": ("http", "system"),
    "HTTP, body": ("http", "none"),
}


class Tracer:
    """Counts calls of ``package``'s functions while ``active``; installed on every thread started after
    ``install()`` (the backends' pools) and on the calling thread during ``run``."""

    def __init__(self, package: str) -> None:
        self.package = package
        self.active = False
        self.calls: Counter[tuple[str, str]] = Counter()
        self._lock = threading.Lock()

    def install(self) -> None:
        threading.setprofile(self)

    def __call__(self, frame: FrameType, event: str, arg: object) -> None:
        if event != "call" or not self.active:
            return
        module = frame.f_globals.get("__name__", "")
        if module == self.package or module.startswith(self.package + "."):
            with self._lock:
                self.calls[(module, frame.f_code.co_qualname)] += 1

    def run(self, call: Callable[[], Any]) -> Counter[tuple[str, str]]:
        """Every call of a function of the package while ``call`` runs, on any traced thread."""
        self.calls = Counter()
        sys.setprofile(self)
        self.active = True
        try:
            call()
        finally:
            self.active = False
            sys.setprofile(None)
        return self.calls


def backend_class(package: str) -> tuple[Any, Any]:
    return (
        importlib.import_module(f"{package}.backends.remote.backend").RemoteBackend,
        importlib.import_module(f"{package}.backends.remote.options").RemoteOptions,
    )


def trace_paths(server: LocalTritonServer, package: str) -> list[tuple[str, str, int, int, list[str]]]:
    """(path, call, calls, functions, modules) for each path and each of infer() and submit().result()."""
    backend_type, options_type = backend_class(package)
    tracer = Tracer(package)
    tracer.install()
    x = np.ones((1, 1, 32, 32, 32), np.float32)
    rows = []
    for label, (scheme, shm) in PATHS.items():
        url = server.grpc_url if scheme == "grpc" else server.http_url
        backend = backend_type("identity", urls=(url,), options=options_type(shared_memory=shm, timeout_s=60.0))
        backend.open()
        try:
            for how, run in (
                ("infer()", lambda b=backend: b.infer({"INPUT__0": x})),
                ("submit().result()", lambda b=backend: b.submit({"INPUT__0": x}).result()),
            ):
                for _ in range(3):
                    run()  # warm: slots made, builders cached, the pool's threads started
                calls = tracer.run(run)
                modules = sorted({module.removeprefix(package + ".") for module, _ in calls})
                rows.append((label, how, sum(calls.values()), len(calls), modules))
        finally:
            backend.close()
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--baseline", type=Path, help="another commit's tree: its remote backend traced beside")
    parser.add_argument("--modules", action="store_true", help="list each row's modules")
    args = parser.parse_args()
    packages = ["monai_triton_ops"]
    if args.baseline is not None:
        folder = Path(tempfile.mkdtemp(prefix="trace-baseline-"))
        shutil.copytree(args.baseline / "monai_triton_ops", folder / "mto_baseline")
        sys.path.insert(0, str(folder))
        packages.append("mto_baseline")
    repo = Path(tempfile.mkdtemp(prefix="trace-request-")) / "repo"
    triton_models.identity(repo, "identity")
    with LocalTritonServer(repo) as server:
        print("| tree | path | call | calls | functions | modules |")
        print("|---|---|---|---:|---:|---:|")
        for package in packages:
            tree = "this" if package == "monai_triton_ops" else "baseline"
            for label, how, calls, functions, modules in trace_paths(server, package):
                listed = f" ({', '.join(modules)})" if args.modules else ""
                print(f"| {tree} | {label} | {how} | {calls} | {functions} | {len(modules)}{listed} |")
    shutil.rmtree(repo.parent, ignore_errors=True)


if __name__ == "__main__":
    main()
