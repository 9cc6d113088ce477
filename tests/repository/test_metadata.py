"""Where a signature comes from: metadata inside the file (TorchScript, .pt2), a bundle, then probing.

Metadata is checked against the model by one real run, and bad files fail with the error type that says why.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

import pytest
import torch

from monai_triton_ops.errors import ConfigError, ModelLoadError, ModelNotFoundError
from monai_triton_ops.repository.describe import describe_model
from monai_triton_ops.repository.metadata import (
    archive_format,
    example_size,
    read_bundle_metadata,
    read_torchscript_metadata,
    spatial_dim,
)
from monai_triton_ops.signature import TensorSpec

from ..conftest import TwoInTwoOut, nd_format, tiny_unet
from .conftest import UNET16_META

UNET_IN = TensorSpec(name="x", dtype="FP32", shape=(-1, 1, -1, -1, -1))
UNET_OUT = TensorSpec(name="OUTPUT__0", dtype="FP32", shape=(-1, 3, -1, -1, -1))


def test_metadata_in_torchscript_extra_files(model_files: dict[str, Path]) -> None:
    path = model_files["unet_meta"]
    assert read_torchscript_metadata(path) == UNET16_META
    description = describe_model(path, "unet")
    assert (description.source, description.model_format, description.verified) == (
        "model metadata", "torchscript", True,
    )  # fmt: skip
    assert description.signature.inputs == (UNET_IN,)
    assert description.signature.outputs == (UNET_OUT,)
    assert description.signature.metadata == UNET16_META


def test_metadata_in_a_pt2_archive(unet_pt2: Path) -> None:
    assert archive_format(unet_pt2) == "pt2"
    description = describe_model(unet_pt2, "unet")
    assert (description.source, description.model_format, description.verified) == ("model metadata", "pt2", True)
    assert description.signature.inputs == (UNET_IN,)
    assert description.signature.outputs == (UNET_OUT,)
    assert description.signature.metadata == UNET16_META


def test_a_static_pt2_without_metadata_is_probed_and_keeps_its_exported_shape(tmp_path: Path) -> None:
    path = tmp_path / "static.pt2"
    torch.export.save(torch.export.export(tiny_unet().eval(), (torch.zeros(1, 1, 16, 16, 16),)), str(path))
    description = describe_model(path, "static", input_shapes=[(1, 1, 16, 16, 16)])
    assert description.source == "probe"
    assert description.signature.inputs[0].shape == (1, 1, 16, 16, 16)  # exported without dynamic dims
    assert description.signature.outputs[0].shape == (1, 3, 16, 16, 16)


@pytest.mark.parametrize("given", ["folder", "file"])
def test_bundle_metadata_by_folder_or_file(plain_unet: Path, tmp_path: Path, given: str) -> None:
    (tmp_path / "bundle" / "configs").mkdir(parents=True)
    meta_file = tmp_path / "bundle" / "configs" / "metadata.json"
    meta_file.write_text(json.dumps({"version": "0.1", **UNET16_META}))
    path = tmp_path / "bundle" if given == "folder" else meta_file
    assert read_bundle_metadata(path)["version"] == "0.1"
    description = describe_model(plain_unet, "unet", bundle_metadata=path)
    assert (description.source, description.verified) == ("bundle metadata", True)
    assert description.signature.inputs == (UNET_IN,)
    assert description.signature.metadata["version"] == "0.1"


def test_bundle_metadata_that_differs_from_the_file_metadata_is_refused(
    model_files: dict[str, Path], tmp_path: Path
) -> None:
    other = tmp_path / "metadata.json"
    other.write_text(json.dumps(nd_format({"image": (2, [96] * 3, "float32")}, {"pred": (3, [96] * 3, "float32")})))
    with pytest.raises(ConfigError, match=r"network_data_format inside .* differs from the one in bundle metadata"):
        describe_model(model_files["unet_meta"], "unet", bundle_metadata=other)
    same = tmp_path / "same.json"
    same.write_text(json.dumps(UNET16_META))
    assert describe_model(model_files["unet_meta"], "unet", bundle_metadata=same).source == "model metadata"


def test_missing_or_broken_bundle_metadata(plain_unet: Path, tmp_path: Path) -> None:
    with pytest.raises(ModelNotFoundError, match=r"no bundle metadata at .*configs/metadata\.json"):
        describe_model(plain_unet, "unet", bundle_metadata=tmp_path)
    (tmp_path / "bad.json").write_text("{not json")
    with pytest.raises(ConfigError, match=r"metadata\.json is not valid JSON"):
        describe_model(plain_unet, "unet", bundle_metadata=tmp_path / "bad.json")


@pytest.mark.parametrize(
    ("entry", "dim", "smallest", "doubled"),
    [(96, 96, 96, 96), ("96", 96, 96, 96), ("16*n", -1, 16, 32), ("2**p*n", -1, 2, 8), ("8*n+4", -1, 12, 20),
     ("*", -1, None, None), (-1, -1, None, None), ("n-1", -1, None, None), ("2**1000", -1, None, None)],
)  # fmt: skip
def test_spatial_shape_entries(entry: object, dim: int, smallest: int | None, doubled: int | None) -> None:
    assert spatial_dim(entry) == dim
    assert example_size(entry) == smallest
    assert example_size(entry, 2) == doubled


def test_a_two_input_model_with_metadata_keeps_forward_names_and_dtypes(make_model: Callable[..., Path]) -> None:
    meta = nd_format(
        {"image": (2, [-1, -1], "float32"), "offset": (1, [], "int64")},
        {"doubled": (2, [-1, -1], "float32"), "positive": (2, [-1, -1], "bool")},
    )
    path = make_model(TwoInTwoOut(), meta)
    unchecked = describe_model(path, "two")
    assert not unchecked.verified  # "-1" implies no concrete size
    checked = describe_model(path, "two", input_shapes=[(1, 2, 3, 3), (1, 1)])
    assert checked.verified
    assert checked.signature == unchecked.signature
    assert [(s.name, s.dtype) for s in checked.signature.inputs] == [("image", "FP32"), ("offset", "INT64")]
    assert [(s.name, s.dtype) for s in checked.signature.outputs] == [("OUTPUT__0", "FP32"), ("OUTPUT__1", "BOOL")]


# -- metadata that contradicts the model ---------------------------------------------------------------
def two_channel_unet() -> torch.nn.Module:
    from monai.networks.nets import UNet

    torch.manual_seed(0)
    return UNet(spatial_dims=3, in_channels=2, out_channels=3, channels=(4, 8), strides=(2,), num_res_units=0)


def test_metadata_with_the_wrong_channel_count_names_model_tensor_and_shape(make_model: Callable[..., Path]) -> None:
    path = make_model(two_channel_unet(), UNET16_META)  # metadata says 1 input channel, the first conv needs 2
    with pytest.raises(ConfigError) as caught:
        describe_model(path, "liar")
    message = str(caught.value)
    assert "model 'liar' fails on inputs x [1, 1, 16, 16, 16] FP32 (shapes from the model metadata)" in message
    assert "to have 2 channels, but got 1 channels" in message


def test_metadata_with_the_wrong_number_of_outputs(make_model: Callable[..., Path]) -> None:
    meta = nd_format(
        {"image": (1, ["16*n"] * 3, "float32")}, {"a": (3, ["16*n"] * 3, "float32"), "b": (1, [], "int64")}
    )
    with pytest.raises(ConfigError, match=r"model 'liar': metadata declares 2 output\(s\) .* the model returns 1"):
        describe_model(make_model(tiny_unet(), meta), "liar")


@pytest.mark.parametrize(
    ("output", "message"),
    [
        ((3, ["16*n"] * 3, "uint8"), "output 'OUTPUT__0': metadata says dtype UINT8, the model returns FP32"),
        ((2, ["16*n"] * 3, "float32"), r"output 'OUTPUT__0': metadata says shape \[-1, 2, -1, -1, -1\], "
         r"the model returns \[1, 3, 16, 16, 16\]"),
        ((3, [16, 16, 16, 16], "float32"), r"output 'OUTPUT__0': metadata says shape \[-1, 3, 16, 16, 16, 16\]"),
    ],
    ids=["dtype", "channels", "rank"],
)  # fmt: skip
def test_metadata_with_a_wrong_output(make_model: Callable[..., Path], output: tuple, message: str) -> None:
    meta = nd_format({"image": (1, ["16*n"] * 3, "float32")}, {"pred": output})
    with pytest.raises(ConfigError, match=f"model 'liar' {message}"):
        describe_model(make_model(tiny_unet(), meta), "liar")


def test_input_shapes_and_dtypes_that_contradict_the_metadata(model_files: dict[str, Path]) -> None:
    path = model_files["unet_meta"]
    with pytest.raises(ConfigError, match=r"input 'x': metadata says shape \[-1, 1, -1, -1, -1\], got .*\[1, 2, 16"):
        describe_model(path, "unet", input_shapes=[(1, 2, 16, 16, 16)])
    with pytest.raises(ConfigError, match=r"metadata declares 1 input\(s\) \['x'\], got 2 input shape\(s\)"):
        describe_model(path, "unet", input_shapes=[(1, 1, 16, 16, 16), (1, 1)])
    with pytest.raises(ConfigError, match="input 'x': metadata says dtype FP32, got INT64"):
        describe_model(path, "unet", input_dtypes=["int64"])


def test_an_honest_small_expression_is_retried_at_larger_sizes(make_model: Callable[..., Path]) -> None:
    """'2*n' allows 2, on which this UNet's instance norm fails; 4 works, so the metadata stands."""
    meta = nd_format({"image": (1, ["2*n"] * 3, "float32")}, {"pred": (3, ["2*n"] * 3, "float32")})
    assert describe_model(make_model(tiny_unet(), meta), "unet").verified


