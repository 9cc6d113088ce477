"""config.pbtxt through Triton's protobuf: options, naming rules, max_batch_size 0, parsing and round trips."""

from __future__ import annotations

import json

import pytest

from monai_triton_ops.errors import ConfigError, ModelNotFoundError
from monai_triton_ops.repository.config import (
    ConfigOptions,
    DynamicBatching,
    InstanceGroup,
    VersionPolicy,
    build_config,
    options_from_config,
    parse_config,
    read_config,
    render_config,
    signature_from_config,
)
from monai_triton_ops.repository.naming import libtorch_naming, named_index, rename
from monai_triton_ops.signature import ModelSignature, TensorSpec


def signature(
    *,
    max_batch_size: int = 0,
    inputs: tuple[str, ...] = ("image",),
    outputs: tuple[str, ...] = ("OUTPUT__0",),
    metadata: dict | None = None,
) -> ModelSignature:
    lead = () if max_batch_size else (-1,)
    return ModelSignature(
        name="seg",
        inputs=tuple(TensorSpec(name=n, dtype="FP32", shape=(*lead, 1, -1, -1)) for n in inputs),
        outputs=tuple(TensorSpec(name=n, dtype="UINT8", shape=(*lead, 1, -1, -1)) for n in outputs),
        max_batch_size=max_batch_size,
        metadata=metadata or {},
    )


def round_trip(sig: ModelSignature, options: ConfigOptions) -> tuple[ModelSignature, ConfigOptions]:
    config = parse_config(render_config(sig, options), name=sig.name)
    return signature_from_config(config), options_from_config(config)


def test_max_batch_size_zero_is_written_explicitly_where_protobuf_would_put_it() -> None:
    text = render_config(signature(), ConfigOptions())
    lines = text.splitlines()
    assert lines[:3] == ['name: "seg"', "max_batch_size: 0", "input {"]
    assert text.count("max_batch_size") == 1
    assert parse_config(text).max_batch_size == 0
    batched = render_config(signature(max_batch_size=8), ConfigOptions())
    assert batched.count("max_batch_size") == 1
    assert "max_batch_size: 8\n" in batched


def test_flavours_set_platform_or_backend_and_where_the_torchscript_file_is_named() -> None:
    python = build_config(signature(), ConfigOptions(flavor="python", model_filename="net.ts"))
    assert (python.backend, python.platform, python.default_model_filename) == ("python", "", "")
    assert python.parameters["torchscript_filename"].string_value == "net.ts"
    libtorch = build_config(signature(), ConfigOptions(flavor="libtorch", model_filename="net.ts"))
    assert (libtorch.backend, libtorch.platform, libtorch.default_model_filename) == ("", "pytorch_libtorch", "net.ts")
    assert libtorch.parameters["INFERENCE_MODE"].string_value == "true"
    assert "torchscript_filename" not in libtorch.parameters


OPTIONS = [
    ConfigOptions(),
    ConfigOptions(flavor="libtorch"),
    ConfigOptions(
        flavor="python",
        dynamic_batching=DynamicBatching(preferred_batch_sizes=(2, 4), max_queue_delay_us=100),
        instance_groups=(InstanceGroup(kind="cpu", count=3), InstanceGroup(kind="KIND_GPU")),
        version_policy=VersionPolicy(latest=2),
        parameters={"custom": "value"},
    ),
    ConfigOptions(flavor="libtorch", version_policy=VersionPolicy(all=True), parameters={"INFERENCE_MODE": "false"}),
    ConfigOptions(flavor="libtorch", dynamic_batching=DynamicBatching(), version_policy=VersionPolicy(specific=(3,))),
]


@pytest.mark.parametrize(
    ("options", "max_batch_size"),
    [(o, m) for o in OPTIONS for m in (0, 4) if m or o.dynamic_batching is None],  # batching needs m > 0
)
def test_round_trip_gives_back_the_signature_and_options(options: ConfigOptions, max_batch_size: int) -> None:
    sig = signature(max_batch_size=max_batch_size, metadata={"network_data_format": {"inputs": {}}, "name": 'q"x'})
    assert round_trip(sig, options) == (sig, options)


def test_monai_metadata_travels_as_json_in_parameters() -> None:
    meta = {"name": "spleen", "network_data_format": {"outputs": {"pred": {"channel_def": {"0": "background"}}}}}
    config = build_config(signature(metadata=meta), ConfigOptions())
    assert json.loads(config.parameters["monai_metadata"].string_value) == meta
    assert "monai_metadata" not in build_config(signature(), ConfigOptions()).parameters


