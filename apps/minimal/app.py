"""The smallest complete app: a NIfTI image in, a label map out, the model running where --backend says.

A MONAI Deploy App SDK ``Application`` with three operators, each named (an unnamed one appears as
``unnamed_operator_1`` in every log line)::

    NiftiImageLoader ──image──> InferenceOperator ──seg_image──> NiftiImageWriter
    (CountCondition 1)          model "minimal_seg"              output/seg.nii.gz

    python apps/minimal -i input/image.nii.gz -o output -m model_repository [--backend torch]
"""

from __future__ import annotations

from pathlib import Path

import torch
from monai.deploy.conditions import CountCondition
from monai.deploy.core import Application
from monai.transforms import AsDiscrete, CastToType, Compose, EnsureType, NormalizeIntensity

from monai_triton_ops import InferenceOperator, InferenceSettings
from monai_triton_ops.app_args import init_app_context
from monai_triton_ops.operators.nifti import NiftiImageLoader, NiftiImageWriter

#: The model's folder name in the repository given with -m: `monai-triton repo build ... --name minimal_seg`.
MODEL_NAME = "minimal_seg"
#: Sliding window: patches of 32^3 voxels (even sizes, as the network's metadata says), 4 per request.
SETTINGS = InferenceSettings(roi_size=(32, 32, 32), sw_batch_size=4, overlap=0.25)


def pre_transforms() -> Compose:
    """What the model is fed. The operator hands over the image channel first, (C, W, H, D), as a MetaTensor.

    Array transforms, and no LoadImage: the loader has read the file already (dictionary transforms, as App SDK
    apps write them, work as well: docs/quickstart.md). EnsureType gives
    float32 (the metadata's dtype; a wrong dtype is refused, never cast silently); NormalizeIntensity
    z-scores each channel, as the network would have been trained.
    """
    return Compose([EnsureType(data_type="tensor", dtype=torch.float32), NormalizeIntensity(channel_wise=True)])


def post_transforms() -> Compose:
    """What the writer gets: logits (2, W, H, D) for the whole image -> labels (1, W, H, D), uint8."""
    return Compose([AsDiscrete(argmax=True), CastToType(dtype=torch.uint8)])


class MinimalSegApp(Application):
    """Segment one NIfTI image with the minimal_seg model; writes seg.nii.gz on the input's grid."""

    def compose(self) -> None:
        # The App SDK's -i/-o/-m/-l/-w/-t plus --backend and --allow-non-finite, checked before anything runs.
        context = init_app_context(self.argv)
        loader = NiftiImageLoader(  # CountCondition(self, 1): read once; without it the graph never stops
            self, CountCondition(self, 1), input_path=Path(context.input_path), name="nifti_loader"
        )
        infer = InferenceOperator(
            self,
            app_context=context,  # gives the backend spec and the model repository (-m)
            model_name=MODEL_NAME,
            settings=SETTINGS,
            pre_transforms=pre_transforms(),
            post_transforms=post_transforms(),
            name="minimal_seg_inference",
        )
        writer = NiftiImageWriter(self, output_folder=Path(context.output_path), name="nifti_writer")
        self.add_flow(loader, infer, {("image", "image")})
        self.add_flow(infer, writer, {("seg_image", "seg_image")})
