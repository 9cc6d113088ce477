"""Whole-volume models without a server: what ``repo wrap`` and ``repo build --whole-volume`` write; the runner's rules.

The runner (``runner/volume.py``) runs inside Triton's stub; its pure parts (settings from request
parameters, window grouping, the size limit, the config it reads) are tested here against what the
client sends and what the wrap writes, so both sides stay in step. The server tests are in
``tests/backends/remote/test_volume.py``.
"""

from __future__ import annotations

import json
import shutil
from collections.abc import Callable
from pathlib import Path

import pytest
import torch
from tritonclient.grpc import model_config_pb2 as pb

from monai_triton_ops.cli import main
from monai_triton_ops.errors import ConfigError, ModelNotFoundError, RepositoryError
from monai_triton_ops.pipeline.predictor import Predictor
from monai_triton_ops.pipeline.run import InferenceSettings
from monai_triton_ops.pipeline.volume import one_hot, request_parameters
from monai_triton_ops.repository import volume
from monai_triton_ops.repository.builder import build_repository
from monai_triton_ops.repository.check import check_repository
from monai_triton_ops.repository.config import read_config, signature_from_config
from monai_triton_ops.repository.runner import volume as runner
from monai_triton_ops.volume_spec import VolumeSpec

from .conftest import snapshot

pytestmark = pytest.mark.usefixtures("restore_console")
INFERENCE = {"roi_size": [16, 16, 16], "overlap": 0.5, "sw_batch_size": 4, "mode": "gaussian"}


@pytest.fixture
def repo(model_files: dict[str, Path], tmp_path: Path) -> Path:
    """A repository holding ``unet`` (3 classes, metadata with an ``inference`` block) and ``two`` (two inputs)."""
    repository = tmp_path / "repo"
    build_repository(model_files["unet_meta"], repository, "unet")
    config = repository / "unet" / "config.pbtxt"
    text = config.read_text()
    metadata = signature_from_config(read_config(config, name="unet")).metadata
    old = json.dumps(json.dumps(dict(metadata), sort_keys=True))
    new = json.dumps(json.dumps({**metadata, "inference": INFERENCE}, sort_keys=True))
    config.write_text(text.replace(old, new))
    build_repository(model_files["two_in_two_out"], repository, "two", input_shapes=[(1, 2, 4, 4), (1, 1)],
                     input_dtypes=["float32", "int64"])  # fmt: skip
    return repository


def test_wrap_writes_a_python_model_beside_the_network(repo: Path, golden: Callable[[str, str], None]) -> None:
    folder = volume.wrap_network(repo, "unet")
    assert folder == repo / "unet_volume"
    files = ["1", "1/model.py", "1/volume_settings.py", "config.pbtxt"]
    assert sorted(str(p.relative_to(folder)) for p in folder.rglob("*")) == files
    assert (folder / "1" / "model.py").read_bytes() == volume.RUNNER.read_bytes()
    assert (folder / "1" / "volume_settings.py").read_bytes() == volume.RUNNER_SETTINGS.read_bytes()
    text = (folder / "config.pbtxt").read_text()
    golden("unet_volume", text)
    config = read_config(folder / "config.pbtxt", name="unet_volume")
    assert config.backend == "python"
    kinds = [(pb.ModelInstanceGroup.Kind.Name(g.kind), g.count) for g in config.instance_group]
    assert kinds == [("KIND_CPU", 1)]  # the volume's buffers stay in host memory, wherever the network runs
    signature = signature_from_config(config)
    assert [(t.name, t.dtype, t.shape) for t in signature.inputs] == [("x", "FP32", (-1, 1, -1, -1, -1))]
    assert [(t.name, t.dtype, t.shape) for t in signature.outputs] == [
        ("LABELS", "UINT8", (-1, 1, -1, -1, -1)),
        ("OUTPUT__0", "FP32", (-1, 3, -1, -1, -1)),
    ]
    assert signature.metadata["inference"] == INFERENCE  # clients read the same defaults from either model
    spec = VolumeSpec.of(signature.metadata)
    assert spec is not None
    assert (spec.network, spec.input, spec.output, spec.channels, spec.max_volume_mb) == (
        "unet",
        "x",
        "OUTPUT__0",
        3,
        1024,
    )
    (report,) = [r for r in check_repository(repo) if r.name == "unet_volume"]
    assert report.problems == ()
    assert report.kind == "whole volume"
    assert "remote backends (grpc://, http://) in mode=volume, for the network 'unet'" in report.uses
    shutil.rmtree(repo / "unet")
    (report,) = [r for r in check_repository(repo) if r.name == "unet_volume"]
    assert report.problems == ("version 1: it wraps the network 'unet', which this repository does not hold",)


