"""The one line a run prints at the default log level: which backend ran the model, where, how, how long.

    model 'spleen_ct' ran on grpc (triton 2.51.0 at 127.0.0.1:8001 over gRPC, system shared memory): 1 image, 3.21 s
    model 'spleen_ct' ran on grpc (triton 2.51.0 at 10.0.0.5:8001 over gRPC, binary tensors, whole volume to
    'spleen_ct_volume'): 1 image, 2.75 s
    model 'spleen_ct' ran on http (kserve 0.21.0 at 10.0.0.7:8080 over HTTP, binary tensors): 1 image, 4.10 s

It is logged by ``monai_triton_ops.run`` at INFO, and that logger lets INFO through at the default
``-l WARN`` (``console.configure`` gives it its own level), so a successful run says what it did in
one line and ``-l ERROR`` silences it.
"""

from __future__ import annotations

import logging
from typing import Any

from ..backends.base import BaseBackend

#: The logger of the run line; ``console.configure`` sets it to INFO unless ``-l`` is ERROR or CRITICAL.
RUN_LOGGER = "monai_triton_ops.run"
logger = logging.getLogger(RUN_LOGGER)


def describe_backend(backend: BaseBackend) -> str:
    """Where and how a backend runs its model, in words, as the backend itself says (``BaseBackend.describe``)."""
    return backend.describe()


def log_run(model: str, backend: BaseBackend, images: int, seconds: float, **extra: Any) -> None:
    """The run line (INFO on ``monai_triton_ops.run``)."""
    details = "".join(f", {k} {v}" for k, v in extra.items())
    logger.info(
        "model %r ran on %s: %d image(s), inference %.2f s%s",
        model,
        describe_backend(backend),
        images,
        seconds,
        details,
    )
