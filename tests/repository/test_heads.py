"""A network's several outputs as named tensors and back: the layout ``repo build`` records and every client reads."""

from __future__ import annotations

import json
from typing import Any

import pytest
import torch

from monai_triton_ops.errors import ConfigError
from monai_triton_ops.repository.heads import check_layout, layout_of, rebuild, tensor_names
from monai_triton_ops.repository.runner.model import flatten_result, name_results

T = [torch.full((1, 2, 3), float(i)) for i in range(6)]


@pytest.mark.parametrize(
    ("result", "names"),
    [
        ((T[0], T[1]), ["pred", "aux"]),  # a tuple of the bundle's outputs
        ([T[0], T[1], T[2]], ["pred"]),  # use_list_output: pred_0, pred_1, pred_2
        ({"nucleus": T[0], "hv": T[1], "type": T[2]}, ["nucleus", "hv", "type"]),  # HoVerNet's heads
        ({"classification": [T[0], T[1]], "box_regression": [T[2], T[3]]}, ["pred"]),  # RetinaNet's levels
    ],
    ids=["tuple", "list", "dict", "dict-of-lists"],
)
def test_the_structure_comes_back_exactly_through_the_runners_names(result: Any, names: list[str]) -> None:
    """What the server names (the runner flattens depth-first) the client rebuilds: same types, keys in order."""
    layout = json.loads(json.dumps(layout_of(result, names), sort_keys=True))  # as config.pbtxt carries it
    served = name_results("m", tensor_names(layout), result)
    assert list(served.values()) == flatten_result("m", result)
    back = rebuild(layout, served)
    assert type(back) is type(result)
    if isinstance(result, dict):
        assert list(back) == list(result)  # the network's key order, though the metadata's keys are sorted
    for got, want in zip(flatten_result("m", back), flatten_result("m", result), strict=True):
        assert got is want


def test_names_are_the_keys_and_levels() -> None:
    layout = layout_of({"classification": [T[0], T[1]], "box regression": [T[2], T[3]]}, ["pred"])
    assert tensor_names(layout) == ["classification_0", "classification_1", "box_regression_0", "box_regression_1"]
    assert tensor_names(layout_of([T[0], T[1]], ["pred"])) == ["pred_0", "pred_1"]
    assert layout_of(T[0], ["pred"]) == "pred"


def test_a_layout_that_does_not_fit_the_models_outputs_is_refused() -> None:
    layout = layout_of({"a": T[0], "b": T[1]}, ["a", "b"])
    assert check_layout(layout, ["b", "a"]) == layout
    with pytest.raises(ConfigError, match="names tensors \\['a', 'b'\\], the model's outputs are \\['a'\\]"):
        check_layout(layout, ["a"])
    with pytest.raises(ConfigError, match="is not an output layout"):
        check_layout({"set": ["a"]}, ["a"])