@pytest.mark.parametrize(
    ("options", "max_batch_size", "message"),
    [
        (ConfigOptions(dynamic_batching=DynamicBatching()), 0, "dynamic batching needs max_batch_size > 0, got 0"),
        (ConfigOptions(dynamic_batching=DynamicBatching(preferred_batch_sizes=(4, 16))), 8,
         r"preferred batch sizes \[16\] exceed max_batch_size 8"),
    ],
    ids=["no-batching", "too-big"],
)  # fmt: skip
def test_dynamic_batching_must_fit_max_batch_size(options: ConfigOptions, max_batch_size: int, message: str) -> None:
    with pytest.raises(ConfigError, match=f"model 'seg': {message}"):
        render_config(signature(max_batch_size=max_batch_size), options)


@pytest.mark.parametrize(
    ("make", "message"),
    [
        (lambda: ConfigOptions(flavor="onnx"), "flavor must be one of python, libtorch, onnxruntime, got 'onnx'"),
        (lambda: InstanceGroup(kind="tpu"), "instance kind must be one of"),
        (lambda: InstanceGroup(count=0), "instance count must be >= 1, got 0"),
        (lambda: DynamicBatching(preferred_batch_sizes=(0,)), r"preferred_batch_sizes must be >= 1, got \[0\]"),
        (lambda: DynamicBatching(max_queue_delay_us=-1), "max_queue_delay_us must be >= 0, got -1"),
        (lambda: VersionPolicy(), "set exactly one of latest, all, specific"),
        (lambda: VersionPolicy(latest=1, all=True), "set exactly one of latest, all, specific"),
        (lambda: VersionPolicy(specific=(0,)), "versions must be >= 1"),
        (lambda: ConfigOptions(model_filename="../model.pt"), "must be a plain file name"),
        (lambda: ConfigOptions(model_filename="model.py"), "must be a plain file name other than model.py"),
        (lambda: ConfigOptions(parameters={"monai_metadata": "{}"}), r"parameters \['monai_metadata'\] are set by"),
    ],
)
def test_options_are_validated_naming_the_field(make: object, message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        make()  # type: ignore[operator]


def test_instance_kinds_are_normalised() -> None:
    assert [InstanceGroup(kind=k).kind for k in ("cpu", "GPU", "kind_auto")] == ["KIND_CPU", "KIND_GPU", "KIND_AUTO"]


# -- libtorch naming rules ------------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("inputs", "outputs", "forward"),
    [
        (("INPUT__0", "INPUT__1"), ("OUTPUT__0", "OUTPUT__1"), None),
        (("image", "offset"), ("OUTPUT__0", "prob__1"), ("image", "offset", "flag")),
    ],
)
def test_libtorch_names_that_map_by_name(inputs: tuple, outputs: tuple, forward: tuple | None) -> None:
    assert libtorch_naming(signature(inputs=inputs, outputs=outputs), forward) == []


@pytest.mark.parametrize(
    ("inputs", "outputs", "forward", "warning"),
    [
        (("INPUT_0",), ("OUTPUT_0",), ("x",), "maps outputs ['OUTPUT_0'] by their order in config.pbtxt"),
        (("INPUT_0",), ("OUTPUT_0",), ("x",), "maps inputs ['INPUT_0'] by their order in config.pbtxt (they are"),
        (("image", "mask"), ("OUTPUT__0",), ("x", "y"), "neither forward() argument names ['x', 'y'] nor INPUT__0"),
        (("INPUT__0", "mask"), ("OUTPUT__0",), None, "by name if they are forward() argument names, else by their"),
        (("x",), ("probs",), None, "maps outputs ['probs'] by their order"),
        (("a__b__0",), ("OUTPUT__0",), None, "inputs ['a__b__0'] by name if"),  # Triton splits at the first '__'
    ],
    ids=["app-sdk-outputs", "app-sdk-inputs", "not-forward", "mixed", "dict-keys", "double-underscore"],
)
def test_libtorch_names_that_map_by_config_order_are_a_warning(
    inputs: tuple, outputs: tuple, forward: tuple | None, warning: str
) -> None:
    found = libtorch_naming(signature(inputs=inputs, outputs=outputs), forward)
    assert any(warning in w for w in found), found
    render_config(signature(inputs=inputs, outputs=outputs), ConfigOptions(flavor="libtorch"))  # written all the same


