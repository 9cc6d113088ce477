"""``repo build --like CONFIG`` and chosen tensor names: a repository that answers an existing client unchanged.

The template is shaped like the App SDK remote example's client-side ``models_client_side/spleen_ct/config.pbtxt``
(libtorch, ``INPUT_0``/``OUTPUT_0``, batching to 16, ``KIND_GPU``, ``DISABLE_OPTIMIZED_EXECUTION``, its own model
file name, no ``name``); the model is a stand-in for the spleen bundle's network (a small 3D UNet, 1 -> 2 channels,
random weights, the bundle's metadata).
"""

from __future__ import annotations

import logging
import os
import stat
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from tritonclient.grpc import model_config_pb2 as pb

from monai_triton_ops import create_backend
from monai_triton_ops.cli import main
from monai_triton_ops.errors import ConfigError
from monai_triton_ops.repository.builder import build_repository, generate_config
from monai_triton_ops.repository.config import read_config

from .. import warm_python
from ..conftest import nd_format
from .conftest import save_scripted, snapshot

pytestmark = pytest.mark.usefixtures("restore_console")

#: The App SDK example's client-side config, field for field (written here, not copied).
APP_SDK_CONFIG = """
platform: "pytorch_libtorch"
max_batch_size: 16
default_model_filename: "model_spleen_ct_segmentation_v1.ts"
input [ { name: "INPUT_0" data_type: TYPE_FP32 dims: [ 1, 96, 96, 96 ] } ]
output [ { name: "OUTPUT_0" data_type: TYPE_FP32 dims: [ 2, 96, 96, 96 ] } ]
version_policy: { latest: { num_versions: 1 } }
instance_group [ { kind: KIND_GPU count: 1 } ]
dynamic_batching { preferred_batch_size: [ 4, 8, 16 ] max_queue_delay_microseconds: 1000 }
parameters: { key: "DISABLE_OPTIMIZED_EXECUTION" value: { string_value: "true" } }
"""
#: The bundle's metadata with "16*n" sizes: the model is checked on 16^3 (quick); the template narrows it to 96^3.
SPLEEN_META = nd_format({"image": (1, ["16*n"] * 3, "float32")}, {"pred": (2, ["16*n"] * 3, "float32")})


def spleen_stand_in() -> torch.nn.Module:
    from monai.networks.nets import UNet

    torch.manual_seed(0)
    return UNet(spatial_dims=3, in_channels=1, out_channels=2, channels=(4, 8), strides=(2,), num_res_units=1)


@pytest.fixture(scope="module")
def spleen_model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return save_scripted(spleen_stand_in(), tmp_path_factory.mktemp("spleen") / "spleen.ts", SPLEEN_META)


@pytest.fixture
def client_side(tmp_path: Path) -> Path:
    """``models_client_side/spleen_ct/config.pbtxt``: the folder the App SDK app gets as -m."""
    folder = tmp_path / "models_client_side" / "spleen_ct"
    folder.mkdir(parents=True)
    (folder / "config.pbtxt").write_text(APP_SDK_CONFIG)
    return folder


