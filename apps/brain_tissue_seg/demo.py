"""The main job: the sample app on the real MRI, as NIfTI and as DICOM, on every available backend; then the
sample model as a MONAI Bundle on every backend.

Each run is a real App SDK application in its own process (``monai-triton exec``), exactly as a
user would start it; afterwards the demo measures the Dice of grey and white matter against the
atlas labels on the full volume and prints where every output is. The remote rows (``grpc``,
``http``) run against a local tritonserver that the demo starts on a scratch copy of the committed
repository, with the bundle's model beside it, and stops afterwards. The ``onnx`` rows run the committed
model exported to ONNX (``export_onnx.py``); the bundle app has no ``onnx`` row (its bundle holds TorchScript).
The bundle rows run ``apps/bundle_seg`` (the App SDK's spleen app, ported) on the NIfTI with the sample model in
the model zoo's layout (``make_bundle.py``: the committed model and configs, written under ``--data``); for the
remote rows the server holds what ``monai-triton repo build`` made of the bundle. Every row's labels are compared
with the first row's of the same input (the app on ``torch``), voxel for voxel. Each run of the app also writes
``preview.png`` (``--preview``), and the demo ends with their paths.

    .venv/bin/python apps/brain_tissue_seg/demo.py [--data data/brain_tissue_seg] [--out output/brain_tissue_seg]
"""

from __future__ import annotations

import argparse
import shutil
import subprocess
import sys
import tempfile
import time
import warnings
from dataclasses import dataclass, replace
from pathlib import Path

import nibabel as nib
import numpy as np

# This process runs no Holoscan graph (each app run is its own process, whose stack limit is raised), but
# `import monai` (transforms.py) imports Holoscan, which would warn about this process's stack size.
warnings.filterwarnings("ignore", message="Current stack size", category=RuntimeWarning)
HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]
sys.path.insert(0, str(HERE))

from atlas import dice  # noqa: E402
from export_onnx import export_onnx  # noqa: E402
from make_bundle import make_bundle  # noqa: E402
from transforms import LABELS  # noqa: E402

from monai_triton_ops import available_backends  # noqa: E402
from monai_triton_ops.backends.registry import is_installed  # noqa: E402
from monai_triton_ops.errors import ServerNotFoundError  # noqa: E402
from monai_triton_ops.repository.builder import build_repository  # noqa: E402
from monai_triton_ops.repository.bundle import build_bundle  # noqa: E402
from monai_triton_ops.server import LocalTritonServer, find_tritonserver  # noqa: E402

DICE_TARGET = 0.85
#: The share of voxels whose label may differ on ``onnx``: none. ONNX Runtime's own InstanceNormalization sums a
#: channel's 96^3 voxels in float32 (logits 6.9e-4 from TorchScript's, 18 near-tied voxels of the MRI flipped);
#: the app's export takes those statistics in float64 instead (``export_onnx.py``, ``repository/onnx_norm.py``),
#: which brings the logits within 1.1e-5 and flips none (``benchmarks/onnx_near_ties.py``, docs/onnx.md).
ONNX_FLIPS = 0.0
RUN_TIMEOUT_S = 1800
BUNDLE_APP = ROOT / "apps" / "bundle_seg"
#: The bundle's model on the demo's server, beside the app's ``brain_tissue_seg`` (``repo build BUNDLE --name``).
BUNDLE_MODEL = "brain_tissue_seg_bundle"


@dataclass(frozen=True)
class Result:
    app: str
    backend: str
    kind: str
    seconds: float
    dice: dict[int, float]
    outputs: list[Path]
    outputs_dir: Path
    differing: int = 0  # voxels whose label differs from the first row's of the same input
    voxels: int = 1

    def compared(self, reference: np.ndarray) -> Result:
        labels = np.asarray(nib.load(str(self.outputs_dir / "seg.nii.gz")).dataobj)
        differing = int((labels != reference).sum()) if labels.shape == reference.shape else labels.size
        return replace(self, differing=differing, voxels=labels.size)

    @property
    def labels_ok(self) -> bool:
        """Identical labels (``onnx``: at most ``ONNX_FLIPS`` of the voxels may differ)."""
        return self.differing == 0 or (self.backend == "onnx" and self.differing <= ONNX_FLIPS * self.voxels)


@dataclass(frozen=True)
class Case:
    """One app run: which app, on which backend (a name for the table and its spec), on which input."""

    app: Path
    backend: str
    spec: str
    kind: str
    source: Path
    model: Path
    extra: tuple[str, ...] = ()

    @property
    def label(self) -> str:
        return "bundle" if self.app == BUNDLE_APP else "app"


def ensure_sample_data(data: Path) -> None:
    """Write the T1 as NIfTI and DICOM once; later runs reuse it."""
    if (data / "t1.nii.gz").is_file() and (data / "dicom").is_dir() and (data / "labels.nii.gz").is_file():
        return
    subprocess.run([sys.executable, str(HERE / "make_sample_data.py"), "--out", str(data)], check=True)


