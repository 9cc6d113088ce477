"""``monai-triton convert``: a model as ONNX or as a ``torch.export`` program (``.pt2``), checked and written whole.

``source.py`` reads what is converted (TorchScript, ``.pt2``, or a bundle's network) with its MONAI metadata
and tensor names; ``export.py`` exports it with dynamic batch and spatial axes and carries the metadata over;
``run.py`` checks the result against the source on a probe input and writes it (or a whole bundle) all or
nothing. Used by the CLI only.
"""

from __future__ import annotations

from .run import TARGETS, Conversion, convert

__all__ = ["TARGETS", "Conversion", "convert"]
