"""Shared fixtures: small real TorchScript models in real model repositories, and one server over the committed one."""

from __future__ import annotations

import fcntl
import os
import shutil
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest
import torch
from monai.data import save_net_with_metadata
from monai.networks.nets import UNet

if TYPE_CHECKING:
    from monai_triton_ops.server import LocalTritonServer

ROOT = Path(__file__).resolve().parents[1]


def nd_format(
    inputs: dict[str, tuple[int, list[Any], str]], outputs: dict[str, tuple[int, list[Any], str]]
) -> dict[str, Any]:
    """MONAI ``network_data_format`` from ``{name: (channels, spatial_shape, dtype)}``."""

    def one(desc: tuple[int, list[Any], str]) -> dict[str, Any]:
        channels, spatial, dtype = desc
        return {"num_channels": channels, "spatial_shape": spatial, "dtype": dtype}

    return {
        "network_data_format": {
            "inputs": {k: one(v) for k, v in inputs.items()},
            "outputs": {k: one(v) for k, v in outputs.items()},
        }
    }


def save_model(module: torch.nn.Module, path: Path, meta: dict[str, Any] | None) -> Path:
    """Script ``module`` and write it with MONAI metadata (``None``: plain TorchScript)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    scripted = torch.jit.script(module.eval())
    if meta is None:
        scripted.save(str(path))
        return path
    save_net_with_metadata(scripted, str(path.with_suffix("")), meta_values=meta)
    os.replace(path.with_suffix(".ts"), path)
    return path


def tiny_unet() -> torch.nn.Module:
    torch.manual_seed(0)
    return UNet(spatial_dims=3, in_channels=1, out_channels=3, channels=(4, 8), strides=(2,), num_res_units=1)


UNET_META = nd_format({"image": (1, ["2*n"] * 3, "float32")}, {"pred": (3, ["2*n"] * 3, "float32")})


class TwoInTwoOut(torch.nn.Module):
    """Float and int64 in; float and bool out: names, dtypes and tuple outputs in one model."""

    def forward(self, image: torch.Tensor, offset: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        shifted = image + offset.to(image.dtype).view(-1, 1, 1, 1)
        return shifted * 2.0, shifted > 0


TWO_META = nd_format(
    {"image": (2, [-1, -1], "float32"), "offset": (1, [], "int64")},
    {"doubled": (2, [-1, -1], "float32"), "positive": (2, [-1, -1], "bool")},
)


class DictOut(torch.nn.Module):
    """A dict output with keys that are not in signature order."""

    def forward(self, x: torch.Tensor) -> dict[str, torch.Tensor]:
        return {"probs": torch.softmax(x, dim=1), "labels": torch.argmax(x, dim=1, keepdim=True).to(torch.uint8)}


DICT_META = nd_format(
    {"x": (3, ["*"] * 2, "float32")}, {"probs": (3, ["*"] * 2, "float32"), "labels": (1, ["*"] * 2, "uint8")}
)


@pytest.fixture
def make_repo(tmp_path: Path) -> Callable[..., Path]:
    """``make_repo(name, module, meta, versions=(1,))`` -> repository folder holding that model."""
    repo = tmp_path / "repo"

    def make(name: str, module: torch.nn.Module, meta: dict[str, Any] | None, versions: tuple[int, ...] = (1,)) -> Path:
        for version in versions:
            save_model(module, repo / name / str(version) / "model.pt", meta)
        return repo

    return make


@pytest.fixture
def unet_repo(make_repo: Callable[..., Path]) -> Path:
    return make_repo("unet", tiny_unet(), UNET_META)


@pytest.fixture
def restore_console(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """Commands run in-process set log levels (ours, Holoscan's) for the process; put them back afterwards."""
    import logging
    import sys

    from monai_triton_ops import console

    root = logging.getLogger()
    level = root.level
    monkeypatch.setenv(console.HOLOSCAN_ENV, os.environ.get(console.HOLOSCAN_ENV, "CRITICAL"))
    holoscan = sys.modules.get("holoscan.logger")
    before = holoscan.log_level() if holoscan is not None else None
    yield
    root.setLevel(level)
    holoscan = sys.modules.get("holoscan.logger")
    if holoscan is not None:
        holoscan.set_log_level(before if before is not None else holoscan.LogLevel.CRITICAL)


@pytest.fixture(scope="session")
def committed_server() -> Iterator[LocalTritonServer]:
    """One real tritonserver over the committed ``model_repository/``, shared by the session.

    For the tests that only need it running: the sample apps on a remote Triton, the committed repository served
    exactly, the docs' ``triton.example``. None of them loads, unloads or changes a model; each looks only at what
    its own process registered. One start (a stub that imports torch: seconds of CPU) instead of one per test.
    """
    from monai_triton_ops.errors import ServerNotFoundError
    from monai_triton_ops.server import LocalTritonServer, find_tritonserver

    try:
        find_tritonserver()
    except ServerNotFoundError as exc:
        pytest.skip(f"no tritonserver: {exc}")
    with LocalTritonServer(ROOT / "model_repository", startup_timeout_s=180.0) as server:
        yield server
    assert server.workdir is None, "the server's folder was left behind"


def pytest_configure(config: pytest.Config) -> None:
    """OpenMP threads (torch's CPU kernels) that wait for work sleep instead of spinning, in the xdist workers and
    every process they start (apps, model stubs): with three workers on two cores, spinning threads burn the CPU the
    others need (three small UNets at once: 23.0 s of CPU by default, 15.9 s with ``PASSIVE``; one alone: the same)."""
    os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")


def made_once(tmp_path_factory: pytest.TempPathFactory, name: str, write: Callable[[Path], None]) -> Path:
    """``name`` (a relative path) in the run's folder that all workers share, written by ``write(folder)`` once per
    run: under pytest-xdist by the first worker that asks (the others wait on a lock); complete or absent (written
    beside, then renamed)."""
    base = tmp_path_factory.getbasetemp()
    shared = base.parent if "PYTEST_XDIST_WORKER" in os.environ else base
    out = shared / name
    out.parent.mkdir(parents=True, exist_ok=True)
    with out.with_name(f"{out.name}.lock").open("w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not out.is_dir():
            partial = out.with_name(f"{out.name}.partial")
            shutil.rmtree(partial, ignore_errors=True)  # a worker that died while writing it
            write(partial)
            partial.rename(out)
    return out


@pytest.fixture(scope="session")
def sample_data(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The MNI T1 as NIfTI (``t1.nii.gz``) and as a DICOM MR series (``dicom/``), with reference ``labels.nii.gz``,
    written once per run (``made_once``)."""
    script = ROOT / "apps" / "brain_tissue_seg" / "make_sample_data.py"

    def write(out: Path) -> None:
        subprocess.run([sys.executable, str(script), "--out", str(out)], check=True, timeout=600)

    return made_once(tmp_path_factory, "sample_data/brain_tissue_seg", write)


@pytest.fixture(scope="session")
def sample_labels(sample_data: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The sample app's output on ``t1.nii.gz`` with the torch backend (``seg.nii.gz``), once per run: the labels
    every other way of running the sample model on the whole MRI must give (other backends, volume mode). One
    whole-MRI run (~20 s of CPU) instead of one per module that compares against it."""
    from . import warm_python

    app = ROOT / "apps" / "brain_tissue_seg"

    def write(out: Path) -> None:
        out.mkdir()
        command = [sys.executable, "-m", "monai_triton_ops.cli", "exec", str(app), "-i", str(sample_data / "t1.nii.gz")]
        command += ["-o", str(out), "-m", str(ROOT / "model_repository"), "-l", "WARN", "--backend", "torch"]
        result = warm_python.run(command, cwd=ROOT, timeout=900)
        assert result.returncode == 0, result.stderr[-3000:]
        (line,) = [line for line in result.stderr.splitlines() if line.startswith("model ")]
        assert "ran on torch" in line, line
        assert "whole volume" not in line, line  # window mode, as the app asks

    return made_once(tmp_path_factory, "sample_data/torch_labels", write)


#: Folders whose tests share session fixtures (the binding meta-test's record, the packaged wheel and MAP image,
#: the TorchScript files, the demo repository): under pytest-xdist each runs whole on one worker.
SHARED_FOLDERS = ("bindings", "packaging", "repository", "server")

#: The groups that take longest (app runs, the MAP image, the docs' commands; measured with ``-n 3`` and ``-n 4``),
#: handed out first so that no worker starts one of them when the others are nearly done. The remote exit tests
#: (about 130 s, three quarters of it waiting on a model that takes 1 s a request) go as soon as a worker is free:
#: handed out by size, they came last and left both cores idle for most of their run. The rest follow, most tests
#: first.
LONGEST_FIRST = (
    "tests/apps/test_brain_tissue_seg.py",
    "tests/apps/test_multi_ai.py",  # six runs of a two-model app and a tritonserver (~70 s alone)
    "packaging",
    "tests/test_docs.py",
    "tests/apps/test_minimal.py",
    "tests/backends/remote/test_exit.py",
    "tests/apps/test_volume_mode.py",
    "tests/backends/test_contract.py",
    "repository",
    "tests/backends/remote/test_fleet.py",
    "bindings",
    "tests/backends/test_inprocess.py",
    # the sample model and a bundle converted four ways, in-process Triton, a tritonserver, one bundle app run
    # (~120 s alone on a loaded machine)
    "tests/convert/test_convert.py",
    # the bundle app's runs and the sample MRI as a bundle (~40 s alone); the bundle operator's servers (~25 s)
    "tests/apps/test_bundle_seg.py",
    "tests/operators/test_bundle.py",
    # ensembles and parallel operators over one tritonserver and one in-process server (~32 s alone)
    "tests/operators/test_ensemble_servers.py",
    # the classification app's runs: PNGs, an unreadable PNG, the breast density app migrated (~30 s alone)
    "tests/apps/test_bundle_classify.py",
    # detection and multi-head bundles against MONAI alone: in-process Triton and a tritonserver (~65 s alone)
    "tests/operators/test_bundle_kinds.py",
    # the detection app's runs: NIfTI against MONAI alone, DICOM from a built repository (~20 s alone)
    "tests/apps/test_bundle_detect.py",
)


def xdist_group_of(nodeid: str) -> str:
    """A test's group under pytest-xdist: its folder when the folder shares session fixtures, else its file."""
    path = nodeid.split("::", 1)[0]
    folder = path.split("/")[1]
    return folder if folder in SHARED_FOLDERS else path


def pytest_xdist_make_scheduler(config: pytest.Config, log: Any) -> Any:
    """``make test`` runs on three workers (``-n 3``): whole groups (``xdist_group_of``) go to one worker each, so
    module and session fixtures (servers, app runs, the MAP image) start once, not once per worker. xdist's own
    ``--dist loadgroup`` cannot do it with pytest 9 (it rewrites ``item._nodeid``, which pytest 9 no longer reads)."""
    from xdist.scheduler import LoadScopeScheduling

    class GroupScheduling(LoadScopeScheduling):
        def _split_scope(self, nodeid: str) -> str:
            return xdist_group_of(nodeid)

        def _assign_work_unit(self, node: Any) -> None:
            for group in reversed(LONGEST_FIRST):  # the queue is built by then; its first unit not yet handed out
                if group in self.workqueue:
                    self.workqueue.move_to_end(group, last=False)
            super()._assign_work_unit(node)

    return GroupScheduling(config, log)
