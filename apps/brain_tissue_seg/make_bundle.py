"""The sample model as a MONAI Bundle in the model zoo's layout, from the committed model and configs.

    <out>/brain_tissue_seg/configs/inference.json   this folder's bundle/configs/inference.json: the app's
                                                    transforms.py as a bundle config (dictionary transforms,
                                                    SlidingWindowInferer with the model's own inference settings)
    <out>/brain_tissue_seg/configs/metadata.json    the metadata inside the model file (network_data_format...)
    <out>/brain_tissue_seg/models/model.ts          model_repository/brain_tissue_seg/1/model.pt

Nothing binary is committed twice: the bundle is made from what is. ``apps/bundle_seg`` (or the App SDK's own bundle
operator) runs it; ``monai-triton repo build`` serves it.

    .venv/bin/python apps/brain_tissue_seg/make_bundle.py --out data/bundles
"""

from __future__ import annotations

import argparse
import json
import shutil
from collections.abc import Sequence
from pathlib import Path

from monai_triton_ops.repository.metadata import read_torchscript_metadata

HERE = Path(__file__).resolve().parent
MODEL = HERE.parents[1] / "model_repository" / "brain_tissue_seg" / "1" / "model.pt"
NAME = "brain_tissue_seg"


def make_bundle(out: Path, model: Path = MODEL) -> Path:
    """Write the bundle folder ``out/brain_tissue_seg``; returns it."""
    folder = out / NAME
    (folder / "configs").mkdir(parents=True, exist_ok=True)
    (folder / "models").mkdir(exist_ok=True)
    shutil.copyfile(HERE / "bundle" / "configs" / "inference.json", folder / "configs" / "inference.json")
    metadata = read_torchscript_metadata(model) or {}
    metadata.setdefault("name", NAME)
    (folder / "configs" / "metadata.json").write_text(json.dumps(metadata, indent=2) + "\n", encoding="utf-8")
    shutil.copyfile(model, folder / "models" / "model.ts")
    return folder


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=Path("data/bundles"), help="folder to write the bundle into")
    print(f"wrote {make_bundle(parser.parse_args(argv).out)}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
