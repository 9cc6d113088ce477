"""The main job: the sample app on the real MRI, as NIfTI and as DICOM, on every available backend.

Each run is a real App SDK application in its own process (``monai-triton exec``), exactly as a
user would start it; afterwards the demo measures the Dice of grey and white matter against the
atlas labels on the full volume and prints where every output is.

    .venv/bin/python apps/brain_tissue_seg/demo.py [--data data/brain_tissue_seg] [--out output/brain_tissue_seg]
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import nibabel as nib
import numpy as np

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]
sys.path.insert(0, str(HERE))

from atlas import dice  # noqa: E402
from transforms import LABELS  # noqa: E402

from monai_triton_ops import available_backends  # noqa: E402
from monai_triton_ops.backends.registry import is_installed  # noqa: E402

DICE_TARGET = 0.85
RUN_TIMEOUT_S = 1800


@dataclass(frozen=True)
class Result:
    backend: str
    kind: str
    seconds: float
    dice: dict[int, float]
    outputs: list[Path]


def ensure_sample_data(data: Path) -> None:
    """Write the T1 as NIfTI and DICOM once; later runs reuse it."""
    if (data / "t1.nii.gz").is_file() and (data / "dicom").is_dir() and (data / "labels.nii.gz").is_file():
        return
    subprocess.run([sys.executable, str(HERE / "make_sample_data.py"), "--out", str(data)], check=True)


def run_app(backend: str, source: Path, out: Path) -> float:
    """Run the app as a user would; returns wall seconds."""
    command = [sys.executable, "-m", "monai_triton_ops.cli", "exec", str(HERE), "-i", str(source)]
    command += ["-o", str(out), "-m", str(ROOT / "model_repository"), "--backend", backend, "-l", "WARN"]
    start = time.perf_counter()
    subprocess.run(command, check=True, cwd=ROOT, timeout=RUN_TIMEOUT_S)
    return time.perf_counter() - start


def measure_dice(seg_path: Path, labels_path: Path) -> dict[int, float]:
    """Dice per label on the full volume, both images brought to the closest canonical (RAS) order."""
    seg = nib.as_closest_canonical(nib.load(str(seg_path)))
    ref = nib.as_closest_canonical(nib.load(str(labels_path)))
    if seg.shape != ref.shape or not np.allclose(seg.affine, ref.affine, atol=1e-3):
        raise SystemExit(f"{seg_path} is not on the atlas grid: {seg.shape} vs {ref.shape}\n{seg.affine}\n{ref.affine}")
    pred, truth = np.asarray(seg.dataobj), np.asarray(ref.dataobj)
    return {label: dice(pred, truth, label) for label in LABELS}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--data", type=Path, default=ROOT / "data" / "brain_tissue_seg")
    parser.add_argument("--out", type=Path, default=ROOT / "output" / "brain_tissue_seg")
    args = parser.parse_args()
    ensure_sample_data(args.data)
    inputs = {"nifti": args.data / "t1.nii.gz", "dicom": args.data / "dicom"}
    local = [scheme for scheme, entry in available_backends().items() if not entry.takes_urls]
    backends = [scheme for scheme in local if is_installed(scheme)]
    reserved = [scheme for scheme in available_backends() if scheme not in backends]
    results = []
    for backend in backends:
        for kind, source in inputs.items():
            out = args.out / backend / kind
            seconds = run_app(backend, source, out)
            outputs = sorted(p for p in out.rglob("*") if p.is_file())
            results.append(
                Result(backend, kind, seconds, measure_dice(out / "seg.nii.gz", args.data / "labels.nii.gz"), outputs)
            )
    report(results, reserved)
    return 0 if all(min(r.dice.values()) >= DICE_TARGET for r in results) else 1


def report(results: list[Result], reserved: list[str]) -> None:
    names = [LABELS[label] for label in sorted(LABELS)]
    print(f"\n{'backend':<10}{'input':<8}{'seconds':>9}" + "".join(f"{'Dice ' + n:>20}" for n in names))
    for r in results:
        print(
            f"{r.backend:<10}{r.kind:<8}{r.seconds:>9.1f}"
            + "".join(f"{r.dice[label]:>20.4f}" for label in sorted(LABELS))
        )
    print(f"\nDice target: >= {DICE_TARGET} for each tissue, on the full 197x233x189 volume.")
    if reserved:
        print(f"Backends not run here (not installed, or they need a server URL): {', '.join(reserved)}")
    print("\nOutputs:")
    for r in results:
        for path in r.outputs:
            print(f"  [{r.backend}/{r.kind}] {path.relative_to(ROOT) if path.is_relative_to(ROOT) else path}")


if __name__ == "__main__":
    sys.exit(main())
