"""Open/close soak: one process runs study after study, opening and closing its backend every few studies with
requests in flight at every close, and counts what it holds after each cycle.

A REST-wrapped App SDK app, or a program embedding a backend, runs for days: whatever a cycle leaves behind adds up.
Per backend (``torch``, ``triton``, ``grpc`` and ``http`` with system shared memory; the remote ones against a local
``tritonserver`` this script starts once), each cycle opens the backend, runs ``--cycle`` studies of the sample
model (``model_repository/brain_tissue_seg``, a sliding window over a seeded random volume of ``--size``^3), submits
``--in-flight`` more windows and closes with them still running (``close(timeout_s=--close-timeout)``), then counts:

    threads (this process's tasks), fds, /dev/shm files (named for this process, or mapped by it or a descendant),
    descendant processes, entries of the process's own temp folder (TMPDIR, set at start for every child), RSS

At the end, per backend: whether each count is back to (or below) its value after the first cycle (RSS within
``--rss-mb``), and that no study was lost (raised) or wrong (labels unlike the first study's). Exit status 1 otherwise.

    .venv/bin/python benchmarks/soak.py [--backends torch triton grpc http] [--studies 300] [--cycle 10]
        [--size 64] [--roi 32] [--in-flight 4] [--close-timeout 0] [--json FILE]
"""

from __future__ import annotations

import os

os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

import argparse
import json
import shutil
import sys
import tempfile
import time
from collections.abc import Iterator
from concurrent.futures import Future, wait
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from monai_triton_ops.console import configure, prepare_process  # noqa: E402

prepare_process(restart=True)  # Holoscan's 32 MiB stacks, before MONAI imports it, as every entry point does
configure("WARN")

from benchmarks.proc_table import descendants  # noqa: E402
from monai_triton_ops import create_backend  # noqa: E402
from monai_triton_ops.pipeline import InferenceSettings, run_inference  # noqa: E402
from monai_triton_ops.server import LocalTritonServer  # noqa: E402

MODEL = "brain_tissue_seg"
BACKENDS = ("torch", "triton", "grpc", "http")
#: The counts that must be back at (or below) their value after the first cycle.
EXACT = ("threads", "fds", "shm", "children", "temp")


@dataclass(frozen=True)
class Census:
    """What the process holds now."""

    threads: int
    fds: int
    shm: int
    children: int
    temp: int
    rss_mb: float

    @classmethod
    def take(cls, temp: Path) -> Census:
        me = os.getpid()
        family = [me, *descendants(me)]
        return cls(
            threads=len(os.listdir("/proc/self/task")),
            fds=len(os.listdir("/proc/self/fd")),
            shm=len(shm_files(family)),
            children=len(family) - 1,
            temp=len(os.listdir(temp)),
            rss_mb=_rss_mb(),
        )


#: Where POSIX shared memory lives (read only here: counted, never created).
SHM_DIR = Path("/dev") / "shm"


def shm_files(family: list[int]) -> set[str]:
    """Shared-memory files named for this process (``monai_triton_<pid>_...``) or mapped by it or a descendant
    (Triton's Python-backend regions of an in-process server, its stubs)."""
    me = os.getpid()
    named = {str(SHM_DIR / name) for name in os.listdir(SHM_DIR) if f"_{me}_" in name}
    for pid in family:
        try:
            lines = Path(f"/proc/{pid}/maps").read_text().splitlines()
        except OSError:
            continue
        named.update(line.split(None, 5)[5] for line in lines if f" {SHM_DIR}/" in line)
    return {name.removesuffix(" (deleted)") for name in named}


def _rss_mb() -> float:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return 0.0


@dataclass
class Soak:
    """One backend's run: a census after each cycle, and the studies that were lost or wrong."""

    backend: str
    censuses: list[Census] = field(default_factory=list)
    studies: int = 0
    lost: list[str] = field(default_factory=list)
    wrong: int = 0
    cut_off: int = 0  # requests in flight at a close that it ended (BackendStateError), as it should
    unfinished: int = 0  # requests in flight at a close whose future was not done after close(): must be 0
    seconds: float = 0.0

    def leaks(self, rss_mb: float) -> list[str]:
        """What is above its count after the first cycle at the end (RSS: more than ``rss_mb`` above it)."""
        if len(self.censuses) < 2:
            return []
        first, last = self.censuses[0], self.censuses[-1]
        grown = [name for name in EXACT if getattr(last, name) > getattr(first, name)]
        found = [f"{name} {getattr(first, name)} -> {getattr(last, name)}" for name in grown]
        if last.rss_mb - first.rss_mb > rss_mb:
            found.append(f"rss {first.rss_mb:.0f} -> {last.rss_mb:.0f} MB")
        return found


def spec_of(backend: str, server: LocalTritonServer | None) -> str:
    if backend in ("torch", "triton"):
        return backend
    if server is None:
        raise ValueError(f"the {backend} backend needs the local server")
    url = server.grpc_url if backend == "grpc" else server.http_url
    return f"{url}?shared_memory=system"


