"""The run line: which backend ran the model, where, over which transport (the timing: tests/apps)."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest

from monai_triton_ops import create_backend
from monai_triton_ops.operators.report import RUN_LOGGER, describe_backend, log_run


@pytest.mark.parametrize(
    ("spec", "expected"),
    [
        ("torch", "torch (TorchScript in this process, cpu)"),
        ("triton", "triton (Triton server core in this process, C API)"),
        (
            "grpc://triton.example:8001",
            "grpc (remote Triton at triton.example:8001 over gRPC, tensors in the request body)",
        ),
        (
            "https://triton.example:8000",
            "https (remote Triton at triton.example:8000 over HTTPS, tensors in the request body)",
        ),
        (
            "grpc://triton.example:8001?mode=volume",
            "grpc (remote Triton at triton.example:8001 over gRPC, tensors in the request body, whole volume to "
            "'unet_volume')",
        ),
    ],
)
def test_where_and_how(spec: str, expected: str, unet_repo: Path) -> None:
    backend = create_backend(spec, "unet", model_repository=unet_repo)  # created, not opened: nothing connects
    assert describe_backend(backend) == expected


def test_the_line(unet_repo: Path, caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(logging.getLogger(RUN_LOGGER), "propagate", True)  # run_app gives it its own handler
    backend = create_backend("torch", "unet", model_repository=unet_repo)
    with caplog.at_level(logging.INFO, logger=RUN_LOGGER):
        log_run("unet", backend, 1, 2.345)
    assert caplog.messages == [
        "model 'unet' ran on torch (TorchScript in this process, cpu): 1 image(s), inference 2.35 s"
    ]