def test_the_runner_reads_what_the_wrap_writes(repo: Path) -> None:
    volume.wrap_network(repo, "unet", max_volume_mb=7, max_in_flight=3)
    from google.protobuf import json_format

    config = json_format.MessageToDict(
        read_config(repo / "unet_volume" / "config.pbtxt"), preserving_proto_field_name=True
    )
    model = runner.Wrapped.from_config(config)
    spec = VolumeSpec.of(signature_from_config(read_config(repo / "unet_volume" / "config.pbtxt")).metadata)
    assert spec is not None
    assert (model.name, model.network, model.input, model.output, model.labels) == (
        "unet_volume", spec.network, spec.input, spec.output, spec.labels
    )  # fmt: skip
    assert (model.channels, model.spatial_rank, model.max_volume_mb, model.max_in_flight) == (3, 3, 7, 3)
    assert model.defaults == INFERENCE


def test_a_network_that_cannot_be_wrapped_is_refused_and_nothing_is_written(repo: Path, tmp_path: Path) -> None:
    before = snapshot(repo)
    with pytest.raises(
        ConfigError, match=r"model 'two' has 2 inputs \['image', 'offset'\]; a sliding window feeds one"
    ):
        volume.wrap_network(repo, "two")
    with pytest.raises(ConfigError, match=r"model 'unet' has no output 'nope'; its outputs are \['OUTPUT__0'\]"):
        volume.wrap_network(repo, "unet", output="nope")
    with pytest.raises(ModelNotFoundError, match="model 'ghost' not found"):
        volume.wrap_network(repo, "ghost")
    (repo / "bare" / "1").mkdir(parents=True)
    with pytest.raises(
        ModelNotFoundError, match=r"has no config\.pbtxt to wrap; build it first with 'monai-triton repo build"
    ):
        volume.wrap_network(repo, "bare")
    (repo / "bare" / "1").rmdir()
    (repo / "bare").rmdir()
    assert snapshot(repo) == before


def test_an_existing_volume_model_is_replaced_only_with_force(repo: Path) -> None:
    volume.wrap_network(repo, "unet")
    before = snapshot(repo)
    with pytest.raises(RepositoryError, match="model 'unet_volume' already exists"):
        volume.wrap_network(repo, "unet", max_volume_mb=8)
    assert snapshot(repo) == before
    volume.wrap_network(repo, "unet", max_volume_mb=8, force=True)
    spec = VolumeSpec.of(signature_from_config(read_config(repo / "unet_volume" / "config.pbtxt")).metadata)
    assert spec is not None
    assert spec.max_volume_mb == 8


def test_repo_wrap_and_repo_build_whole_volume_from_the_command_line(
    repo: Path, model_files: dict[str, Path], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["repo", "wrap", str(repo), "--name", "unet", "--max-volume-mb", "64"]) == 0
    assert capsys.readouterr().out == f"wrote {repo / 'unet_volume'}\n"
    built = tmp_path / "built"
    argv = ["repo", "build", str(model_files["unet_meta"]), "-o", str(built), "--name", "seg", "--whole-volume"]
    assert main(argv) == 0
    assert capsys.readouterr().out == f"wrote {built / 'seg'}\nwrote {built / 'seg_volume'}\n"
    two = ["repo", "build", str(model_files["two_in_two_out"]), "-o", str(tmp_path / "none"), "--name", "two",
           "--input-shape", "1,2,4,4", "--input-shape", "1,1", "--input-dtype", "float32", "--input-dtype", "int64",
           "--whole-volume"]  # fmt: skip
    assert main(two) == 2
    assert "a sliding window feeds one" in capsys.readouterr().err
    assert not (tmp_path / "none").exists()  # refused before anything was written


