"""Brain tissue segmentation (background / grey matter / white matter) of a T1 MRI.

A MONAI Deploy App SDK ``Application``. Input: a NIfTI file, or a folder holding a DICOM MR series.
Output: ``seg.nii.gz`` (uint8 labels, same shape and affine as the input) and, for DICOM input,
a DICOM SEG next to it, and with ``--preview`` a PNG of three slices with the labels. Where the model runs
is chosen at run time: ``--backend SPEC``, ``MONAI_TRITON_BACKEND`` or ``app.yaml`` (default ``torch``); the
model name and every backend option the same way (``monai_triton_ops.app_settings``).

    python apps/brain_tissue_seg -i T1.nii.gz -o out -m model_repository [--backend torch] [--preview]
"""

from __future__ import annotations

import logging
from pathlib import Path

from monai.deploy.conditions import CountCondition
from monai.deploy.core import Application
from monai.deploy.operators.dicom_data_loader_operator import DICOMDataLoaderOperator
from monai.deploy.operators.dicom_seg_writer_operator import DICOMSegmentationWriterOperator, SegmentDescription
from monai.deploy.operators.dicom_series_selector_operator import DICOMSeriesSelectorOperator
from monai.deploy.operators.dicom_series_to_volume_operator import DICOMSeriesToVolumeOperator
from pydicom.sr.codedict import codes
from transforms import LABELS, post_transforms, pre_transforms

from monai_triton_ops import InferenceOperator
from monai_triton_ops.app_args import init_app_context
from monai_triton_ops.operators.nifti import NiftiImageLoader, NiftiImageWriter
from monai_triton_ops.pipeline.inputs import check_dicom_images, classify_input

MODEL_NAME = "brain_tissue_seg"
VERSION = "0.1.0"
#: Pick the MR series of the study (the App SDK selector's JSON rules).
MODALITY = "MR"
SERIES_RULES = '{"selections": [{"name": "T1", "conditions": {"Modality": "(?i)MR"}}]}'

logger = logging.getLogger(__name__)


class BrainTissueSegApp(Application):
    """NIfTI or DICOM in; labels as NIfTI (and DICOM SEG for DICOM input) out."""

    def compose(self) -> None:
        context = init_app_context(self.argv)
        input_path, output = Path(context.input_path), Path(context.output_path)
        kind = classify_input(input_path)  # empty folder / no DICOM fails here, before anything runs
        if kind == "dicom":
            check_dicom_images(input_path, modality=MODALITY)  # DICOM without an MR image series, too
        logger.info("input %s (%s), output %s, backend %s", input_path, kind, output, context.args["backend"])

        infer = InferenceOperator(
            self,
            app_context=context,
            model_name=MODEL_NAME,
            # roi_size, sw_batch_size and overlap come from the model's metadata ("inference" block);
            # 2 windows per request (the batch it was checked with), the 4 windows of a call in flight together.
            settings_overrides={"request_batch_size": 2, "progress": True},
            pre_transforms=pre_transforms(),
            post_transforms=post_transforms(),
            label_names=LABELS,  # the legend of --preview
            name="brain_tissue_seg_inference",
        )
        nifti_writer = NiftiImageWriter(self, output_folder=output, filename="seg.nii.gz", name="nifti_writer")
        self.add_flow(infer, nifti_writer, {("seg_image", "seg_image")})
        if kind == "nifti":
            loader = NiftiImageLoader(self, CountCondition(self, 1), input_path=input_path, name="nifti_loader")
            self.add_flow(loader, infer, {("image", "image")})
            return
        study_loader = DICOMDataLoaderOperator(
            self, CountCondition(self, 1), input_folder=input_path, name="dicom_loader"
        )
        selector = DICOMSeriesSelectorOperator(self, rules=SERIES_RULES, name="series_selector")
        to_volume = DICOMSeriesToVolumeOperator(self, name="series_to_volume")
        seg_writer = DICOMSegmentationWriterOperator(
            self, segment_descriptions=segment_descriptions(), output_folder=output, name="dicom_seg_writer"
        )
        self.add_flow(study_loader, selector, {("dicom_study_list", "dicom_study_list")})
        self.add_flow(selector, to_volume, {("study_selected_series_list", "study_selected_series_list")})
        self.add_flow(to_volume, infer, {("image", "image")})
        self.add_flow(selector, seg_writer, {("study_selected_series_list", "study_selected_series_list")})
        self.add_flow(infer, seg_writer, {("seg_image", "seg_image")})


def segment_descriptions() -> list[SegmentDescription]:
    """DICOM SEG segments 1 and 2, in label order, with SNOMED CT codes."""
    return [
        SegmentDescription(
            segment_label=label,
            segmented_property_category=codes.SCT.Tissue,
            segmented_property_type=code,
            algorithm_name="monai_triton_ops brain_tissue_seg",
            algorithm_version=VERSION,
        )
        for label, code in (("grey matter", codes.SCT.GrayMatter), ("white matter", codes.SCT.WhiteMatter))
    ]


if __name__ == "__main__":
    import sys

    from monai_triton_ops.app_args import run_app

    sys.exit(run_app(BrainTissueSegApp))