@pytest.mark.parametrize(
    ("inputs", "outputs", "message"),
    [
        (("x",), ("OUTPUT__1", "OUTPUT__0"), r"output names \['OUTPUT__1', 'OUTPUT__0'\] by the number after '__'"),
        (("INPUT__1", "INPUT__0"), ("OUTPUT__0",), r"input names \['INPUT__1', 'INPUT__0'\] by the number"),
        (("x",), ("OUTPUT__3",), r"expected OUTPUT__0..OUTPUT__0 in order"),
    ],
    ids=["output-order", "input-order", "index-out-of-range"],
)
def test_libtorch_names_it_would_route_to_another_tensor_are_refused(
    inputs: tuple, outputs: tuple, message: str
) -> None:
    sig = signature(inputs=inputs, outputs=outputs)
    with pytest.raises(ConfigError, match=message):
        libtorch_naming(sig)
    with pytest.raises(ConfigError, match=message):
        render_config(sig, ConfigOptions(flavor="libtorch"))


def test_named_index_reads_names_as_triton_does() -> None:
    assert [named_index(n) for n in ("INPUT__0", "out__12", "INPUT_0", "a__b__0", "x__", "__3")] == [
        0, 12, None, None, None, 3,
    ]  # fmt: skip


def test_rename_checks_count_validity_and_uniqueness() -> None:
    sig = signature(inputs=("image",), outputs=("OUTPUT__0",))
    renamed = rename(sig, ["INPUT_0"], ["OUTPUT_0"])
    assert (renamed.input_names, renamed.output_names) == (("INPUT_0",), ("OUTPUT_0",))
    assert renamed.inputs[0].shape == sig.inputs[0].shape
    with pytest.raises(ConfigError, match=r"has 1 input\(s\) \['image'\], got 2 input name\(s\)"):
        rename(sig, ["a", "b"])
    with pytest.raises(ConfigError, match=r"output names \['0ut'\] are not valid tensor names"):
        rename(sig, None, ["0ut"])
    two = signature(inputs=("a", "b"))
    with pytest.raises(ConfigError, match="repeat a name"):
        rename(two, ["x", "x"])


# -- parsing configs written elsewhere ----------------------------------------------------------------
HAND_WRITTEN = """
name: "spleen"
platform: "onnxruntime_onnx"
max_batch_size: 0
input [ { name: "INPUT_0" data_type: TYPE_FP32 dims: [ -1, 1, 96, 96, 96 ] } ]
output [ { name: "OUTPUT_0" data_type: TYPE_STRING dims: [ 1 ] } ]
"""


def test_a_hand_written_config_for_another_backend_still_gives_a_signature() -> None:
    config = parse_config(HAND_WRITTEN)
    sig = signature_from_config(config, version=2)
    assert sig.inputs == (TensorSpec(name="INPUT_0", dtype="FP32", shape=(-1, 1, 96, 96, 96)),)
    assert sig.outputs == (TensorSpec(name="OUTPUT_0", dtype="BYTES", shape=(1,)),)
    assert (sig.version, sig.max_batch_size, dict(sig.metadata)) == (2, 0, {})
    assert options_from_config(config).flavor == "onnxruntime"  # Triton's ONNX Runtime backend: written for .onnx
    other = parse_config(HAND_WRITTEN.replace("onnxruntime_onnx", "tensorrt_plan"))
    with pytest.raises(ConfigError, match="platform/backend 'tensorrt_plan' is not one this package writes"):
        options_from_config(other)


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("name: 'x' max_batch_size: banana", "not a valid Triton model configuration"),
        ("max_batch_size: 0", "the configuration has no name"),
        ('name: "x" input { name: "a" dims: [1] } output { name: "b" data_type: TYPE_FP32 dims: [1] }',
         "input 'a': data_type is missing or TYPE_INVALID"),
        ('name: "x" input { name: "a" data_type: TYPE_FP32 } output { name: "b" data_type: TYPE_FP32 dims: [1] }',
         "input 'a': dims are empty"),
        ('name: "x" parameters { key: "monai_metadata" value { string_value: "[1]" } } ' + HAND_WRITTEN[15:],
         "must hold a JSON object"),
    ],
    ids=["syntax", "no-name", "no-dtype", "no-dims", "metadata-not-object"],
)  # fmt: skip
def test_invalid_configs_are_config_errors(text: str, message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        signature_from_config(parse_config(text))


def test_the_name_must_match_the_model_folder_and_an_omitted_name_is_filled_in(tmp_path) -> None:
    path = tmp_path / "config.pbtxt"
    path.write_text(HAND_WRITTEN)
    with pytest.raises(ConfigError, match="name 'spleen' does not match the model folder 'liver'"):
        read_config(path, name="liver")
    path.write_text(HAND_WRITTEN.replace('name: "spleen"', ""))
    assert read_config(path, name="liver").name == "liver"
    with pytest.raises(ModelNotFoundError, match="no model configuration"):
        read_config(tmp_path / "missing.pbtxt")
