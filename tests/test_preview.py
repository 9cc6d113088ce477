"""``--preview``: the PNG's size, panel layout and orientation, and the overlay colours where the labels are."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from monai.deploy.core import Image
from PIL import Image as PILImage

from monai_triton_ops.preview import ALPHA, LEGEND_ROW, MARGIN, colour_of, render_preview, write_preview

X, Y, Z = 40, 50, 30  # RAS voxel grid, 1 mm
GREY = 100.0


def volume_and_labels() -> tuple[np.ndarray, np.ndarray]:
    """Half dark, half bright (so the window gives two greys); label 1 anterior, label 2 on the patient's left."""
    image = np.full((X, Y, Z), GREY, dtype=np.float32)
    image[:, : Y // 2] = 0.0
    labels = np.zeros((X, Y, Z), dtype=np.uint8)
    labels[10:14, 40:46, 13:17] = 1
    labels[30:34, 28:32, 13:17] = 2
    return image, labels


def blended(value: int, grey: float = 255.0) -> np.ndarray:
    """The colour of label ``value`` over a grey pixel (the bright half is 255 after windowing, the dark 0)."""
    return (1 - ALPHA) * grey + ALPHA * np.asarray(colour_of(value - 1), dtype=np.float64)


def test_size_panels_and_overlay_colours_where_the_labels_are(tmp_path: Path) -> None:
    image, labels = volume_and_labels()
    dhw = Image(image.T.copy(), metadata={"affine": np.eye(4)})  # the App SDK's (D, H, W) order
    path = write_preview(dhw, labels.T.copy(), tmp_path / "preview.png", label_names={1: "spleen", 2: "liver"})
    picture = np.asarray(PILImage.open(path).convert("RGB")).astype(np.float64)
    # axial X x Y, coronal X x Z, sagittal Y x Z, side by side; a legend row per label below
    assert picture.shape == (MARGIN * 2 + Y + 2 * LEGEND_ROW, X + X + Y + 4 * MARGIN, 3)
    axial = picture[MARGIN : MARGIN + Y, MARGIN : MARGIN + X]
    coronal = picture[MARGIN : MARGIN + Z, 2 * MARGIN + X : 2 * MARGIN + 2 * X]
    sagittal = picture[MARGIN : MARGIN + Z, 3 * MARGIN + 2 * X : 3 * MARGIN + 2 * X + Y]
    # The axial slice goes through both labels (z 13..16): label 1 anterior (top rows), label 2 at x 30..33.
    np.testing.assert_allclose(axial[Y - 46 : Y - 40, 10:14].reshape(-1, 3), [blended(1)] * 24, atol=1)
    np.testing.assert_allclose(axial[Y - 32 : Y - 28, 30:34].reshape(-1, 3), [blended(2)] * 16, atol=1)
    np.testing.assert_allclose(axial[5, 20], [255, 255, 255], atol=1)  # anterior half (top) bright, no label
    np.testing.assert_allclose(axial[Y - 5, 20], [0, 0, 0], atol=1)  # posterior half dark
    # Coronal (through y of the labels' centre) and sagittal (through x): superior up, z 13..16 = rows Z-17..Z-14.
    centre_y, centre_x = 37, 20  # the mean of both labels' voxels (y 40..45 and 28..31, x 10..13 and 30..33)
    assert (labels[:, centre_y] == 0).all()  # the coronal slice misses both labels: grey only
    assert np.allclose(coronal[:, :, 0], coronal[:, :, 1])
    assert np.allclose(coronal[:, :, 1], coronal[:, :, 2])
    assert (labels[centre_x] == 0).all()
    assert np.allclose(sagittal[:, :, 0], sagittal[:, :, 2])
    # Distinct colours, and the legend shows each one.
    assert colour_of(0) != colour_of(1)
    legend = picture[MARGIN * 2 + Y :, : MARGIN + 13]
    for value in (1, 2):
        assert (np.abs(legend - np.asarray(colour_of(value - 1))).sum(axis=2) < 3).any()


def test_orientation_follows_the_affine() -> None:
    """The same anatomy stored flipped (an LPS-like affine) gives the same picture."""
    image, labels = volume_and_labels()
    flip = np.diag([-1.0, -1.0, 1.0, 1.0])
    flip[:3, 3] = [X - 1, Y - 1, 0]
    stored_image, stored_labels = image[::-1, ::-1], labels[::-1, ::-1]
    a = np.asarray(render_preview(image.T, labels.T, np.eye(4)))
    b = np.asarray(render_preview(stored_image.T.copy(), stored_labels.T.copy(), flip))
    np.testing.assert_array_equal(a, b)


def test_voxel_spacing_scales_the_panels() -> None:
    image, labels = volume_and_labels()
    picture = render_preview(image.T, labels.T, np.diag([1.0, 1.0, 2.0, 1.0]))
    assert picture.height == MARGIN * 2 + Z * 2 + 2 * LEGEND_ROW  # 30 slices of 2 mm: 60 rows, taller than Y


def test_no_labels_and_mismatched_shapes() -> None:
    image, labels = volume_and_labels()
    assert render_preview(image.T, np.zeros_like(labels).T).height == MARGIN * 2 + Y + LEGEND_ROW
    with pytest.raises(ValueError, match="differ in shape"):
        render_preview(image.T, labels[:-1].T)
