"""The sample app's data: the real MNI ICBM152 2009 T1 template and GM/WM labels derived from it.

nilearn ships the skull-stripped ICBM152 2009a nonlinear T1, grey-matter and white-matter
probability templates inside its wheel (``nilearn/datasets/data/mni_icbm152_*_tal_nlin_sym_09a_converted.nii.gz``);
``load_mni152_template`` / ``load_mni152_gm_template`` / ``load_mni152_wm_template`` read those files, so
nothing is downloaded. All three are 197 x 233 x 189 voxels of 1 mm, RAS+, on the same affine.

Label rule (uint8): inside the head (T1 > 0), each voxel takes the argmax over
``{0: background = 1 - gm - wm, 1: gm, 2: wm}`` of the probability maps, ties going to the lower label;
outside the head it is 0. ``1 - gm - wm`` is the probability of "neither" (CSF, skull-stripped
remainder), so every voxel gets exactly one well-defined label.

The templates may be used for any purpose, without fee, as long as the MNI copyright notice travels with them
(``ATLAS_COPYRIGHT`` below; https://nist.mni.mcgill.ca/icbm-152-nonlinear-atlases-2009/). The trained model
and the sample data written from these templates carry that notice too.
"""

from __future__ import annotations

import logging

import nibabel as nib
import numpy as np
from nilearn import datasets, image

logger = logging.getLogger(__name__)

#: The notice the ICBM152 2009 licence asks to keep with every copy of the templates and data derived from them.
ATLAS_COPYRIGHT = (
    "Copyright (C) 1993-2009 Louis Collins, McConnell Brain Imaging Centre, Montreal Neurological Institute, "
    "McGill University. Permission to use, copy, modify, and distribute this software and its documentation for "
    "any purpose and without fee is hereby granted, provided that the above copyright notice appear in all copies. "
    "The authors and McGill University make no representations about the suitability of this software for any "
    "purpose. It is provided 'as is' without express or implied warranty. The authors are not responsible for any "
    "data loss, equipment damage, property loss, or injury to subjects or patients resulting from the use or misuse "
    "of this software package."
)
#: Label values of the tissue classes.
BACKGROUND, GREY_MATTER, WHITE_MATTER = 0, 1, 2
#: NIfTI sform/qform code 4: coordinates are in MNI152 space.
_MNI_CODE = 4


def _float_image(data: np.ndarray, affine: np.ndarray, dtype: type[np.generic]) -> nib.Nifti1Image:
    """A fresh NIfTI whose header dtype matches the data.

    nilearn's images keep the uint8 header of the shipped files even though their data is float in
    [0, 1]; saving such an image would quantise it, so we build a clean header instead.
    """
    img = nib.Nifti1Image(np.asarray(data, dtype=dtype), affine)
    img.set_data_dtype(dtype)
    img.set_sform(affine, code=_MNI_CODE)
    img.set_qform(affine, code=_MNI_CODE)
    return img


def load_t1() -> nib.Nifti1Image:
    """The skull-stripped ICBM152 2009a T1 template, float32 in [0, 1] (0 outside the head).

    This image's grid (shape and affine) is the reference grid for everything in this app.
    """
    t1 = datasets.load_mni152_template(resolution=1)
    return _float_image(t1.get_fdata(dtype=np.float32), t1.affine, np.float32)


def _on_t1_grid(prob: nib.Nifti1Image, t1: nib.Nifti1Image) -> np.ndarray:
    """A probability map on the T1 grid; resampled (linearly, before the argmax) only if the grids differ."""
    if prob.shape == t1.shape and np.allclose(prob.affine, t1.affine):
        return prob.get_fdata(dtype=np.float32)
    logger.info("resampling a probability map from %s to the T1 grid %s", prob.shape, t1.shape)
    resampled = image.resample_to_img(prob, t1, interpolation="linear", force_resample=True, copy_header=True)
    return resampled.get_fdata(dtype=np.float32)


def labels_from_probabilities(gm: np.ndarray, wm: np.ndarray, head: np.ndarray) -> np.ndarray:
    """Apply the label rule: argmax over {1 - gm - wm, gm, wm} inside ``head``, 0 outside."""
    background = 1.0 - gm - wm
    labels = np.argmax(np.stack([background, gm, wm]), axis=0).astype(np.uint8)
    labels[~head] = BACKGROUND
    return labels


def load_labels() -> nib.Nifti1Image:
    """uint8 tissue labels (0 background, 1 GM, 2 WM) on the T1 grid, by the rule in the module docstring."""
    t1 = load_t1()
    gm = _on_t1_grid(datasets.load_mni152_gm_template(resolution=1), t1)
    wm = _on_t1_grid(datasets.load_mni152_wm_template(resolution=1), t1)
    labels = labels_from_probabilities(gm, wm, head=t1.get_fdata(dtype=np.float32) > 0)
    return _float_image(labels, t1.affine, np.uint8)


def dice(pred: np.ndarray, ref: np.ndarray, label: int) -> float:
    """Dice overlap of ``label`` between two label maps; 1.0 when the label is absent from both."""
    p = np.asarray(pred) == label
    r = np.asarray(ref) == label
    total = int(p.sum()) + int(r.sum())
    return 1.0 if total == 0 else 2.0 * int(np.logical_and(p, r).sum()) / total