def _wrapped(**changes: object) -> runner.Wrapped:
    fields = {"name": "unet_volume", "network": "unet", "input": "x", "output": "OUTPUT__0", "labels": "LABELS",
              "channels": 3, "spatial_rank": 3, "batch_axis": True, "network_max_batch_size": 0,
              "max_volume_mb": 1, "max_in_flight": 2, "defaults": INFERENCE}  # fmt: skip
    return runner.Wrapped(**{**fields, **changes})  # type: ignore[arg-type]


def test_request_parameters_are_what_the_runner_reads_back_as_the_same_settings() -> None:
    settings = InferenceSettings(roi_size=(24, 12, 20), overlap=0.375, mode="gaussian", sw_batch_size=3,
                                 request_batch_size=2)  # fmt: skip
    got = runner.settings_for(_wrapped(), request_parameters(settings))
    assert got == runner.Settings(inferer="sliding_window", roi_size=(24, 12, 20), sw_batch_size=3, overlap=0.375,
                                  blend_mode="gaussian", request_batch_size=2, network_version=None)  # fmt: skip
    defaults = runner.settings_for(_wrapped(), {})  # the network's metadata when the request says nothing
    assert (defaults.roi_size, defaults.overlap, defaults.sw_batch_size, defaults.blend_mode) == (
        (16, 16, 16), 0.5, 4, "gaussian"
    )  # fmt: skip
    assert runner.settings_for(_wrapped(defaults={}), {}).inferer == "simple"
    assert runner.settings_for(_wrapped(), {"network_version": "2"}).network_version == 2
    assert (defaults.sigma_scale, defaults.padding_mode, defaults.cval) == ((0.125,), "constant", 0.0)  # MONAI's


def test_the_inferers_sigma_and_padding_travel_only_when_they_are_not_monais_defaults() -> None:
    """A volume model wrapped before they travelled refuses unknown parameters: a default sends nothing new."""
    assert set(request_parameters(InferenceSettings(roi_size=(16, 16, 16)))) == {
        "inferer", "sw_batch_size", "overlap", "blend_mode", "roi_size"
    }  # fmt: skip
    settings = InferenceSettings(roi_size=(16, 16, 16), sigma_scale=[0.3, 0.125, 0.2], padding_mode="reflect",
                                 cval=-1.5)  # fmt: skip
    sent = request_parameters(settings)
    assert (sent["sigma_scale"], sent["padding_mode"], sent["cval"]) == ("0.3,0.125,0.2", "reflect", "-1.5")
    got = runner.settings_for(_wrapped(), sent)
    assert (got.sigma_scale, got.padding_mode, got.cval) == ((0.3, 0.125, 0.2), "reflect", -1.5)
    assert runner.settings_for(_wrapped(), request_parameters(InferenceSettings(sigma_scale=0.5))).sigma_scale == (0.5,)


@pytest.mark.parametrize(
    ("parameters", "message"),
    [
        ({"overlap": "1"}, r"overlap='1': expected a number in \[0, 1\)"),
        ({"overlap": "nan"}, r"overlap='nan': expected a number in \[0, 1\)"),
        ({"roi_size": "16,16"}, r"roi_size='16,16': expected 3 positive sizes"),
        ({"roi_size": "a,b,c"}, r"roi_size='a,b,c': expected positive integers"),
        ({"sw_batch_size": "0"}, r"sw_batch_size='0': expected an integer >= 1"),
        ({"blend_mode": "max"}, r"blend_mode='max': expected constant or gaussian"),
        ({"inferer": "patch"}, r"inferer='patch': expected sliding_window or simple"),
        ({"roi": "16"}, r"unknown request parameter\(s\) \['roi'\]; accepted: inferer, roi_size"),
        ({"sigma_scale": "0"}, r"sigma_scale='0': expected a number > 0, or one per spatial dim"),
        ({"sigma_scale": "0.1,0.2"}, r"sigma_scale='0.1,0.2': expected a number > 0, or one per spatial dim"),
        ({"padding_mode": "edge"}, r"padding_mode='edge': expected constant, reflect, replicate or circular"),
        ({"cval": "inf"}, r"cval='inf': expected a number"),
    ],
)
def test_bad_request_parameters_name_the_parameter_and_what_it_takes(parameters: dict[str, str], message: str) -> None:
    with pytest.raises(
        runner.RequestError,
        match=r"model 'unet_volume': " + ("" if "unknown" in message else "request parameter ") + message,
    ):
        runner.settings_for(_wrapped(), parameters)
    with pytest.raises(runner.RequestError, match="the sliding window needs roi_size"):
        runner.settings_for(_wrapped(defaults={}), {"inferer": "sliding_window"})


