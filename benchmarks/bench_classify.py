"""A classification bundle: ``InferenceOperator`` on every backend beside the bundle run by MONAI alone.

Called by ``bench_bundle.py --kind classification``. The bundle is the zoo's ``breast_density_classification``
in shape (``tests/bundles/classify.py``: ``LoadImaged``, ``EnsureChannelFirstd``, ``ScaleIntensityd``,
``Resized``; ``SimpleInferer``; ``Activationsd(sigmoid)``; class names A-D) with MONAI's ``DenseNet121`` (2D) at
``--size``. Per image, from the PNG file to the class scores: MONAI alone runs the bundle's own items as
``monai.bundle`` builds them (its ``LoadImaged`` reads the file; the network loaded once), ours reads the file with
``read_image_2d`` and runs ``compute()`` as Holoscan calls it, the network opened once in ``start()``. Rounds
interleave the paths (order rotating), the first is a warm-up. Prints the median per image, the ratio to MONAI
alone and the largest score difference.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import torch
from monai.deploy.core import Application, Image, IOType
from monai.deploy.operators.monai_bundle_inference_operator import IOMapping

from monai_triton_ops import InferenceOperator
from monai_triton_ops.operators.image2d import read_image_2d
from monai_triton_ops.repository.bundle import build_bundle
from monai_triton_ops.server import LocalTritonServer
from tests.bundles.classify import CLASSIFY_CONFIG, classify_metadata, png_images
from tests.operators.test_bundle import Ports

MAPPING: dict[str, Any] = {
    "input_mapping": [IOMapping("image", Image, IOType.IN_MEMORY)],
    "output_mapping": [IOMapping("pred", dict, IOType.IN_MEMORY)],
}


def write_bundle(folder: Path, size: int) -> Path:
    """The zoo-shaped bundle with ``DenseNet121`` (spatial_dims 2, 3 channels in, 4 classes) resized to ``size``."""
    from monai.networks.nets import DenseNet121

    config = json.loads(json.dumps(CLASSIFY_CONFIG))
    config["network_def"] = {"_target_": "DenseNet121", "spatial_dims": 2, "in_channels": 3, "out_channels": 4}
    config["preprocessing"]["transforms"][3]["spatial_size"] = [size, size]
    meta = classify_metadata("bench_density", 3)
    meta["network_data_format"]["inputs"]["image"]["spatial_shape"] = [size, size]
    (folder / "configs").mkdir(parents=True)
    (folder / "models").mkdir()
    (folder / "configs" / "inference.json").write_text(json.dumps(config, indent=1))
    (folder / "configs" / "metadata.json").write_text(json.dumps(meta, indent=1))
    torch.manual_seed(0)
    torch.jit.script(DenseNet121(spatial_dims=2, in_channels=3, out_channels=4).eval()).save(
        str(folder / "models" / "model.ts")
    )
    return folder


def monai_alone(bundle: Path) -> Callable[[Path], np.ndarray]:
    """The bundle's items as ``monai.bundle`` builds them; the network loaded once, as ours is."""
    from monai.bundle import ConfigParser

    parser = ConfigParser()
    parser.read_config(str(bundle / "configs" / "inference.json"))
    parser.read_meta(str(bundle / "configs" / "metadata.json"))
    parser["bundle_root"] = str(bundle)
    pre, post = parser.get_parsed_content("preprocessing"), parser.get_parsed_content("postprocessing")
    inferer, network = parser.get_parsed_content("inferer"), parser.get_parsed_content("network")

    def run(path: Path) -> np.ndarray:
        with torch.no_grad():
            data = pre({"image": str(path)})
            pred = inferer(data["image"][None], network)
            return np.asarray(post({"pred": pred[0]})["pred"].numpy(), dtype=np.float64)

    return run


def ours(op: Any) -> Callable[[Path], np.ndarray]:
    def run(path: Path) -> np.ndarray:
        ports = Ports({"image": read_image_2d(path)})
        op.compute(ports, ports, None)
        return np.array(list(ports.emitted["pred"]["probabilities"].values()))

    return run


def main(args: argparse.Namespace) -> None:
    folder = Path(tempfile.mkdtemp(prefix="bench-classify-"))
    os.environ.setdefault("MONAI_TRITON_CACHE", str(folder / "cache"))
    bundle = write_bundle(folder / "bundle", args.image_size)
    (path,) = png_images(folder / "images", count=1, size=(args.image_size * 2, args.image_size * 2))
    build_bundle(bundle, folder / "repo")
    app = Application()
    with LocalTritonServer(folder / "repo", startup_timeout_s=300.0) as server:
        specs = {"torch": "torch", "triton": "triton", "grpc": server.grpc_url, "http": server.http_url}
        ops = {key: InferenceOperator(app, bundle_path=bundle, backend=url, **MAPPING) for key, url in specs.items()}
        for op in ops.values():
            op.start()
        paths = {"MONAI alone": monai_alone(bundle), **{label: ours(op) for label, op in ops.items()}}
        times: dict[str, list[float]] = {label: [] for label in paths}
        scores: dict[str, np.ndarray] = {}
        for round_ in range(args.rounds + 1):
            order = list(paths)[round_ % len(paths) :] + list(paths)[: round_ % len(paths)]
            for label in order:
                start = time.perf_counter()
                scores[label] = paths[label](path)
                if round_:
                    times[label].append(time.perf_counter() - start)
        for op in ops.values():
            op.stop()
    first = statistics.median(times["MONAI alone"])
    want = scores["MONAI alone"]
    print(f"PNG {args.image_size * 2}^2 -> {args.image_size}^2, DenseNet121 (2D, 4 classes), {args.rounds} interleaved "
          f"rounds after 1 warm-up, {os.cpu_count()} CPUs, load {os.getloadavg()[0]:.2f}\n")  # fmt: skip
    print("| path | median s per image | ratio to MONAI alone | largest score difference |\n|---|---:|---:|---:|")
    for label, values in times.items():
        worst = float(np.max(np.abs(scores[label] - want)))
        print(f"| {label} | {statistics.median(values):.4f} | {statistics.median(values) / first:.3f} | {worst:.1e} |")
