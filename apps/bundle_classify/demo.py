"""A classification bundle on every backend: ``apps/bundle_classify`` on the same pictures, the scores compared.

``make demo`` runs this after the segmentation demo. ``make_bundle.py`` writes the small bundle (zoo layout) and
four pictures; the app runs on ``torch`` and ``triton`` with the bundle as ``-m``, and on ``grpc://`` and
``http://`` against a local ``tritonserver`` holding what ``monai-triton repo build`` made of it (the pre- and
post-processing still run in the app, from the local bundle). Each row: the seconds of the whole app run, the class
each picture got, and the largest difference of any score from the ``torch`` row's.

    .venv/bin/python apps/bundle_classify/demo.py [--out output/demo/classify]
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]
sys.path.insert(0, str(HERE))

from make_bundle import make_bundle, make_images  # noqa: E402

from monai_triton_ops.errors import ServerNotFoundError  # noqa: E402
from monai_triton_ops.repository.bundle import build_bundle  # noqa: E402
from monai_triton_ops.server import LocalTritonServer, find_tritonserver  # noqa: E402


def run_app(images: Path, out: Path, model: Path, backend: str, *extra: str) -> tuple[float, dict[str, dict]]:
    command = [sys.executable, str(HERE), "-i", str(images), "-o", str(out), "-m", str(model), "--backend", backend]
    started = time.perf_counter()
    subprocess.run([*command, "-l", "WARN", *extra], check=True, cwd=ROOT, timeout=600)
    seconds = time.perf_counter() - started
    return seconds, {p.name: json.loads(p.read_text()) for p in sorted(out.glob("*_result.json"))}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=ROOT / "output" / "demo" / "classify")
    args = parser.parse_args()
    work = Path(tempfile.mkdtemp(prefix="demo-classify-"))
    bundle, images = make_bundle(work), make_images(work)
    rows = {name: run_app(images, args.out / name, bundle, name) for name in ("torch", "triton")}
    try:
        find_tritonserver()
    except ServerNotFoundError as exc:
        print(f"no tritonserver for the grpc/http rows: {exc}")
    else:
        build_bundle(bundle, work / "repo")
        with LocalTritonServer(work / "repo") as server:
            for name, url in (("grpc", server.grpc_url), ("http", server.http_url)):
                rows[name] = run_app(images, args.out / name, bundle, url)
    reference = rows["torch"][1]
    print(f"\nclassification bundle {bundle.name} (apps/bundle_classify), {len(reference)} pictures")
    print(f"{'backend':<10}{'seconds':>9}  {'max |score - torch|':>20}  classes")
    for name, (seconds, results) in rows.items():
        worst = max(
            abs(score - reference[file]["probabilities"][label])
            for file, result in results.items()
            for label, score in result["probabilities"].items()
        )
        classes = ", ".join(f"{file.split('_result')[0]}: {r['predicted_class']}" for file, r in results.items())
        print(f"{name:<10}{seconds:>9.1f}  {worst:>20.1e}  {classes}")
    print(f"results: {args.out}/<backend>/<picture>_result.json (untrained weights: the classes are not meaningful)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
