"""The committed sample repository served in-process through the binding: the same answer as TorchScript."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
import pytest
import torch

from .harness import REPO_ROOT, Started, infer

pytestmark = pytest.mark.triton
REPOSITORY = REPO_ROOT / "model_repository"
NAME = "brain_tissue_seg"


@pytest.fixture(scope="module")
def started(make_server: Callable[..., Started]) -> Started:
    return make_server(REPOSITORY, models=(NAME,))


def test_sample_model_matches_torchscript(started: Any) -> None:
    x = np.random.default_rng(0).standard_normal((1, 1, 32, 32, 32)).astype(np.float32)
    out = infer(started.server, NAME, {"x": x})["OUTPUT__0"]
    with torch.inference_mode():
        expected = torch.jit.load(str(REPOSITORY / NAME / "1" / "model.pt")).eval()(torch.from_numpy(x)).numpy()
    assert out.shape == (1, 3, 32, 32, 32)
    np.testing.assert_allclose(out, expected, rtol=1e-4, atol=1e-5)
    assert np.array_equal(out.argmax(1), expected.argmax(1))
    config = started.server.model_config(NAME).json()
    assert "monai_metadata" in config["parameters"]
