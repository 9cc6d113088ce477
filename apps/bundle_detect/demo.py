"""A detection bundle on every backend: ``apps/bundle_detect`` on the same CT volume, the boxes compared.

``make demo`` runs this after the classification demo. ``make_bundle.py`` writes the small RetinaNet bundle (zoo
layout) and a CT volume; the app runs on ``torch`` and ``triton`` with the bundle as ``-m``, and on ``grpc://`` and
``http://`` against a local ``tritonserver`` holding what ``monai-triton repo build`` made of it (the detector, its
inferer and the post-processing still run in the app, from the local bundle; the RetinaNet on the server). Each
row: the seconds of the whole app run, the boxes found, the smallest IoU of a box with the ``torch`` row's box and
the largest score difference from it.

    .venv/bin/python apps/bundle_detect/demo.py [--out output/demo/detect]
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import torch
from monai.data.box_utils import box_iou, convert_box_mode

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]
sys.path.insert(0, str(HERE))

from make_bundle import make_bundle, write_volume  # noqa: E402

from monai_triton_ops.errors import ServerNotFoundError  # noqa: E402
from monai_triton_ops.repository.bundle import build_bundle  # noqa: E402
from monai_triton_ops.server import LocalTritonServer, find_tritonserver  # noqa: E402


def run_app(volume: Path, out: Path, model: Path, backend: str) -> tuple[float, dict]:
    command = [sys.executable, str(HERE), "-i", str(volume), "-o", str(out), "-m", str(model), "--backend", backend]
    started = time.perf_counter()
    subprocess.run([*command, "-l", "WARN"], check=True, cwd=ROOT, timeout=600)
    seconds = time.perf_counter() - started
    return seconds, json.loads((out / "ct_result.json").read_text())


def agreement(result: dict, reference: dict) -> tuple[float, float]:
    """The smallest IoU of a box with its best match among the reference's, and the largest score difference."""
    boxes, want = (np.asarray(r["box"], dtype=np.float32).reshape(-1, 6) for r in (result, reference))
    if len(boxes) != len(want) or not len(want):
        return float("nan"), float("nan")
    iou = box_iou(convert_box_mode(torch.as_tensor(boxes), src_mode="cccwhd"),
                  convert_box_mode(torch.as_tensor(want), src_mode="cccwhd")).numpy()  # fmt: skip
    match = iou.argmax(axis=1)
    scores = np.asarray(result["label_scores"]) - np.asarray(reference["label_scores"])[match]
    return float(iou[np.arange(len(boxes)), match].min()), float(np.abs(scores).max())


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=ROOT / "output" / "demo" / "detect")
    args = parser.parse_args()
    work = Path(tempfile.mkdtemp(prefix="demo-detect-"))
    bundle, volume = make_bundle(work), write_volume(work / "ct.nii.gz")
    rows = {name: run_app(volume, args.out / name, bundle, name) for name in ("torch", "triton")}
    try:
        find_tritonserver()
    except ServerNotFoundError as exc:
        print(f"no tritonserver for the grpc/http rows: {exc}")
    else:
        build_bundle(bundle, work / "repo")
        with LocalTritonServer(work / "repo") as server:
            for name, url in (("grpc", server.grpc_url), ("http", server.http_url)):
                rows[name] = run_app(volume, args.out / name, bundle, url)
    reference = rows["torch"][1]
    print(f"\ndetection bundle {bundle.name} (apps/bundle_detect), CT volume {volume.name}")
    print(f"{'backend':<10}{'seconds':>9}{'boxes':>7}{'min IoU':>10}  {'max |score - torch|':>20}")
    for name, (seconds, result) in rows.items():
        iou, score = agreement(result, reference)
        print(f"{name:<10}{seconds:>9.1f}{len(result['box']):>7}{iou:>10.4f}  {score:>20.1e}")
    print(f"results: {args.out}/<backend>/ct_result.json (untrained weights: the boxes are not meaningful)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
