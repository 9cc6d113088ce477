"""``onnx`` against ``torch`` on the CPU, side by side in one run: time per window and per study.

Models: the sample app's UNet (the committed TorchScript, and its ONNX export by
``apps/brain_tissue_seg/export_onnx.py``), and a zoo-sized UNet (the spleen bundle's layout: channels 16-256,
four stride-2 steps, two residual units, batch norm; random weights) at 96^3 and 128^3 windows. Each case runs
through the backends as an app does (``create_backend``): ``torch`` (TorchScript) and ``onnx`` with each
ONNX Runtime setting under test: ``onnx-plain`` is the exporter's graph as it is (``rewrite_graph=false``, the
entry's file not rewritten either), ``onnx`` the default (the rewrites of ``repository/onnx_rewrite.py``:
PReLU with one slope as LeakyRelu, fused into the convolution; the sample's ``export_onnx.py`` also has its
instance norms take their statistics in float64), ``onnx-norm32`` the sample without that instance norm rewrite
(ONNX Runtime's float32 statistics; for the zoo UNet, which has none, the same graph as ``onnx``), and for
a sw batch above 1 ``onnx-split`` the same session fed one window per request. Threads are pinned the same for
both (``torch.set_num_threads`` and
``intra_op_threads``). Rounds are interleaved: each round times every path once, the order rotated, so a slow
spell on a shared machine hits every path alike. Prints medians (ms) and each path's ratio to ``torch``; with
``--profile``, where ONNX Runtime spends a window's time, by operator type (the exporter's graph and the
rewritten one).

    .venv/bin/python benchmarks/bench_onnx.py [--rounds 5] [--threads 2] [--study 160 160 160] [--profile]
        [--settings onnx-plain onnx onnx-extended onnx-spin] [--cases sample:96x4 zoo:128x1 ...]
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
import warnings
from collections import Counter
from collections.abc import Callable
from pathlib import Path

import numpy as np
import torch
from monai.inferers import sliding_window_inference
from monai.networks.layers import Norm
from monai.networks.nets import UNet

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "apps" / "brain_tissue_seg"))
warnings.filterwarnings("ignore")

from export_onnx import MODEL, export_onnx  # noqa: E402

from monai_triton_ops import create_backend  # noqa: E402
from monai_triton_ops.backends.base import BaseBackend  # noqa: E402
from monai_triton_ops.pipeline import Predictor  # noqa: E402
from monai_triton_ops.repository.builder import build_repository  # noqa: E402
from monai_triton_ops.repository.onnx_rewrite import rewrite_file  # noqa: E402

#: ONNX Runtime settings compared, besides ``torch``: label -> (repository entry suffix, backend options).
#: ``_plain`` entries hold the exporter's graph as it is (``repo build`` would rewrite it).
SETTINGS = {
    "onnx-plain": ("_plain", "rewrite_graph=false"),
    "onnx-norm32": ("_norm32", "rewrite_graph=false"),
    "onnx": ("", ""),
    "onnx-extended": ("", "graph_optimization=extended"),
    "onnx-spin": ("", "spin=true"),
}
DEFAULT_SETTINGS = ["onnx-plain", "onnx"]


#: (model, window size, sw batch) cases, as ``--cases`` names them: ``sample:96x4``.
CASES = [("sample", 96, 1), ("sample", 96, 4), ("zoo", 96, 1), ("zoo", 96, 4), ("zoo", 128, 1), ("zoo", 128, 4)]


def zoo_unet() -> torch.nn.Module:
    torch.manual_seed(0)
    return UNet(3, 1, 2, channels=(16, 32, 64, 128, 256), strides=(2, 2, 2, 2), num_res_units=2, norm=Norm.BATCH)


def repositories(scratch: Path) -> dict[str, Path]:
    """Per model, a repository holding it as TorchScript (``<name>_ts``), as ONNX rewritten (``<name>``), as
    the exporter wrote it (``<name>_plain``), and rewritten but for the instance norms (``<name>_norm32``)."""
    from monai.data import save_net_with_metadata

    repo = scratch / "repo"
    build_repository(MODEL, repo, "sample_ts")
    build_repository(export_onnx(scratch / "sample.onnx"), repo, "sample")
    plain_entry(export_onnx(scratch / "sample_plain.onnx", rewrite=False), repo, "sample_plain")
    plain_entry(export_onnx(scratch / "sample_norm32.onnx", norm_in_float64=False), repo, "sample_norm32")
    zoo = zoo_unet().eval()
    scripted = torch.jit.script(zoo)
    meta = {"network_data_format": {"inputs": {"image": {"num_channels": 1, "spatial_shape": ["16*n"] * 3,
            "dtype": "float32"}}, "outputs": {"pred": {"num_channels": 2, "spatial_shape": ["16*n"] * 3,
            "dtype": "float32"}}}}  # fmt: skip
    save_net_with_metadata(scripted, str(scratch / "zoo"), meta_values=meta)
    build_repository(scratch / "zoo.ts", repo, "zoo_ts")
    axes = {0: "b", 2: "d", 3: "h", 4: "w"}
    torch.onnx.export(
        zoo, (torch.zeros(1, 1, 64, 64, 64),), str(scratch / "zoo.onnx"), dynamo=False, opset_version=17,
        input_names=["x"], output_names=["OUTPUT__0"], dynamic_axes={"x": axes, "OUTPUT__0": axes},
    )  # fmt: skip
    build_repository(scratch / "zoo.onnx", repo, "zoo")
    plain_entry(scratch / "zoo.onnx", repo, "zoo_plain")
    rewrite_file(scratch / "zoo.onnx", scratch / "zoo_norm32.onnx", norm_in_float64=False)
    plain_entry(scratch / "zoo_norm32.onnx", repo, "zoo_norm32")
    return {"sample": repo, "zoo": repo}


def plain_entry(model: Path, repo: Path, name: str) -> None:
    """A repository entry whose ``model.onnx`` is ``model`` byte for byte (``repo build`` writes it rewritten)."""
    build_repository(model, repo, name)
    (repo / name / "1" / "model.onnx").write_bytes(model.read_bytes())


def interleaved_ms(paths: dict[str, Callable[[], object]], rounds: int) -> dict[str, list[float]]:
    for fn in paths.values():
        fn()  # first-call allocations and graph optimisation stay out of the figures
    labels = list(paths)
    times: dict[str, list[float]] = {label: [] for label in labels}
    for index in range(rounds):
        shift = index % len(labels)
        for label in labels[shift:] + labels[:shift]:
            start = time.perf_counter()
            paths[label]()
            times[label].append((time.perf_counter() - start) * 1000)
    return times


def case(backends: dict[str, BaseBackend], roi: int, sw_batch: int, study: tuple[int, ...], rounds: int) -> None:
    window = torch.from_numpy(np.random.default_rng(0).standard_normal((sw_batch, 1, roi, roi, roi), np.float32))
    volume = torch.from_numpy(np.random.default_rng(1).standard_normal((1, 1, *study), np.float32))

    predictors: dict[str, Callable[[torch.Tensor], torch.Tensor]] = dict(backends)
    if sw_batch > 1 and "onnx" in backends:  # the sw batch cut into one-window requests
        predictors["onnx-split"] = Predictor(backends["onnx"], request_batch_size=1)

    def one_window(predictor: Callable[[torch.Tensor], torch.Tensor]) -> Callable[[], object]:
        return lambda: predictor(window)

    def one_study(predictor: Callable[[torch.Tensor], torch.Tensor]) -> Callable[[], object]:
        return lambda: sliding_window_inference(volume, (roi,) * 3, sw_batch, predictor, overlap=0.25)

    for what, make, per in (("window", one_window, sw_batch), ("study", one_study, 1)):
        times = interleaved_ms({label: make(p) for label, p in predictors.items()}, rounds)
        base = statistics.median(times["torch"]) / per
        cells = [f"{label} {statistics.median(t) / per:8.1f} ms ({statistics.median(t) / per / base:.2f}x)"
                 for label, t in times.items()]  # fmt: skip
        print(f"  {roi}^3 x{sw_batch} per {what:<6}  " + "   ".join(cells), flush=True)


def profile(repo: Path, name: str, roi: int, threads: int) -> None:
    """Where ONNX Runtime spends one window: per operator type, share of the kernel time, and the total."""
    import onnxruntime

    settings = onnxruntime.SessionOptions()
    settings.intra_op_num_threads = threads
    settings.enable_profiling = True
    with tempfile.TemporaryDirectory() as folder:
        settings.profile_file_prefix = str(Path(folder) / "ort")
        session = onnxruntime.InferenceSession(str(repo / name / "1" / "model.onnx"), settings)
        x = np.random.default_rng(0).standard_normal((1, 1, roi, roi, roi), np.float32)
        for _ in range(3):
            session.run(None, {"x": x})
        events = json.loads(Path(session.end_profiling()).read_text())
    kernels: Counter[str] = Counter()
    for event in events:
        if event.get("cat") == "Node" and event["name"].endswith("_kernel_time"):
            kernels[event["args"]["op_name"]] += event["dur"]
    total = sum(kernels.values())
    shares = ", ".join(f"{op} {100 * us / total:.0f}%" for op, us in kernels.most_common(6))
    print(f"  {name} {roi}^3 ({total / 3000:.0f} ms of kernel time per window): {shares}")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--study", type=int, nargs=3, default=(160, 160, 160))
    parser.add_argument("--profile", action="store_true")
    parser.add_argument("--cases", nargs="*", default=[f"{n}:{r}x{b}" for n, r, b in CASES])
    parser.add_argument("--settings", nargs="*", default=DEFAULT_SETTINGS, choices=list(SETTINGS))
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    cases = [c for c in CASES if f"{c[0]}:{c[1]}x{c[2]}" in args.cases]
    with tempfile.TemporaryDirectory(prefix="bench-onnx-") as scratch:
        repos = repositories(Path(scratch))
        print(f"threads {args.threads}, study {args.study}, {args.rounds} interleaved rounds, medians")
        for name, roi, sw_batch in cases:
            print(f"{name}:")
            specs = {"torch": ("_ts", "torch")} | {
                k: (SETTINGS[k][0], f"onnx?intra_op_threads={args.threads}&{SETTINGS[k][1]}") for k in args.settings
            }
            backends = {
                label: create_backend(spec, name + suffix, model_repository=repos[name], max_in_flight=1).open()
                for label, (suffix, spec) in specs.items()
            }
            try:
                case(backends, roi, sw_batch, tuple(args.study), args.rounds)
            finally:
                for backend in backends.values():
                    backend.close()
        if args.profile:
            print("where ONNX Runtime spends a window (kernel time by operator type):")
            for name, roi in (("sample", 96), ("zoo", 96), ("zoo", 128)):
                for entry in (f"{name}_plain", name):
                    profile(repos[name], entry, roi, args.threads)
    return 0


if __name__ == "__main__":
    sys.exit(main())
