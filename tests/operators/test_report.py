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
            "grpc (remote server at triton.example:8001 over gRPC)",
        ),
        (
            "https://triton.example:8000",
            "https (remote server at triton.example:8000 over HTTPS)",
        ),
        (
            "grpc://triton.example:8001?mode=volume",
            "grpc (remote server at triton.example:8001 over gRPC, whole volume to 'unet_volume')",
        ),
    ],
)
def test_where_and_how(spec: str, expected: str, unet_repo: Path) -> None:
    backend = create_backend(spec, "unet", model_repository=unet_repo)  # created, not opened: nothing connects
    assert describe_backend(backend) == expected


class _Kept(logging.Handler):
    def __init__(self) -> None:
        super().__init__(logging.INFO)
        self.messages: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.messages.append(record.getMessage())


def test_the_line(unet_repo: Path) -> None:
    """Read by a handler of the test's own: the run logger's propagation and pytest's capture of it depend on
    whether an earlier test ran an app in this process (run_app gives the logger its own handler)."""
    run_logger, kept = logging.getLogger(RUN_LOGGER), _Kept()
    backend = create_backend("torch", "unet", model_repository=unet_repo)
    level = run_logger.level
    run_logger.setLevel(logging.INFO)  # setLevel, not the attribute: the logger caches what is enabled
    run_logger.addHandler(kept)
    try:
        log_run("unet", backend, 1, 2.345)
    finally:
        run_logger.removeHandler(kept)
        run_logger.setLevel(level)
    assert kept.messages == [
        "model 'unet' ran on torch (TorchScript in this process, cpu): 1 image(s), inference 2.35 s"
    ]