def test_like_takes_everything_the_template_says(
    spleen_model: Path, client_side: Path, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    with caplog.at_level(logging.WARNING):
        folder = build_repository(spleen_model, tmp_path / "repo", like=client_side)
    assert folder == tmp_path / "repo" / "spleen_ct"  # the name comes from the template's folder
    assert sorted(str(p.relative_to(folder)) for p in folder.rglob("*")) == [
        "1", "1/model_spleen_ct_segmentation_v1.ts", "config.pbtxt",
    ]  # fmt: skip
    written = read_config(folder / "config.pbtxt")
    template = read_config(client_side / "config.pbtxt", name="spleen_ct")
    for field in ("platform", "max_batch_size", "default_model_filename", "input", "output", "version_policy",
                  "instance_group", "dynamic_batching"):  # fmt: skip
        assert getattr(written, field) == getattr(template, field), field
    assert written.parameters["DISABLE_OPTIMIZED_EXECUTION"].string_value == "true"
    assert '"spatial_shape": ["16*n", "16*n", "16*n"]' in written.parameters["monai_metadata"].string_value
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert any("maps outputs ['OUTPUT_0'] by their order in config.pbtxt" in w for w in warnings), warnings
    assert any("maps inputs ['INPUT_0'] by their order in config.pbtxt" in w for w in warnings), warnings


def test_like_for_this_machine_keeps_the_names_and_runs_the_same(
    spleen_model: Path, client_side: Path, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """``--flavor python --instance-kind cpu``: the python runner on CPU, every other field as the template's."""
    repo = tmp_path / "repo"
    with caplog.at_level(logging.WARNING):
        folder = build_repository(spleen_model, repo, like=client_side / "config.pbtxt", flavor="python",
                                  instance_kind="cpu")  # fmt: skip
    assert not [r for r in caplog.records if "libtorch" in r.getMessage()]  # the runner honours any names
    assert sorted(p.name for p in (folder / "1").iterdir()) == ["model.py", "model_spleen_ct_segmentation_v1.ts"]
    config = read_config(folder / "config.pbtxt")
    assert (config.backend, config.platform) == ("python", "")
    assert config.parameters["torchscript_filename"].string_value == "model_spleen_ct_segmentation_v1.ts"
    assert [(pb.ModelInstanceGroup.Kind.Name(g.kind), g.count) for g in config.instance_group] == [("KIND_CPU", 1)]
    assert list(config.dynamic_batching.preferred_batch_size) == [4, 8, 16]
    x = np.random.default_rng(0).standard_normal((1, 1, 96, 96, 96)).astype(np.float32)
    with torch.inference_mode():
        expected = torch.jit.load(str(spleen_model))(torch.from_numpy(x)).numpy()
    with create_backend("torch", "spleen_ct", model_repository=repo) as backend:
        assert (backend.signature.input_names, backend.signature.output_names) == (("INPUT_0",), ("OUTPUT_0",))
        assert backend.signature.max_batch_size == 16
        got = backend.infer({"INPUT_0": x})["OUTPUT_0"]
    assert np.array_equal(got, expected)


def test_explicit_options_override_the_template(spleen_model: Path, client_side: Path) -> None:
    from monai_triton_ops.repository.config import VersionPolicy

    signature, options, text = generate_config(
        spleen_model, "spleen", like=client_side, flavor="python", max_batch_size=0, instance_count=2,
        version_policy=VersionPolicy(all=True), parameters={"INTRA_OP_THREAD_COUNT": "1"}, model_filename="net.ts",
        output_names=["logits"],
    )  # fmt: skip
    assert signature.max_batch_size == 0
    assert signature.inputs[0].shape == (-1, 1, 96, 96, 96)  # the batch dim made explicit
    assert signature.output_names == ("logits",)
    assert options.dynamic_batching is None  # nothing to batch with max_batch_size 0
    assert [(g.kind, g.count) for g in options.instance_groups] == [("KIND_GPU", 2)]
    assert options.version_policy == VersionPolicy(all=True)
    assert options.parameters == {"DISABLE_OPTIMIZED_EXECUTION": "true", "INTRA_OP_THREAD_COUNT": "1"}
    assert options.model_filename == "net.ts"
    assert 'name: "spleen"' in text


@pytest.mark.parametrize(
    ("edit", "message"),
    [
        (("dims: [ 1, 96", "dims: [ 3, 96"), r"input 0 \(INPUT_0\): .* says FP32 \[3, 96, 96, 96\], the model file"),
        (("dims: [ 2, 96", "dims: [ 4, 96"), r"output 0 \(OUTPUT_0\): .* says FP32 \[4, 96, 96, 96\]"),
        (("TYPE_FP32 dims: [ 1", "TYPE_FP16 dims: [ 1"), r"different dtypes"),
        (("output [", 'output [ { name: "EXTRA" data_type: TYPE_FP32 dims: [ 1 ] },'),
         r"declares 2 output\(s\) \['EXTRA', 'OUTPUT_0'\], the model file has 1"),
        (("dims: [ 2, 96, 96, 96 ]", "dims: [ 2, 96, 96, 96, 1 ]"), r"different ranks"),
    ],
    ids=["input-channels", "output-channels", "dtype", "output-count", "rank"],
)  # fmt: skip
def test_a_template_that_contradicts_the_model_is_refused_and_nothing_is_written(
    spleen_model: Path, client_side: Path, tmp_path: Path, edit: tuple[str, str], message: str
) -> None:
    config = client_side / "config.pbtxt"
    config.write_text(APP_SDK_CONFIG.replace(*edit))
    (tmp_path / "repo").mkdir()
    with pytest.raises(ConfigError, match=message):
        build_repository(spleen_model, tmp_path / "repo", like=config, flavor="python")
    assert snapshot(tmp_path / "repo") == {}


def test_a_template_may_narrow_a_dim_but_not_widen_a_fixed_one(model_files: dict[str, Path], tmp_path: Path) -> None:
    """The fixed-shape model takes exactly [1, 1, 4, 4] (probed): a template with -1 for its batch promises too much."""
    template = tmp_path / "fixed" / "config.pbtxt"
    template.parent.mkdir()
    tensors = 'input [ { name: "INPUT_0" data_type: TYPE_FP32 dims: [ DIMS ] } ] ' + (
        'output [ { name: "OUTPUT_0" data_type: TYPE_FP32 dims: [ 1, 3 ] } ]'
    )
    template.write_text('backend: "python" max_batch_size: 0 ' + tensors.replace("DIMS", "-1, 1, 4, 4"))
    with pytest.raises(ConfigError, match="dim 0: the config allows any size, the model takes only 1"):
        generate_config(model_files["fixed_shape"], like=template, input_shapes=[(1, 1, 4, 4)])
    template.write_text('backend: "python" max_batch_size: 0 ' + tensors.replace("DIMS", "1, 1, 4, 4"))
    signature, _, _ = generate_config(model_files["fixed_shape"], like=template)  # probed on the template's shape
    assert signature.inputs[0].shape == (1, 1, 4, 4)


def test_a_template_for_another_platform_needs_a_flavour(spleen_model: Path, client_side: Path) -> None:
    config = client_side / "config.pbtxt"
    config.write_text(APP_SDK_CONFIG.replace('platform: "pytorch_libtorch"', 'platform: "onnxruntime_onnx"'))
    with pytest.raises(ConfigError, match=r"platform/backend 'onnxruntime_onnx'; choose .* with --flavor"):
        generate_config(spleen_model, like=config)
    _, options, _ = generate_config(spleen_model, like=config, flavor="python")
    assert options.model_filename == "model_spleen_ct_segmentation_v1.ts"


def test_fields_no_option_models_are_carried_and_sub_fields_dropped_are_named(
    spleen_model: Path, client_side: Path, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    config = client_side / "config.pbtxt"
    extra = (
        'model_warmup [ { name: "w" batch_size: 1 inputs { key: "INPUT_0" value { data_type: TYPE_FP32 '
        "dims: [ 1, 96, 96, 96 ] zero_data: true } } } ]\nresponse_cache { enable: true }\n"
    )
    text = APP_SDK_CONFIG.replace("count: 1 }", "count: 1 gpus: [ 0 ] }") + extra
    config.write_text(text.replace("max_queue_delay_microseconds: 1000", "max_queue_delay_microseconds: 1000 "
                                   "default_queue_policy { max_queue_size: 8 }"))  # fmt: skip
    with caplog.at_level(logging.WARNING):
        folder = build_repository(spleen_model, tmp_path / "repo", like=config, flavor="python")
    written = read_config(folder / "config.pbtxt")
    assert written.model_warmup[0].name == "w"
    assert written.response_cache.enable
    assert not written.dynamic_batching.HasField("default_queue_policy")
    dropped = [r.getMessage() for r in caplog.records if "not carried over" in r.getMessage()]
    assert len(dropped) == 1
    assert dropped[0].endswith("instance_group[0].gpus, dynamic_batching.default_queue_policy")


def test_chosen_tensor_names(model_files: dict[str, Path], caplog: pytest.LogCaptureFixture) -> None:
    shapes = {"input_shapes": [(1, 2, 4, 4), (1, 1)], "input_dtypes": ["float32", "int64"]}
    signature, _, text = generate_config(
        model_files["two_in_two_out"], "two", input_names=["INPUT_0", "INPUT_1"], output_names=["doubled", "mask"],
        **shapes,  # type: ignore[arg-type]
    )  # fmt: skip
    assert (signature.input_names, signature.output_names) == (("INPUT_0", "INPUT_1"), ("doubled", "mask"))
    assert text.count('name: "INPUT_0"') == 1
    with caplog.at_level(logging.WARNING):
        generate_config(model_files["two_in_two_out"], "two", input_names=["INPUT__0", "INPUT__1"], flavor="libtorch",
                        **shapes)  # type: ignore[arg-type]  # fmt: skip
    assert not [r for r in caplog.records if "libtorch" in r.getMessage()]  # libtorch maps NAME__i by name
    with pytest.raises(ConfigError, match=r"has 2 input\(s\) \['image', 'offset'\], got 1 input name"):
        generate_config(model_files["two_in_two_out"], "two", input_names=["only"], **shapes)  # type: ignore[arg-type]


def test_names_and_like_on_the_command_line(
    spleen_model: Path, client_side: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    repo = tmp_path / "repo"
    argv = ["repo", "build", str(spleen_model), "-o", str(repo), "--like", str(client_side), "--flavor", "python",
            "--instance-kind", "cpu", "--output-name", "logits", "--parameter", "INTRA_OP_THREAD_COUNT=1",
            "--version-policy", "specific:1"]  # fmt: skip
    assert main(argv) == 0
    assert capsys.readouterr().out == f"wrote {repo / 'spleen_ct'}\n"
    config = read_config(repo / "spleen_ct" / "config.pbtxt")
    assert [t.name for t in config.output] == ["logits"]
    assert config.parameters["INTRA_OP_THREAD_COUNT"].string_value == "1"
    assert list(config.version_policy.specific.versions) == [1]
    names = ["--input-name", "a", "--input-name", "b"]
    assert main(["config", str(spleen_model), "--like", str(client_side), *names]) == 2
    assert "got 2 input name(s) ['a', 'b']" in capsys.readouterr().err
    assert main(["config", str(spleen_model), "--version-policy", "newest"]) == 2
    assert "expected latest:N, all or specific:1,3, got 'newest'" in capsys.readouterr().err


def test_a_mismatch_is_exit_2_from_the_real_command(spleen_model: Path, client_side: Path, tmp_path: Path) -> None:
    (client_side / "config.pbtxt").write_text(APP_SDK_CONFIG.replace("dims: [ 1, 96", "dims: [ 3, 96"))
    command = [sys.executable, "-m", "monai_triton_ops.cli", "repo", "build", str(spleen_model), "-o",
               str(tmp_path / "repo"), "--like", str(client_side), "--flavor", "python"]  # fmt: skip
    result = warm_python.run(command, timeout=300)
    assert result.returncode == 2, result.stderr
    assert result.stderr.startswith("error: model 'spleen_ct' input 0 (INPUT_0): ")
    assert result.stderr.count("\n") == 1
    assert not (tmp_path / "repo").exists()


@pytest.mark.parametrize(("umask", "folder_mode", "file_mode"), [(0o022, 0o755, 0o644), (0o027, 0o750, 0o640)])
def test_written_folders_and_files_follow_the_umask(
    model_files: dict[str, Path], tmp_path: Path, umask: int, folder_mode: int, file_mode: int
) -> None:
    before = os.umask(umask)
    try:
        folder = build_repository(model_files["unet_meta"], tmp_path / "repo", "seg")
    finally:
        os.umask(before)
    for path in (folder, *folder.rglob("*")):
        mode = stat.S_IMODE(path.stat().st_mode)
        assert mode == (folder_mode if path.is_dir() else file_mode), (path, oct(mode))
