"""A MONAI Bundle on every backend beside the App SDK's own ``MonaiBundleInferenceOperator``, in one run.

One 3D UNet bundle in the model zoo's layout (sliding window in gaussian mode, ``Orientationd``, ``Spacingd``,
``Invertd``), one CT-like image; each round runs every path once (the order rotating round by round) through
the operator's ``compute()`` as Holoscan calls it: the App SDK operator (TorchScript in process), and
``InferenceOperator`` on ``torch``, ``triton`` (in process), ``grpc://`` and ``http://`` (a local
``tritonserver`` serving what ``repo build`` made of the bundle). Every operator is opened once before the
rounds (models loaded, servers started), as in an app; the first round is a warm-up and not counted. Prints the
median per image in seconds and the ratio to the App SDK operator, and checks the labels agree.

    .venv/bin/python benchmarks/bench_bundle.py [--rounds 10] [--size 96 96 64] [--channels 8 16 32]
    .venv/bin/python benchmarks/bench_bundle.py --kind classification [--rounds 10] [--image-size 224]
    .venv/bin/python benchmarks/bench_bundle.py --kind detection [--rounds 10]

``--kind classification``: a 2D classification bundle against the bundle run by MONAI alone (``bench_classify.py``);
``--kind detection``: a RetinaNet detection bundle against the bundle run by MONAI alone (``bench_detect.py``).
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from monai.deploy.core import AppContext, Application, Image, IOType  # noqa: E402
from monai.deploy.operators.monai_bundle_inference_operator import (  # noqa: E402
    IOMapping,
    MonaiBundleInferenceOperator,
)

from monai_triton_ops import InferenceOperator  # noqa: E402
from monai_triton_ops.repository.bundle import build_bundle  # noqa: E402
from monai_triton_ops.server import LocalTritonServer  # noqa: E402
from tests.bundles.makers import UNET_DEF, ct_image, unet_bundle  # noqa: E402
from tests.operators.test_bundle import Ports  # noqa: E402

MAPPING: dict[str, Any] = {
    "input_mapping": [IOMapping("image", Image, IOType.IN_MEMORY)],
    "output_mapping": [IOMapping("pred", Image, IOType.IN_MEMORY)],
}


def parse() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=10, help="counted rounds (after one warm-up)")
    parser.add_argument("--size", type=int, nargs=3, default=[96, 96, 64], metavar=("D", "H", "W"))
    parser.add_argument("--channels", type=int, nargs="+", default=[8, 16, 32])
    parser.add_argument("--roi", type=int, default=48, help="sliding-window size (cubic)")
    parser.add_argument("--kind", choices=["segmentation", "classification", "detection"], default="segmentation")
    parser.add_argument("--image-size", type=int, default=224, help="classification: the network's input size")
    return parser.parse_args()


def runner(op: Any, image: Image) -> Callable[[], np.ndarray]:
    def run() -> np.ndarray:
        ports = Ports({"image": image})
        op.compute(ports, ports, None)
        return np.asarray(ports.emitted["pred"].asnumpy())

    return run


def main() -> None:
    args = parse()
    if args.kind == "classification":
        from benchmarks.bench_classify import main as classification

        classification(args)
        return
    if args.kind == "detection":
        from benchmarks.bench_detect import main as detection

        detection(args)
        return
    folder = Path(tempfile.mkdtemp(prefix="bench-bundle-"))
    os.environ.setdefault("MONAI_TRITON_CACHE", str(folder / "cache"))
    network = {**UNET_DEF, "channels": args.channels, "strides": [2] * (len(args.channels) - 1)}
    inferer = {"_target_": "SlidingWindowInferer", "roi_size": [args.roi] * 3, "sw_batch_size": 4,
               "overlap": 0.25, "mode": "gaussian"}  # fmt: skip
    bundle = unet_bundle(folder / "bundle", "ts", network_def=network, inferer=inferer)
    build_bundle(bundle, folder / "repo")
    image = ct_image(tuple(args.size))
    app = Application()
    with LocalTritonServer(folder / "repo", startup_timeout_s=300.0) as server:
        reference = MonaiBundleInferenceOperator(app, app_context=AppContext({}), bundle_path=bundle, **MAPPING)
        ours = {
            spec: InferenceOperator(app, bundle_path=bundle, backend=url, **MAPPING)
            for spec, url in (("torch", "torch"), ("triton", "triton"), ("grpc", server.grpc_url),
                              ("http", server.http_url))
        }  # fmt: skip
        for op in ours.values():
            op.start()
        paths = {"App SDK operator": runner(reference, image), **{k: runner(op, image) for k, op in ours.items()}}
        times: dict[str, list[float]] = {label: [] for label in paths}
        labels: dict[str, np.ndarray] = {}
        for round_ in range(args.rounds + 1):
            order = list(paths)[round_ % len(paths) :] + list(paths)[: round_ % len(paths)]
            for label in order:
                start = time.perf_counter()
                labels[label] = paths[label]()
                if round_:
                    times[label].append(time.perf_counter() - start)
        for op in ours.values():
            op.stop()
    first = statistics.median(times["App SDK operator"])
    want = labels["App SDK operator"]
    load = os.getloadavg()[0]
    print(f"image {tuple(args.size)} (D, H, W), UNet channels {args.channels}, roi {args.roi}^3, {args.rounds} "
          f"interleaved rounds after 1 warm-up, {os.cpu_count()} CPUs, load {load:.2f}\n")  # fmt: skip
    print("| path | median s per image | ratio to the App SDK operator | voxels different |\n|---|---:|---:|---:|")
    for label, values in times.items():
        different = int(np.count_nonzero(labels[label] != want))
        print(f"| {label} | {statistics.median(values):.3f} | {statistics.median(values) / first:.3f} | {different} |")


if __name__ == "__main__":
    main()