class _Network:
    """What ``Predictor`` needs of a backend, to compare its grouping of windows with the runner's."""

    def __init__(self, max_batch_size: int) -> None:
        from monai_triton_ops.signature import ModelSignature, TensorSpec

        self.signature = ModelSignature(
            name="n",
            inputs=(TensorSpec(name="x", dtype="FP32", shape=(-1, 1, -1, -1, -1)),),
            outputs=(TensorSpec(name="y", dtype="FP32", shape=(-1, 3, -1, -1, -1)),),
            max_batch_size=max_batch_size,
        )


@pytest.mark.parametrize("max_batch_size", [0, 3])
@pytest.mark.parametrize("request_batch_size", [None, 1, 2, 5])
def test_windows_are_grouped_into_network_requests_as_the_clients_predictor_groups_them(
    max_batch_size: int, request_batch_size: int | None
) -> None:
    settings = runner.Settings("sliding_window", (8, 8, 8), 7, 0.25, "constant", request_batch_size, None)
    for windows in (1, 4, 7):
        ours = runner.request_sizes(windows, settings, _wrapped(network_max_batch_size=max_batch_size))
        predictor = Predictor(_Network(max_batch_size), request_batch_size=request_batch_size)  # type: ignore[arg-type]
        size = predictor._request_size(windows)
        assert ours == [min(size, windows - start) for start in range(0, windows, size)]


def test_the_runner_refuses_a_volume_over_its_limit_and_a_wrong_rank() -> None:
    runner.check_volume(_wrapped(), torch.zeros(1, 1, 64, 64, 64))  # exactly 1 MB
    with pytest.raises(
        runner.RequestError, match=r"holds 1.02 MB, over this model's limit of 1 MB .*--max-volume-mb N"
    ):
        runner.check_volume(_wrapped(), torch.zeros(1, 1, 64, 64, 65))
    with pytest.raises(
        runner.RequestError, match=r"expected \(batch, channels, 3 spatial dims\), got shape \[1, 64, 64\]"
    ):
        runner.check_volume(_wrapped(), torch.zeros(1, 64, 64))


def test_labels_reach_the_post_transforms_as_channels_whose_argmax_is_the_labels() -> None:
    labels = torch.randint(0, 3, (1, 1, 5, 4, 3), dtype=torch.uint8)
    scores = one_hot(labels, 3, torch.float32)
    assert scores.shape == (1, 3, 5, 4, 3)
    assert scores.dtype == torch.float32
    assert set(scores.unique().tolist()) == {0.0, 1.0}
    torch.testing.assert_close(scores.argmax(1, keepdim=True).to(torch.uint8), labels, rtol=0, atol=0)
    torch.testing.assert_close(torch.softmax(scores, 1).argmax(1, keepdim=True).to(torch.uint8), labels, rtol=0, atol=0)
    assert torch.equal(runner.labels_of(scores), labels)


def test_the_servers_argmax_is_torch_argmax_ties_infinities_and_nan_included() -> None:
    """What ``AsDiscrete(argmax=True)`` computes in window mode, computed channel by channel on the server."""
    generator = torch.Generator().manual_seed(0)
    scores = torch.randint(-2, 3, (2, 5, 9, 8, 7), generator=generator).float()  # many ties
    flat = scores.view(-1)
    picks = torch.randperm(flat.numel(), generator=generator)
    flat[picks[:60]] = float("nan")
    flat[picks[60:120]] = float("inf")
    flat[picks[120:180]] = float("-inf")
    expected = torch.argmax(scores, dim=1, keepdim=True).to(torch.uint8)
    for slab in (1, 2 * 8 * 7, 2 * 8 * 7 + 1, 10**6):  # one plane per slab, a bit more than one, everything
        assert torch.equal(runner.labels_of(scores, slab_voxels=slab), expected)
    assert torch.equal(runner.labels_of(scores[:, :1]), torch.zeros_like(expected))
