"""A test app: NIfTI in, labels out, with the inference settings the model's own metadata gives.

The interrupt tests pick its timing through the model: a sliding window of many small patches keeps it
inferring for seconds, a whole-image model on a large image keeps it writing for a while.
"""

from __future__ import annotations

from pathlib import Path

from monai.deploy.conditions import CountCondition
from monai.deploy.core import Application

from monai_triton_ops import InferenceOperator
from monai_triton_ops.app_args import init_app_context
from monai_triton_ops.operators.nifti import NiftiImageLoader, NiftiImageWriter


class InterruptApp(Application):
    """Segment one NIfTI with model 'seg' (any backend); writes seg.nii.gz."""

    def compose(self) -> None:
        context = init_app_context(self.argv)
        loader = NiftiImageLoader(self, CountCondition(self, 1), input_path=Path(context.input_path), name="loader")
        infer = InferenceOperator(self, app_context=context, model_name="seg", name="infer")
        writer = NiftiImageWriter(self, output_folder=Path(context.output_path), name="writer")
        self.add_flow(loader, infer, {("image", "image")})
        self.add_flow(infer, writer, {("seg_image", "seg_image")})
