"""A bundle in ``mode=volume`` against a real tritonserver: the bundle's sliding window runs on the server.

One server for the module serves what ``monai-triton repo build BUNDLE --whole-volume`` makes of the 3D UNet
bundle: its network and ``tiny_spleen_volume``. The client's local bundle gives the pre- and post-processing and
the inferer's settings, which travel with the whole image; the ``torch`` backend on the same bundle (which gives
the App SDK operator's labels, ``tests/operators/test_bundle.py``) is the reference, voxel for voxel. The
inferers differ from MONAI's defaults in what the server must take from them: ``sigma_scale`` per axis, a
``roi_size`` larger than the image on one axis (so ``padding_mode`` and ``cval`` decide the border), gaussian
blending at overlap 0.5.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from monai.deploy.core import Application

from monai_triton_ops.cli import main
from monai_triton_ops.errors import BundleError
from monai_triton_ops.server import LocalTritonServer

from ..operators.test_bundle import assert_same, ours
from .makers import UNET_CONFIG, ct_image, unet_bundle

pytestmark = pytest.mark.triton

#: The image is 24 x 21 x 25 voxels after the bundle's Spacingd: the roi's 32 pads its first axis.
BASE = {**UNET_CONFIG["inferer"], "roi_size": [32, 16, 16], "overlap": 0.5, "mode": "gaussian"}
INFERERS: dict[str, dict[str, Any]] = {
    "sigma_per_axis_replicate": {**BASE, "sigma_scale": [0.3, 0.125, 0.2], "padding_mode": "replicate"},
    "constant_cval": {**BASE, "padding_mode": "constant", "cval": 0.7},
}
#: Invertd with nearest interpolation: argmax after it is the server's labels, so volume_output=labels is exact.
NEAREST_POST = {
    **UNET_CONFIG["postprocessing"],
    "transforms": [
        {**t, "nearest_interp": True} if t["_target_"] == "Invertd" else t
        for t in UNET_CONFIG["postprocessing"]["transforms"]
    ],
}


@pytest.fixture(scope="module")
def fragment() -> Application:
    return Application()


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalTritonServer]:
    folder = tmp_path_factory.mktemp("bundle_volume")
    repo = folder / "repo"
    assert main(["repo", "build", str(unet_bundle(folder / "served")), "-o", str(repo), "--whole-volume"]) == 0
    assert sorted(p.name for p in repo.iterdir()) == ["tiny_spleen", "tiny_spleen_volume"]
    with LocalTritonServer(repo, startup_timeout_s=300.0) as server:
        yield server


def _volume(server: LocalTritonServer, scheme: str = "grpc", output: str = "scores") -> str:
    url = server.grpc_url if scheme == "grpc" else server.http_url
    return f"{url}?mode=volume&volume_output={output}"


@pytest.mark.parametrize("scheme", ["grpc", "http"])
@pytest.mark.parametrize("inferer", sorted(INFERERS))
def test_volume_mode_gives_the_torch_backends_labels(
    fragment: Application,
    served: LocalTritonServer,
    tmp_path: Path,
    caplog: pytest.LogCaptureFixture,
    inferer: str,
    scheme: str,
) -> None:
    bundle = unet_bundle(tmp_path / "bundle", inferer=INFERERS[inferer])
    want = ours(fragment, bundle, "torch", ct_image())
    with caplog.at_level(logging.INFO, logger="monai_triton_ops"):
        got = ours(fragment, bundle, _volume(served, scheme), ct_image())
    assert_same(got, want)
    (sent,) = [r.getMessage() for r in caplog.records if r.getMessage().startswith("whole-volume request")]
    assert "'roi_size': '32,16,16'" in sent
    assert "'overlap': '0.5'" in sent
    assert "'blend_mode': 'gaussian'" in sent
    if inferer == "constant_cval":
        assert "'cval': '0.7'" in sent
    else:
        assert "'sigma_scale': '0.3,0.125,0.2'" in sent
        assert "'padding_mode': 'replicate'" in sent


def test_the_inferers_settings_change_what_the_server_computes(
    fragment: Application, served: LocalTritonServer, tmp_path: Path
) -> None:
    """Proof that the settings reach the server's sliding window: other settings, other labels."""
    default = unet_bundle(tmp_path / "default", inferer=BASE)
    changed = unet_bundle(tmp_path / "changed", inferer=INFERERS["sigma_per_axis_replicate"])
    first = ours(fragment, default, _volume(served), ct_image()).asnumpy()
    second = ours(fragment, changed, _volume(served), ct_image()).asnumpy()
    assert int(np.count_nonzero(first != second)) > 0


def test_labels_come_back_exact_when_the_post_processing_keeps_them(
    fragment: Application, served: LocalTritonServer, tmp_path: Path
) -> None:
    """``volume_output=labels`` (1 byte a voxel back): exact for a chain that only needs the argmax."""
    bundle = unet_bundle(tmp_path / "bundle", inferer=INFERERS["constant_cval"], postprocessing=NEAREST_POST)
    want = ours(fragment, bundle, "torch", ct_image())
    got = ours(fragment, bundle, _volume(served, output="labels"), ct_image())
    assert_same(got, want)


@pytest.mark.parametrize(
    ("inferer", "why"),
    [
        ({"_target_": "SliceInferer", "roi_size": [16, 16], "spatial_dim": 2}, "SliceInferer is not a Sliding"),
        ({**BASE, "overlap": [0.5, 0.25, 0.5]}, r"overlap \[0.5, 0.25, 0.5\] differs per axis"),
    ],
)
def test_an_inferer_the_server_cannot_run_is_refused_naming_the_item(
    fragment: Application, served: LocalTritonServer, tmp_path: Path, inferer: dict[str, Any], why: str
) -> None:
    bundle = unet_bundle(tmp_path / "bundle", inferer=inferer)
    with pytest.raises(BundleError, match=why) as caught:
        ours(fragment, bundle, _volume(served), ct_image())
    assert "inference.json" in str(caught.value)
    assert "inferer" in str(caught.value)
    assert "use mode=window" in str(caught.value)
