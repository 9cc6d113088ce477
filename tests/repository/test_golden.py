"""Generated config.pbtxt text, pinned: any change to what we write shows up as a golden-file diff.

Regenerate deliberately with ``UPDATE_GOLDEN=1 pytest tests/repository/test_golden.py`` and review the diff.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest

from monai_triton_ops.repository.builder import generate_config
from monai_triton_ops.repository.config import (
    DynamicBatching,
    InstanceGroup,
    VersionPolicy,
    options_from_config,
    parse_config,
    signature_from_config,
)

from .conftest import CASES, GOLDEN

#: golden name -> (case, extra generate_config keywords)
GOLDENS: dict[str, tuple[str, dict[str, object]]] = {
    "unet_meta_python": ("unet_meta", {}),
    "unet_meta_libtorch": ("unet_meta", {"flavor": "libtorch"}),
    "unet_probed_python": ("unet_probed", {}),
    "two_in_two_out_python": ("two_in_two_out", {}),
    "two_in_two_out_libtorch": ("two_in_two_out", {"flavor": "libtorch"}),
    "dict_output_python": ("dict_output", {}),
    "fixed_shape_python": ("fixed_shape", {}),
    "fixed_shape_libtorch": ("fixed_shape", {"flavor": "libtorch"}),
    "batched_python": ("batched", {}),
    "unet_batched_libtorch_options": (
        "unet_meta",
        {
            "flavor": "libtorch",
            "max_batch_size": 4,
            "dynamic_batching": DynamicBatching(preferred_batch_sizes=(2, 4), max_queue_delay_us=500),
            "instance_groups": (InstanceGroup(kind="gpu", count=2), InstanceGroup(kind="cpu")),
            "version_policy": VersionPolicy(specific=(1, 3)),
        },
    ),
}


@pytest.mark.parametrize("golden_name", sorted(GOLDENS))
def test_generated_config_matches_its_golden_file_and_parses_back(
    golden_name: str, model_files: dict[str, Path], golden: Callable[[str, str], None]
) -> None:
    case_name, extra = GOLDENS[golden_name]
    case = CASES[case_name]
    signature, options, text = generate_config(model_files[case_name], case_name, **{**case.build, **extra})
    golden(golden_name, text)
    config = parse_config(text, name=case_name)
    assert signature_from_config(config) == signature
    assert options_from_config(config) == options


def test_every_golden_file_is_generated_by_a_test() -> None:
    """A stale golden file (its case renamed or removed) would otherwise pin nothing."""
    elsewhere = ["unet_volume"]  # test_volume.py: the whole-volume model repo wrap writes
    assert sorted(p.stem for p in GOLDEN.glob("*.pbtxt")) == sorted([*GOLDENS, *elsewhere])
