"""A detection bundle: ``InferenceOperator`` on every backend beside the bundle run by MONAI alone.

Called by ``bench_bundle.py --kind detection``. The bundle is ``apps/bundle_detect/make_bundle.py``'s (the zoo's
``lung_nodule_ct_detection`` in shape: RetinaNet over a ResNet + FPN, a ``RetinaNetDetector`` set up by
``detector_ops`` with a sliding window, a bundle-local inferer, the zoo's box post-processing) on its CT volume.
Per image, from the NIfTI file to the boxes: MONAI alone runs the bundle as ``monai.bundle.ConfigWorkflow`` builds
it (``initialize`` once: weights and ``detector_ops``; then its items: ``LoadImaged`` reads the file, the detector,
the post-processing), ours reads the file with ``read_nifti`` and runs ``compute()`` as Holoscan calls it, the
network opened once in ``start()``. Rounds interleave the paths (order rotating), the first is a warm-up. Prints the
median per image, the ratio to MONAI alone, the boxes found and the largest score difference.
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
import torch
from monai.deploy.core import Application, Image, IOType
from monai.deploy.operators.monai_bundle_inference_operator import IOMapping

from monai_triton_ops import InferenceOperator
from monai_triton_ops.operators.nifti import read_nifti
from monai_triton_ops.repository.bundle import build_bundle
from monai_triton_ops.server import LocalTritonServer
from tests.bundles.heads import detection_maker
from tests.operators.test_bundle import Ports

MAPPING: dict[str, Any] = {
    "input_mapping": [IOMapping("image", Image, IOType.IN_MEMORY)],
    "output_mapping": [IOMapping("pred", dict, IOType.IN_MEMORY)],
}
Result = tuple[np.ndarray, np.ndarray]


def monai_alone(bundle: Path) -> Callable[[Path], Result]:
    """The bundle as ``ConfigWorkflow`` builds it: ``initialize`` once, then its items per file."""
    from monai.bundle import ConfigWorkflow

    sys.path.insert(0, str(bundle))
    workflow = ConfigWorkflow(
        config_file=str(bundle / "configs" / "inference.json"),
        meta_file=str(bundle / "configs" / "metadata.json"),
        workflow_type=None,
        bundle_root=str(bundle),
    )
    workflow.initialize()
    parser = workflow.parser
    pre, post = parser.get_parsed_content("preprocessing"), parser.get_parsed_content("postprocessing")
    inferer, network = parser.get_parsed_content("inferer"), parser.get_parsed_content("network")

    def run(path: Path) -> Result:
        with torch.no_grad():
            sample = pre({"image": str(path)})
            detections = inferer(sample["image"][None], network)
            result = post({**detections[0], "image": sample["image"]})
        return np.asarray(result["box"]), np.asarray(result["label_scores"])

    return run


def ours(op: Any) -> Callable[[Path], Result]:
    def run(path: Path) -> Result:
        ports = Ports({"image": read_nifti(path)})
        op.compute(ports, ports, None)
        found = ports.emitted["pred"]
        return np.asarray(found["box"]), np.asarray(found["label_scores"])

    return run


def main(args: argparse.Namespace) -> None:
    folder = Path(tempfile.mkdtemp(prefix="bench-detect-"))
    os.environ.setdefault("MONAI_TRITON_CACHE", str(folder / "cache"))
    maker = detection_maker()
    bundle, path = maker.make_bundle(folder), maker.write_volume(folder / "ct.nii.gz")
    build_bundle(bundle, folder / "repo")
    app = Application()
    with LocalTritonServer(folder / "repo", startup_timeout_s=300.0) as server:
        specs = {"torch": "torch", "triton": "triton", "grpc": server.grpc_url, "http": server.http_url}
        ops = {key: InferenceOperator(app, bundle_path=bundle, backend=url, **MAPPING) for key, url in specs.items()}
        for op in ops.values():
            op.start()
        paths = {"MONAI alone": monai_alone(bundle), **{label: ours(op) for label, op in ops.items()}}
        times: dict[str, list[float]] = {label: [] for label in paths}
        found: dict[str, Result] = {}
        for round_ in range(args.rounds + 1):
            order = list(paths)[round_ % len(paths) :] + list(paths)[: round_ % len(paths)]
            for label in order:
                start = time.perf_counter()
                found[label] = paths[label](path)
                if round_:
                    times[label].append(time.perf_counter() - start)
        for op in ops.values():
            op.stop()
    first = statistics.median(times["MONAI alone"])
    scores = found["MONAI alone"][1]
    window = maker.CONFIG["infer_patch_size"]
    print(f"CT {tuple(maker.ct_volume()[0].shape)}, tiny RetinaNet (3 levels, window {window}), {args.rounds} "
          f"interleaved rounds after 1 warm-up, {os.cpu_count()} CPUs, load {os.getloadavg()[0]:.2f}\n")  # fmt: skip
    print("| path | median s per image | ratio to MONAI alone | boxes | largest score difference |")
    print("|---|---:|---:|---:|---:|")
    for label, values in times.items():
        got_boxes, got_scores = found[label]
        worst = float(np.max(np.abs(got_scores - scores))) if got_scores.shape == scores.shape else float("nan")
        median = statistics.median(values)
        print(f"| {label} | {median:.4f} | {median / first:.3f} | {len(got_boxes)} | {worst:.1e} |")