def soak(backend: str, args: argparse.Namespace, repo: Path, server: LocalTritonServer | None, temp: Path) -> Soak:
    """``args.studies`` studies in cycles of ``args.cycle``; a census after each cycle."""
    rng = np.random.default_rng(0)
    volume = rng.standard_normal((1, args.size, args.size, args.size)).astype(np.float32)
    window = rng.standard_normal((1, 1, args.roi, args.roi, args.roi)).astype(np.float32)
    settings = InferenceSettings(roi_size=(args.roi,) * 3, sw_batch_size=2)
    result, first = Soak(backend), None
    started = time.monotonic()
    while result.studies < args.studies:
        local = repo if backend in ("torch", "triton") else None
        model = create_backend(spec_of(backend, server), MODEL, model_repository=local).open()
        for _ in range(min(args.cycle, args.studies - result.studies)):
            result.studies += 1
            try:
                labels = run_inference(volume, model, settings).argmax(0).numpy()
            except Exception as exc:  # a lost study: counted and named, the soak goes on
                result.lost.append(f"study {result.studies}: {exc!r}")
                continue
            first = labels if first is None else first
            result.wrong += int(not np.array_equal(labels, first))
        pending = [model.submit({"x": window}) for _ in range(args.in_flight)]
        model.close(timeout_s=args.close_timeout)
        _settle(pending, result)
        del model, pending
        result.censuses.append(settled_census(temp, result.censuses[0] if result.censuses else None))
        print(f"{backend:6} {result.studies:4d} studies  {_row(result.censuses[-1])}", flush=True)
    result.seconds = time.monotonic() - started
    return result


def settled_census(temp: Path, first: Census | None, timeout_s: float = 10.0) -> Census:
    """A census once no count is above the first cycle's, else the last one after ``timeout_s``.

    A closed backend's worker thread may still be on its way out when close() has returned (its request is
    answered, the thread not yet gone): a leak stays past the wait and is counted; a thread ending is not.
    """
    deadline = time.monotonic() + timeout_s
    while True:
        census = Census.take(temp)
        grown = first is not None and any(getattr(census, name) > getattr(first, name) for name in EXACT)
        if not grown or time.monotonic() >= deadline:
            return census
        time.sleep(0.2)


def _settle(pending: list[Future[Any]], result: Soak) -> None:
    """Every request in flight at the close has ended by the time close() returns (answered or cut off)."""
    result.unfinished += sum(not future.done() for future in pending)
    wait(pending, timeout=30)
    result.cut_off += sum(future.done() and future.exception() is not None for future in pending)


def _row(census: Census) -> str:
    counts = "  ".join(f"{name} {getattr(census, name)}" for name in EXACT)
    return f"{counts}  rss {census.rss_mb:.0f} MB"


@contextmanager
def own_temp() -> Iterator[Path]:
    """A temp folder for this process and every child it starts (TMPDIR), so that what is left there is ours."""
    folder = Path(tempfile.mkdtemp(prefix="soak-"))
    os.environ["TMPDIR"] = str(folder)
    tempfile.tempdir = str(folder)
    try:
        yield folder
    finally:
        shutil.rmtree(folder, ignore_errors=True)


def summary(results: list[Soak], rss_mb: float) -> tuple[str, bool]:
    """One line per backend and whether all held."""
    lines, held = [], True
    for r in results:
        leaks, first, last = r.leaks(rss_mb), r.censuses[0], r.censuses[-1]
        ok = not leaks and not r.lost and not r.wrong and not r.unfinished
        held = held and ok
        lines.append(
            f"{r.backend:6} {r.studies} studies in {r.seconds:.0f} s: lost {len(r.lost)}, wrong {r.wrong}, "
            f"in flight at close {r.cut_off} cut off / {r.unfinished} unfinished; after cycle 1 {_row(first)}; "
            f"at the end {_row(last)}: {'flat' if ok else 'NOT flat: ' + ', '.join(leaks)}"
        )
        lines.extend(f"       {text}" for text in r.lost[:3])
    return "\n".join(lines), held


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("--backends", nargs="+", choices=BACKENDS, default=list(BACKENDS))
    parser.add_argument("--studies", type=int, default=300, help="studies per backend")
    parser.add_argument("--cycle", type=int, default=10, help="studies per open/close cycle")
    parser.add_argument("--size", type=int, default=64, help="edge of the cubic volume, voxels")
    parser.add_argument("--roi", type=int, default=32, help="edge of the sliding window, voxels")
    parser.add_argument("--in-flight", type=int, default=4, help="windows submitted just before each close")
    parser.add_argument("--close-timeout", type=float, default=0.0, help="close(timeout_s=...), seconds")
    parser.add_argument("--rss-mb", type=float, default=50.0, help="RSS growth allowed after the first cycle")
    parser.add_argument("--json", type=Path, help="also write the censuses and verdicts here")
    args = parser.parse_args(argv)
    with own_temp() as temp:
        ignore = shutil.ignore_patterns("__pycache__")
        repo = Path(shutil.copytree(ROOT / "model_repository", temp / "repository", ignore=ignore))
        results = []
        server = None
        try:
            if set(args.backends) & {"grpc", "http"}:
                server = LocalTritonServer(repo, startup_timeout_s=180.0).start()
            for backend in args.backends:
                results.append(soak(backend, args, repo, server, temp))
        finally:
            if server is not None:
                server.stop()
    text, held = summary(results, args.rss_mb)
    print(text)
    if args.json:
        args.json.write_text(json.dumps([{**asdict(r), "leaks": r.leaks(args.rss_mb)} for r in results], indent=1))
    return 0 if held else 1


if __name__ == "__main__":
    sys.exit(main())
