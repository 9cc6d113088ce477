"""Real model files for the repository tests: every case the issue lists, written once per session.

``CASES`` is the table the golden, builder and server tests share: a model, the metadata written into
its file (``None``: plain TorchScript, so the signature is probed), and the options it is built with.
Metadata is written without MONAI's version and timestamp keys, so generated text is reproducible.
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
import torch

from ..conftest import DictOut, TwoInTwoOut, nd_format, tiny_unet

GOLDEN = Path(__file__).parent / "golden"
#: ``UPDATE_GOLDEN=1 pytest tests/repository`` rewrites the golden files instead of comparing.
UPDATE_GOLDEN = os.environ.get("UPDATE_GOLDEN") == "1"

UNET16_META = nd_format({"image": (1, ["16*n"] * 3, "float32")}, {"pred": (3, ["16*n"] * 3, "float32")})


class FixedShape(torch.nn.Module):
    """Accepts exactly one input shape, [1, 1, 4, 4]: every probed dim must stay fixed."""

    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.head = torch.nn.Linear(16, 3)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(x.reshape(1, 16))


class FixedDepth(torch.nn.Module):
    """Depth must be 8 while batch, height and width are free: all-at-once probing fails, per axis works."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if x.shape[2] != 8:
            raise ValueError("depth must be 8")
        return x.mean(dim=2)


class EvenWidth(torch.nn.Module):
    """Elementwise, and refuses odd widths: the server test's model that fails at run time."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if x.shape[-1] % 2 == 1:
            raise ValueError("width must be even")
        return x * 3.0 + 1.0


@dataclass(frozen=True, kw_only=True)
class Case:
    """One model the tests build into a repository (``build`` holds ``generate_config`` keywords)."""

    make: Callable[[], torch.nn.Module]
    meta: dict[str, Any] | None = None
    build: dict[str, Any] = field(default_factory=dict)
    example: list[tuple[int, ...]] = field(default_factory=list)  # what the server test sends
    example_dtypes: list[str] = field(default_factory=list)


TWO_SHAPES = {"input_shapes": [(1, 2, 4, 4), (1, 1)], "input_dtypes": ["float32", "int64"]}
CASES: dict[str, Case] = {
    "unet_meta": Case(make=tiny_unet, meta=UNET16_META, example=[(1, 1, 16, 32, 16)]),
    "unet_probed": Case(make=tiny_unet, build={"input_shapes": [(1, 1, 16, 16, 16)]}, example=[(2, 1, 16, 16, 32)]),
    "two_in_two_out": Case(
        make=TwoInTwoOut, build=TWO_SHAPES, example=[(3, 2, 5, 7), (3, 1)], example_dtypes=["float32", "int64"]
    ),
    "dict_output": Case(make=DictOut, build={"input_shapes": [(1, 3, 4, 4)]}, example=[(2, 3, 6, 5)]),
    "fixed_shape": Case(make=FixedShape, build={"input_shapes": [(1, 1, 4, 4)]}, example=[(1, 1, 4, 4)]),
    "batched": Case(make=EvenWidth, build={"input_shapes": [(1, 2, 4)], "max_batch_size": 8}, example=[(1, 2, 6)]),
}


def save_scripted(module: torch.nn.Module, path: Path, meta: dict[str, Any] | None) -> Path:
    """Script ``module`` into ``path``, with ``meta`` as the ``metadata.json`` extra file when given."""
    path.parent.mkdir(parents=True, exist_ok=True)
    extra = {"metadata.json": json.dumps(meta)} if meta is not None else {}
    torch.jit.save(torch.jit.script(module.eval()), str(path), _extra_files=extra)
    return path


@pytest.fixture(scope="session")
def model_files(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """``CASES`` name -> TorchScript file, written once per session."""
    folder = tmp_path_factory.mktemp("models")
    return {name: save_scripted(case.make(), folder / f"{name}.pt", case.meta) for name, case in CASES.items()}


@pytest.fixture(scope="session")
def plain_unet(model_files: dict[str, Path]) -> Path:
    """The tiny UNet without metadata."""
    return model_files["unet_probed"]


@pytest.fixture(scope="session")
def unet_pt2(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The tiny UNet as a ``.pt2`` with MONAI metadata, as ``torch.export.save(..., extra_files=...)`` writes it."""
    path = tmp_path_factory.mktemp("pt2") / "unet.pt2"
    program = torch.export.export(tiny_unet().eval(), (torch.zeros(1, 1, 16, 16, 16),))
    torch.export.save(program, str(path), extra_files={"metadata.json": json.dumps(UNET16_META)})
    return path


@pytest.fixture
def make_model(tmp_path: Path) -> Callable[..., Path]:
    """``make_model(module, meta=None, name="model.pt")`` -> a TorchScript file in this test's folder."""

    def make(module: torch.nn.Module, meta: dict[str, Any] | None = None, name: str = "model.pt") -> Path:
        return save_scripted(module, tmp_path / "models" / name, meta)

    return make


def snapshot(folder: Path) -> dict[str, bytes]:
    """Every file (hidden ones too) under ``folder`` with its content: to prove nothing changed."""
    return {str(p.relative_to(folder)): p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()} | {
        str(p.relative_to(folder)) + "/": b"" for p in sorted(folder.rglob("*")) if p.is_dir()
    }


@pytest.fixture
def golden() -> Callable[[str, str], None]:
    """``golden(name, text)``: compare with ``golden/<name>.pbtxt``, or rewrite it under ``UPDATE_GOLDEN=1``."""

    def check(name: str, text: str) -> None:
        path = GOLDEN / f"{name}.pbtxt"
        if UPDATE_GOLDEN:
            path.parent.mkdir(exist_ok=True)
            path.write_text(text, encoding="utf-8")
            return
        assert path.is_file(), f"no golden file {path}; create it deliberately with UPDATE_GOLDEN=1"
        assert text == path.read_text(encoding="utf-8"), f"generated text differs from {path}"

    return check
