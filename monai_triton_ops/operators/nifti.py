"""NIfTI in and out as App SDK ``Image`` objects with their affine: public API for apps.

The App SDK's own ``NiftiDataLoader`` emits a bare array without the affine (and needs SimpleITK),
so a NIfTI output could not keep the input's geometry. These operators use the same conventions as
the App SDK's DICOM series-to-volume operator: the array in ``(D, H, W)`` order, channels last
(``(D, H, W, C)``), and the voxel-to-RAS affine under ``affine`` / ``nifti_affine_transform``, so
one inference operator serves both paths.

A 4D NIfTI ``(X, Y, Z, C)`` is read as ``C`` channels (a 5D ``(X, Y, Z, 1, C)`` vector image too):
only the spatial axes are reversed, the channel axis stays last. Both operators check their path
when the graph is composed, so a missing input or an unwritable output folder fails before anything
runs.
"""

from __future__ import annotations

import logging
import os
import tempfile
from pathlib import Path
from typing import Any

import nibabel as nib
import numpy as np
from monai.deploy.core import Fragment, Image, OperatorSpec
from monai.deploy.core import Operator as SdkOperator

from ..errors import InputDataError
from ..pipeline.image import affine_of
from ..pipeline.inputs import NIFTI_SUFFIXES
from ..preflight import check_input, check_output_folder

logger = logging.getLogger(__name__)


def is_nifti(path: Path) -> bool:
    return path.name.endswith(NIFTI_SUFFIXES)


def read_nifti(path: Path) -> Image:
    """A NIfTI file as an App SDK ``Image``: ``(D, H, W)`` float32 array plus affine and spacing."""
    if not path.is_file() or not is_nifti(path):
        raise InputDataError(f"{str(path)!r} is not a NIfTI file (.nii or .nii.gz)")
    try:
        volume = nib.load(str(path))
        if not isinstance(volume, nib.Nifti1Image | nib.Nifti2Image):
            raise InputDataError(f"{str(path)!r} is a {type(volume).__name__}, not a NIfTI image")
        data = _channels_last(np.asarray(volume.dataobj, dtype=np.float32), path)
    except InputDataError:
        raise
    except Exception as exc:  # nibabel raises many types for damaged files
        raise InputDataError(f"{str(path)!r} cannot be read as NIfTI: {exc}") from exc
    affine = np.asarray(volume.affine, dtype=np.float64)
    spacing = np.sqrt((affine[:3, :3] ** 2).sum(axis=0))
    metadata = {
        "affine": affine,
        "nifti_affine_transform": affine,
        "row_pixel_spacing": float(spacing[0]),
        "col_pixel_spacing": float(spacing[1]),
        "depth_pixel_spacing": float(spacing[2]),
        "source_path": str(path),
    }
    return Image(np.ascontiguousarray(_swap_spatial(data)), metadata=metadata)


def _channels_last(data: np.ndarray, path: Path) -> np.ndarray:
    """NIfTI data as ``(X, Y, Z)`` or ``(X, Y, Z, C)``: a 5D vector image drops its time axis of 1."""
    if data.ndim == 5 and data.shape[3] == 1:
        data = data[:, :, :, 0, :]
    if not 2 <= data.ndim <= 4:
        raise InputDataError(
            f"{str(path)!r}: a NIfTI of shape {list(data.shape)} is not an image this reader knows "
            "(2D, 3D, 4D with channels last, or 5D (X, Y, Z, 1, C))"
        )
    return data


def _swap_spatial(data: np.ndarray) -> np.ndarray:
    """NIfTI ``(X, Y, Z[, C])`` <-> App SDK ``(D, H, W[, C])``: the spatial axes reversed, a channel axis kept last."""
    if data.ndim == 4:
        return np.transpose(data, (2, 1, 0, 3))
    return data.T


def write_nifti(image: Image, path: Path, *, dtype: np.dtype[Any] | type = np.uint8) -> Path:
    """Write ``image`` (``(D, H, W[, C])`` order) with its affine; atomic, so no half-written file is left."""
    data = _swap_spatial(np.asarray(image.asnumpy())).astype(dtype)
    affine = _affine_for(data.shape[:3], image.metadata() or {})
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=".tmp-", suffix="".join(path.suffixes))
    os.close(fd)
    os.chmod(tmp, 0o644)  # mkstemp makes owner-only files; outputs are for the whole team
    try:
        volume = nib.Nifti1Image(data, np.eye(4) if affine is None else affine)  # type: ignore[no-untyped-call]
        nib.save(volume, tmp)
        os.replace(tmp, path)
    finally:
        Path(tmp).unlink(missing_ok=True)
    logger.info("wrote %s %s", path, data.shape)
    return path


class NiftiImageLoader(SdkOperator):  # type: ignore[misc]
    """Emits the NIfTI file at ``input_path`` as an ``Image`` on port ``image``.

    Give it ``CountCondition(app, 1)`` to read the file once; without a condition the App SDK
    calls ``compute`` again and again, and the graph never stops.
    """

    def __init__(self, fragment: Fragment, *args: Any, input_path: str | os.PathLike[str], **kwargs: Any) -> None:
        self.input_path = check_input(input_path)
        if not self.input_path.is_file() or not is_nifti(self.input_path):
            raise InputDataError(f"input {str(self.input_path)!r} is not a NIfTI file (.nii or .nii.gz)")
        super().__init__(fragment, *args, **kwargs)

    def setup(self, spec: OperatorSpec) -> None:
        spec.output("image")

    def compute(self, op_input: Any, op_output: Any, context: Any) -> None:
        op_output.emit(read_nifti(self.input_path), "image")


class NiftiImageWriter(SdkOperator):  # type: ignore[misc]
    """Writes the ``Image`` on port ``seg_image`` to ``output_folder/filename`` (uint8) with its affine."""

    def __init__(
        self,
        fragment: Fragment,
        *args: Any,
        output_folder: str | os.PathLike[str],
        filename: str = "seg.nii.gz",
        **kwargs: Any,
    ) -> None:
        self.output_path = check_output_folder(output_folder) / filename
        super().__init__(fragment, *args, **kwargs)

    def setup(self, spec: OperatorSpec) -> None:
        spec.input("seg_image")

    def compute(self, op_input: Any, op_output: Any, context: Any) -> None:
        write_nifti(op_input.receive("seg_image"), self.output_path)


def _affine_for(shape: tuple[int, ...], metadata: dict[str, Any]) -> np.ndarray | None:
    """The affine of the grid ``shape`` is on.

    A bundle's output ``Image`` carries the pre-processed input's metadata (as the App SDK's bundle operator
    gives it): ``affine`` is the resampled grid's, while ``Invertd`` has put the labels back on the input's grid,
    whose affine is ``original_affine`` and whose shape is ``spatial_shape``. Labels of the input's shape get
    that one; anything else the ``affine`` (``nifti_affine_transform``) as before.
    """
    original, spatial = metadata.get("original_affine"), metadata.get("spatial_shape")
    if original is not None and spatial is not None and tuple(int(s) for s in np.asarray(spatial)) == tuple(shape):
        fixed = np.asarray(original, dtype=np.float64)
        if fixed.shape == (4, 4):
            return fixed
    return affine_of(metadata)