# -- bad files and missing information ---------------------------------------------------------------
def test_no_metadata_and_no_example_shape_says_to_pass_input_shape(plain_unet: Path) -> None:
    with pytest.raises(ConfigError, match=r"carries no MONAI metadata .* pass --input-shape"):
        describe_model(plain_unet, "plain")


@pytest.mark.parametrize(
    ("content", "message"),
    [
        (b"not a model at all", "not a zip archive"),
        (b"PK\x03\x04 truncated", "not a zip archive"),
    ],
    ids=["text", "truncated-zip"],
)
def test_a_corrupt_file_is_a_model_load_error(tmp_path: Path, content: bytes, message: str) -> None:
    path = tmp_path / "model.pt"
    path.write_bytes(content)
    with pytest.raises(ModelLoadError, match=f"model 'corrupt': .*{message}"):
        describe_model(path, "corrupt", input_shapes=[(1, 1, 4, 4)])


def test_a_checkpoint_is_not_torchscript(tmp_path: Path) -> None:
    path = tmp_path / "weights.pt"
    torch.save(tiny_unet().state_dict(), path)
    with pytest.raises(ModelLoadError, match=r"neither TorchScript nor \.pt2 \(a torch\.save\(\) checkpoint\?\)"):
        describe_model(path, "weights", input_shapes=[(1, 1, 16, 16, 16)])


def test_a_missing_file_is_model_not_found(tmp_path: Path) -> None:
    with pytest.raises(ModelNotFoundError, match=r"model 'gone': model file .* does not exist"):
        describe_model(tmp_path / "nowhere.pt", "gone", input_shapes=[(1, 1, 4, 4)])
