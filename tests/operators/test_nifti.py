"""NIfTI to App SDK Image and back: geometry survives, writes are atomic."""

from __future__ import annotations

from pathlib import Path

import nibabel as nib
import numpy as np
import pytest
from monai.deploy.core import Image

from monai_triton_ops.errors import InputDataError
from monai_triton_ops.operators.nifti import read_nifti, write_nifti


def test_read_then_write_keeps_shape_affine_and_values(tmp_path: Path) -> None:
    data = np.arange(4 * 5 * 6, dtype=np.int16).reshape(4, 5, 6)
    affine = np.array([[-1.0, 0, 0, 90], [0, 1.5, 0, -126], [0, 0, 2.0, -72], [0, 0, 0, 1]])
    nib.save(nib.Nifti1Image(data, affine), tmp_path / "in.nii.gz")
    image = read_nifti(tmp_path / "in.nii.gz")
    assert image.asnumpy().shape == (6, 5, 4)  # App SDK order (D, H, W)
    assert image.metadata()["depth_pixel_spacing"] == pytest.approx(2.0)
    out = write_nifti(image, tmp_path / "out" / "seg.nii.gz", dtype=np.int16)
    written = nib.load(out)
    np.testing.assert_array_equal(np.asarray(written.dataobj), data)
    np.testing.assert_allclose(written.affine, affine)
    assert [p.name for p in out.parent.iterdir()] == ["seg.nii.gz"]  # no temp file left


def test_write_without_affine_uses_identity(tmp_path: Path) -> None:
    out = write_nifti(Image(np.ones((2, 3, 4), np.uint8), metadata={}), tmp_path / "seg.nii.gz")
    np.testing.assert_array_equal(nib.load(out).affine, np.eye(4))


def test_unreadable_nifti_is_an_input_data_error(tmp_path: Path) -> None:
    broken = tmp_path / "broken.nii.gz"
    broken.write_bytes(b"definitely not gzip")
    with pytest.raises(InputDataError, match="cannot be read as NIfTI"):
        read_nifti(broken)
    with pytest.raises(InputDataError, match="not a NIfTI file"):
        read_nifti(tmp_path / "missing.nii")


def test_a_4d_nifti_is_read_as_channels_and_written_back_the_same(tmp_path: Path) -> None:
    data = np.random.default_rng(0).standard_normal((6, 5, 4, 2)).astype(np.float32)  # (X, Y, Z, C)
    nib.save(nib.Nifti1Image(data, np.eye(4)), tmp_path / "two.nii.gz")
    image = read_nifti(tmp_path / "two.nii.gz")
    assert image.asnumpy().shape == (4, 5, 6, 2)  # (D, H, W, C): spatial axes reversed, channel kept last
    np.testing.assert_array_equal(image.asnumpy()[..., 1], data[..., 1].T)
    out = write_nifti(image, tmp_path / "back.nii.gz", dtype=np.float32)
    np.testing.assert_array_equal(np.asarray(nib.load(out).dataobj), data)


def test_a_5d_vector_nifti_is_read_as_channels_and_6d_is_refused(tmp_path: Path) -> None:
    nib.save(nib.Nifti1Image(np.zeros((3, 4, 5, 1, 2), np.float32), np.eye(4)), tmp_path / "vec.nii.gz")
    assert read_nifti(tmp_path / "vec.nii.gz").asnumpy().shape == (5, 4, 3, 2)
    nib.save(nib.Nifti1Image(np.zeros((3, 4, 5, 2, 2), np.float32), np.eye(4)), tmp_path / "odd.nii.gz")
    with pytest.raises(InputDataError, match=r"a NIfTI of shape \[3, 4, 5, 2, 2\] is not an image this reader knows"):
        read_nifti(tmp_path / "odd.nii.gz")
