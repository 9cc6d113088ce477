"""Probing: a model without metadata is run to learn names, dtypes and which dims may change."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest
import torch

from monai_triton_ops.errors import ConfigError
from monai_triton_ops.repository.describe import describe_model
from monai_triton_ops.signature import TensorSpec

from ..conftest import nd_format, tiny_unet
from .conftest import UNET16_META, FixedDepth, FixedShape


def specs(path: Path, **options: object) -> tuple[tuple[TensorSpec, ...], tuple[TensorSpec, ...]]:
    signature = describe_model(path, "m", **options).signature  # type: ignore[arg-type]
    return signature.inputs, signature.outputs


def test_a_unet_gets_dynamic_batch_and_spatial_dims_and_a_fixed_channel(model_files: dict[str, Path]) -> None:
    inputs, outputs = specs(model_files["unet_probed"], input_shapes=[(1, 1, 16, 16, 16)])
    assert inputs == (TensorSpec(name="x", dtype="FP32", shape=(-1, 1, -1, -1, -1)),)
    assert outputs == (TensorSpec(name="OUTPUT__0", dtype="FP32", shape=(-1, 3, -1, -1, -1)),)


def test_two_inputs_two_outputs_of_different_dtypes(model_files: dict[str, Path]) -> None:
    inputs, outputs = specs(
        model_files["two_in_two_out"], input_shapes=[(1, 2, 4, 4), (1, 1)], input_dtypes=["float32", "int64"]
    )
    assert inputs == (
        TensorSpec(name="image", dtype="FP32", shape=(-1, 2, -1, -1)),
        TensorSpec(name="offset", dtype="INT64", shape=(-1, 1)),
    )
    assert outputs == (
        TensorSpec(name="OUTPUT__0", dtype="FP32", shape=(-1, 2, -1, -1)),
        TensorSpec(name="OUTPUT__1", dtype="BOOL", shape=(-1, 2, -1, -1)),
    )


def test_dict_outputs_are_named_by_their_keys_in_order(model_files: dict[str, Path]) -> None:
    _, outputs = specs(model_files["dict_output"], input_shapes=[(1, 3, 4, 4)])
    assert [(s.name, s.dtype, s.shape) for s in outputs] == [
        ("probs", "FP32", (-1, 3, -1, -1)),
        ("labels", "UINT8", (-1, 1, -1, -1)),
    ]


def test_dict_keys_that_are_not_valid_names_become_output_indices(make_model: Callable[..., Path]) -> None:
    class BadKeys(torch.nn.Module):
        def forward(self, x: torch.Tensor) -> dict[str, torch.Tensor]:
            return {"class probs": x, "2nd": x + 1}

    _, outputs = specs(make_model(BadKeys()), input_shapes=[(1, 1, 4)])
    assert [s.name for s in outputs] == ["OUTPUT__0", "OUTPUT__1"]


def test_a_fixed_shape_model_keeps_every_dim(model_files: dict[str, Path]) -> None:
    inputs, outputs = specs(model_files["fixed_shape"], input_shapes=[(1, 1, 4, 4)])
    assert inputs[0].shape == (1, 1, 4, 4)
    assert outputs[0].shape == (1, 3)


def test_when_doubling_everything_fails_each_axis_is_probed_alone(make_model: Callable[..., Path]) -> None:
    inputs, outputs = specs(make_model(FixedDepth()), input_shapes=[(1, 2, 8, 4, 6)])
    assert inputs[0].shape == (-1, 2, 8, -1, -1)
    assert outputs[0].shape == (-1, 2, -1, -1)


def test_a_unet_that_needs_divisibility_by_16_is_probed_by_doubling(make_model: Callable[..., Path]) -> None:
    from monai.networks.nets import UNet

    torch.manual_seed(0)
    deep = UNet(spatial_dims=2, in_channels=1, out_channels=2, channels=(2, 2, 2, 2, 2), strides=(2, 2, 2, 2))
    inputs, outputs = specs(make_model(deep), input_shapes=[(1, 1, 16, 48)])  # +1 or +8 would break it
    assert inputs[0].shape == (-1, 1, -1, -1)
    assert outputs[0].shape == (-1, 2, -1, -1)


def test_max_batch_size_makes_the_batch_dim_implicit(model_files: dict[str, Path]) -> None:
    description = describe_model(model_files["unet_probed"], "m", input_shapes=[(1, 1, 16, 16, 16)], max_batch_size=4)
    assert description.signature.max_batch_size == 4
    assert description.signature.inputs[0].shape == (1, -1, -1, -1)
    assert description.signature.outputs[0].shape == (3, -1, -1, -1)


def test_a_model_that_cannot_batch_is_refused_with_a_batch_size(model_files: dict[str, Path]) -> None:
    with pytest.raises(ConfigError, match="model 'm' fails on a batch of 2; serve it with max_batch_size 0 or 1"):
        describe_model(model_files["fixed_shape"], "m", input_shapes=[(1, 1, 4, 4)], max_batch_size=4)


def test_the_example_must_fit_the_model(model_files: dict[str, Path]) -> None:
    with pytest.raises(ConfigError, match=r"model 'm' fails on inputs x \[1, 2, 16, 16, 16\] FP32 .*2 channels"):
        describe_model(model_files["unet_probed"], "m", input_shapes=[(1, 2, 16, 16, 16)])
    with pytest.raises(
        ConfigError, match=r"--input-shape gives 1 input\(s\), forward\(\) takes 2..2 \['image', 'offset'\]"
    ):
        describe_model(model_files["two_in_two_out"], "m", input_shapes=[(1, 2, 4, 4)])
    with pytest.raises(ConfigError, match=r"expected one input dtype per input shape \(1\), got 2"):
        describe_model(model_files["unet_probed"], "m", input_shapes=[(1, 1, 16, 16, 16)], input_dtypes=["a", "b"])
    with pytest.raises(ConfigError, match="unsupported dtype 'complex'"):
        describe_model(model_files["unet_probed"], "m", input_shapes=[(1, 1, 16, 16, 16)], input_dtypes=["complex"])


@pytest.mark.parametrize(
    ("body", "message"),
    [
        ("return x.sum()", "output 0 is a 0-d tensor"),
        ("return (x, x.shape[0])", "output 1 is of type int"),
        ("return x.reshape(-1) if x.shape[-1] > 4 else x", "rank changes with the input size"),
    ],
    ids=["scalar", "not-a-tensor", "rank-changes"],
)
def test_outputs_that_cannot_be_served(tmp_path: Path, body: str, message: str) -> None:
    source = tmp_path / "odd_model.py"
    source.write_text(
        "from typing import Any\nimport torch\n\n\nclass Odd(torch.nn.Module):\n"
        f"    def forward(self, x: torch.Tensor) -> Any:\n        {body}\n"
    )
    namespace: dict[str, object] = {}
    exec(compile(source.read_text(), str(source), "exec"), namespace)  # noqa: S102 - our own test source
    path = tmp_path / "odd.pt"
    torch.jit.save(torch.jit.script(namespace["Odd"]()), str(path))  # type: ignore[operator]
    with pytest.raises(ConfigError, match=message):
        describe_model(path, "odd", input_shapes=[(1, 1, 4)])


def test_metadata_served_with_batching_is_checked_on_a_batch_of_two(make_model: Callable[..., Path]) -> None:
    fixed = make_model(FixedShape(), nd_format({"x": (1, [4, 4], "float32")}, {"y": (3, [], "float32")}))
    assert describe_model(fixed, "fixed").verified
    with pytest.raises(ConfigError, match="model 'fixed' fails on a batch of 2"):
        describe_model(fixed, "fixed", max_batch_size=2)
    unet = describe_model(make_model(tiny_unet(), UNET16_META, name="unet.pt"), "unet", max_batch_size=2)
    assert unet.signature.inputs[0].shape == (1, -1, -1, -1)
