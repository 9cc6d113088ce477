"""2D images (PNG, JPEG) in as App SDK ``Image`` objects, one per ``compute()``: public API for apps.

The model zoo's classification bundles take image files (``breast_density_classification`` JPEGs,
``endoscopic_inbody_classification`` frames) and read them with ``LoadImaged``, which the bundle operator
drops (the image arrives in memory). ``read_image_2d`` therefore reads a file exactly as that ``LoadImaged``
does (MONAI's ``LoadImage``, which picks its ``PILReader`` for these suffixes): the same array, ``(W, H, C)``
for colour, ``(W, H)`` for grey, and the same metadata (``affine``, ``original_channel_dim``,
``spatial_shape``, ``filename_or_obj``...), so the bundle's pre-processing sees what MONAI alone gives it.

``Image2DLoader`` emits the files of a folder (or one file) in name order on port ``image``, each file's stem on
port ``filename`` (for ``JSONResultsWriter``); give it ``CountCondition(app, loader.count)``. A file that
cannot be read is one error naming it, raised when the graph is composed for a file given by name, else when
that file's turn comes.
"""

from __future__ import annotations

import logging
import os
from pathlib import Path
from typing import Any

import numpy as np
from monai.deploy.core import Fragment, Image, OperatorSpec
from monai.deploy.core import Operator as SdkOperator

from ..errors import InputDataError
from ..preflight import check_input

logger = logging.getLogger(__name__)

#: The suffixes read as 2D images (MONAI's ``PILReader``'s).
SUFFIXES = (".png", ".jpg", ".jpeg", ".bmp")


def is_image_2d(path: Path) -> bool:
    return path.suffix.lower() in SUFFIXES


def image_files(path: Path) -> list[Path]:
    """``path`` itself (a 2D image file), or the 2D image files directly in the folder ``path``, by name."""
    if path.is_file():
        if not is_image_2d(path):
            raise InputDataError(f"input {str(path)!r} is not a 2D image file ({', '.join(SUFFIXES)})")
        return [path]
    files = sorted(p for p in path.iterdir() if p.is_file() and is_image_2d(p)) if path.is_dir() else []
    if not files:
        raise InputDataError(f"input folder {str(path)!r} holds no 2D image file ({', '.join(SUFFIXES)})")
    return files


def read_image_2d(path: Path) -> Image:
    """``path`` as the bundle's ``LoadImaged`` reads it: the array and its metadata as an App SDK ``Image``."""
    from monai.transforms import LoadImage

    try:
        loaded = LoadImage(image_only=True)(str(path))
    except Exception as exc:  # PIL and MONAI raise many kinds for a damaged or foreign file
        cause = " ".join(str(exc).split())[:200] or type(exc).__name__
        raise InputDataError(f"{str(path)!r} cannot be read as a 2D image (PNG, JPEG): {cause}") from None
    array = np.asarray(loaded.detach().cpu().numpy())
    metadata = dict(getattr(loaded, "meta", {}) or {})
    metadata["source_path"] = str(path)
    return Image(array, metadata=metadata)


class Image2DLoader(SdkOperator):  # type: ignore[misc]
    """Emits the 2D image files at ``input_path`` (a file or a folder) one per ``compute()``: ``image``, ``filename``.

    ``count`` is how many there are: give the loader ``CountCondition(app, loader.count)``, or the App SDK calls
    ``compute`` again after the last one and the loader says so.
    """

    def __init__(self, fragment: Fragment, *args: Any, input_path: str | os.PathLike[str], **kwargs: Any) -> None:
        self.files = image_files(check_input(input_path))
        if len(self.files) == 1:  # one file named: a file it cannot read fails before the graph runs
            self._first: Image | None = read_image_2d(self.files[0])
        else:
            self._first = None
        self._next = 0
        super().__init__(fragment, *args, **kwargs)

    @property
    def count(self) -> int:
        return len(self.files)

    def setup(self, spec: OperatorSpec) -> None:
        spec.output("image")
        spec.output("filename")

    def compute(self, op_input: Any, op_output: Any, context: Any) -> None:
        if self._next >= len(self.files):
            raise InputDataError(
                f"all {len(self.files)} images are read; give the loader CountCondition(app, {len(self.files)})"
            )
        path = self.files[self._next]
        image = self._first if self._next == 0 and self._first is not None else read_image_2d(path)
        self._next += 1
        logger.info("image %d of %d: %s %s", self._next, len(self.files), path.name, list(image.asnumpy().shape))
        op_output.emit(image, "image")
        op_output.emit(path.stem, "filename")
