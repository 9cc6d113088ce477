"""Step 3: write a small synthetic NIfTI for the minimal app to segment: a bright ball in noise.

    python apps/minimal/make_input.py --out input/image.nii.gz [--channels 2]

With ``--channels 2`` the file is 4D, ``(X, Y, Z, C)``: the app reads the last axis as channels.
"""

from __future__ import annotations

import argparse
from pathlib import Path

import nibabel as nib
import numpy as np

SHAPE = (48, 40, 32)  # (X, Y, Z) voxels
SPACING_MM = (1.5, 1.5, 2.0)


def make_image(channels: int = 1, seed: int = 0) -> np.ndarray:
    """``(X, Y, Z)``, or ``(X, Y, Z, C)`` for several channels; float32."""
    rng = np.random.default_rng(seed)
    grid = np.stack(np.meshgrid(*[np.arange(n) - n / 2 for n in SHAPE], indexing="ij"))
    ball = (np.sqrt((grid**2).sum(axis=0)) < 10).astype(np.float32)
    volumes = [100.0 * (c + 1) * ball + rng.normal(0.0, 5.0, SHAPE) for c in range(channels)]
    data = np.stack(volumes, axis=-1) if channels > 1 else volumes[0]
    return data.astype(np.float32)


def write_image(out: Path, channels: int = 1) -> Path:
    affine = np.diag([*SPACING_MM, 1.0])
    affine[:3, 3] = [-36.0, -30.0, -32.0]  # where voxel (0, 0, 0) is, in mm
    out.parent.mkdir(parents=True, exist_ok=True)
    nib.save(nib.Nifti1Image(make_image(channels), affine), str(out))
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("--out", type=Path, default=Path("input/image.nii.gz"), help="NIfTI file to write")
    parser.add_argument("--channels", type=int, default=1, help="image channels (default 1; 2 or more: a 4D NIfTI)")
    args = parser.parse_args()
    print(f"wrote {write_image(args.out, args.channels)}")


if __name__ == "__main__":
    main()