def run_app(case: Case, out: Path) -> float:
    """Run the app as a user would; returns wall seconds."""
    command = [sys.executable, "-m", "monai_triton_ops.cli", "exec", str(case.app), "-i", str(case.source)]
    command += ["-o", str(out), "-m", str(case.model), "--backend", case.spec, "-l", "WARN", *case.extra]
    if case.label == "app":  # the bundle operator draws no preview
        command.append("--preview")
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
    bundle = make_bundle(args.data / "bundle")  # the committed model and configs in the zoo's layout
    repository = ROOT / "model_repository"
    local = [scheme for scheme, entry in available_backends().items() if not entry.takes_urls]
    backends = [scheme for scheme in local if is_installed(scheme)]
    reserved = [scheme for scheme in available_backends() if scheme not in backends]
    models = dict.fromkeys(backends, repository)
    if "onnx" in models:  # the committed model exported to ONNX (export_onnx.py), in a repository of its own
        models["onnx"] = onnx_repository(args.out / "onnx-repository")
    cases = [Case(HERE, name, name, kind, source, models[name]) for name in backends for kind, source in inputs.items()]
    cases += [Case(BUNDLE_APP, name, name, "nifti", inputs["nifti"], bundle) for name in backends if name != "onnx"]
    results = [run_case(case, args) for case in cases]
    remote = [scheme for scheme in ("grpc", "http") if is_installed(scheme)]
    if remote and _has_server():
        results += run_remote(remote, inputs, bundle, args)
        reserved = [scheme for scheme in reserved if scheme not in remote]
    results.sort(key=lambda r: r.app != "app")  # the app's rows first, then the bundle's, each in backend order
    first = {r.kind: r for r in reversed(results)}  # per input kind, the first row's labels are the reference
    results = [r.compared(np.asarray(nib.load(str(first[r.kind].outputs_dir / "seg.nii.gz")).dataobj)) for r in results]
    report(results, reserved)
    return 0 if all(min(r.dice.values()) >= DICE_TARGET and r.labels_ok for r in results) else 1


def onnx_repository(folder: Path) -> Path:
    """A repository whose ``brain_tissue_seg`` is the committed model exported to ONNX (made once per demo run)."""
    shutil.rmtree(folder, ignore_errors=True)
    build_repository(export_onnx(folder.parent / "onnx-model" / "model.onnx"), folder, "brain_tissue_seg")
    return folder


def run_remote(schemes: list[str], inputs: dict[str, Path], bundle: Path, args: argparse.Namespace) -> list[Result]:
    """The remote rows, against one local server: the committed model, and what ``repo build`` makes of the bundle."""
    results = []
    with tempfile.TemporaryDirectory(prefix="demo-repository-") as scratch:
        served = Path(scratch)
        shutil.copytree(ROOT / "model_repository" / "brain_tissue_seg", served / "brain_tissue_seg")
        build_bundle(bundle, served, BUNDLE_MODEL)
        with LocalTritonServer(served) as server:
            for scheme in schemes:
                url = server.grpc_url if scheme == "grpc" else server.http_url
                results += [
                    run_case(Case(HERE, scheme, url, kind, path, served), args) for kind, path in inputs.items()
                ]
                named = ("--model-name", BUNDLE_MODEL)
                results.append(run_case(Case(BUNDLE_APP, scheme, url, "nifti", inputs["nifti"], bundle, named), args))
    return results


def run_case(case: Case, args: argparse.Namespace) -> Result:
    out = args.out / case.backend / case.kind if case.label == "app" else args.out / "bundle" / case.backend
    seconds = run_app(case, out)
    outputs = sorted(p for p in out.rglob("*") if p.is_file())
    dice_of = measure_dice(out / "seg.nii.gz", args.data / "labels.nii.gz")
    return Result(case.label, case.backend, case.kind, seconds, dice_of, outputs, out)


def _has_server() -> bool:
    try:
        find_tritonserver()
    except ServerNotFoundError as exc:
        print(f"no tritonserver for the grpc/http rows: {exc}")
        return False
    return True


def report(results: list[Result], reserved: list[str]) -> None:
    names = [LABELS[label] for label in sorted(LABELS)]
    header = f"\n{'app':<8}{'backend':<10}{'input':<8}{'seconds':>9}" + "".join(f"{'Dice ' + n:>20}" for n in names)
    print(header + f"{'labels = 1st row':>18}")
    for r in results:
        print(
            f"{r.app:<8}{r.backend:<10}{r.kind:<8}{r.seconds:>9.1f}"
            + "".join(f"{r.dice[label]:>20.4f}" for label in sorted(LABELS))
            + f"{'yes' if r.differing == 0 else f'{r.differing} voxels' + ('' if r.labels_ok else ' NO'):>18}"
        )
    print(f"\nDice target: >= {DICE_TARGET} for each tissue, on the full 197x233x189 volume.")
    print("app: apps/brain_tissue_seg; bundle: apps/bundle_seg with the sample model as a MONAI Bundle.")
    if reserved:
        print(f"Backends not run here (not installed, or they need a server URL): {', '.join(reserved)}")
    print("\nOutputs:")
    for r in results:
        for path in r.outputs:
            print(f"  [{r.app}/{r.backend}/{r.kind}] {_shown(path)}")
    print("\nPreviews (input slices with the labels overlaid):")
    for r in results:
        if (r.outputs_dir / "preview.png").is_file():
            print(f"  [{r.app}/{r.backend}/{r.kind}] {_shown(r.outputs_dir / 'preview.png')}")


def _shown(path: Path) -> Path:
    return path.relative_to(ROOT) if path.is_relative_to(ROOT) else path


if __name__ == "__main__":
    sys.exit(main())
