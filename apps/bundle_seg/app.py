"""Any 3D segmentation MONAI Bundle on any backend: the App SDK's spleen segmentation app, ported.

The App SDK example (``examples/apps/ai_spleen_seg_app``) with one change, the inference operator's class:
``MonaiBundleInferenceOperator`` -> ``monai_triton_ops.InferenceOperator``, with the same keywords. The bundle is
the app's ``-m`` (a bundle folder, a bundle ``.ts``, or a Triton repository made by ``monai-triton repo build``);
where its network runs is chosen at run time (``--backend torch | triton | grpc://HOST:PORT | http://HOST:PORT``).

Input: a folder with a DICOM CT series (selected as the spleen app selects it), or a NIfTI file.
Output: ``seg.nii.gz`` (the labels on the input's grid), and for DICOM input a DICOM SEG beside it whose segments
are the bundle's output channels (``network_data_format``'s ``channel_def``, background left out).

    python apps/bundle_seg -i CT_FOLDER_OR_NIFTI -o out -m spleen_ct_segmentation [--backend grpc://triton:8001]
"""

from __future__ import annotations

import logging
from pathlib import Path

from monai.deploy.conditions import CountCondition
from monai.deploy.core import Application, Image, IOType
from monai.deploy.operators.dicom_data_loader_operator import DICOMDataLoaderOperator
from monai.deploy.operators.dicom_seg_writer_operator import DICOMSegmentationWriterOperator, SegmentDescription
from monai.deploy.operators.dicom_series_selector_operator import DICOMSeriesSelectorOperator
from monai.deploy.operators.dicom_series_to_volume_operator import DICOMSeriesToVolumeOperator
from monai.deploy.operators.monai_bundle_inference_operator import BundleConfigNames, IOMapping
from pydicom.sr.codedict import codes

from monai_triton_ops import InferenceOperator
from monai_triton_ops.app_args import init_app_context
from monai_triton_ops.operators.nifti import NiftiImageLoader, NiftiImageWriter
from monai_triton_ops.pipeline.inputs import check_dicom_images, classify_input

VERSION = "0.1.0"
MODALITY = "CT"
#: The spleen app's series selection (its ``Sample_Rules_Text``): a CT series of the study.
SERIES_RULES = """
{
    "selections": [
        {
            "name": "CT Series",
            "conditions": {"StudyDescription": "(.*?)", "Modality": "(?i)CT", "SeriesDescription": "(.*?)"}
        }
    ]
}
"""

logger = logging.getLogger(__name__)


class BundleSegApp(Application):
    """DICOM CT series or NIfTI in; the bundle's labels as NIfTI (and DICOM SEG for DICOM input) out."""

    def compose(self) -> None:
        context = init_app_context(self.argv)
        input_path, output = Path(context.input_path), Path(context.output_path)
        kind = classify_input(input_path)
        if kind == "dicom":
            check_dicom_images(input_path, modality=MODALITY)
        infer = InferenceOperator(
            self,
            input_mapping=[IOMapping("image", Image, IOType.IN_MEMORY)],
            output_mapping=[IOMapping("pred", Image, IOType.IN_MEMORY)],
            app_context=context,
            bundle_config_names=BundleConfigNames(config_names=["inference"]),
            name="bundle_seg_op",
        )
        logger.info("input %s (%s), output %s, model %r", input_path, kind, output, infer.model_name)
        nifti_writer = NiftiImageWriter(self, output_folder=output, filename="seg.nii.gz", name="nifti_writer")
        self.add_flow(infer, nifti_writer, {("pred", "seg_image")})
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
            self, segment_descriptions=segment_descriptions(infer), output_folder=output, name="dicom_seg_writer"
        )
        self.add_flow(study_loader, selector, {("dicom_study_list", "dicom_study_list")})
        self.add_flow(selector, to_volume, {("study_selected_series_list", "study_selected_series_list")})
        self.add_flow(to_volume, infer, {("image", "image")})
        self.add_flow(selector, seg_writer, {("study_selected_series_list", "study_selected_series_list")})
        self.add_flow(infer, seg_writer, {("pred", "seg_image")})


def segment_descriptions(infer: InferenceOperator) -> list[SegmentDescription]:
    """One DICOM SEG segment per label 1..N, named by the bundle's ``channel_def`` (as the spleen app names its one)."""
    bundle = infer.bundle
    assert bundle is not None  # noqa: S101 - built with the bundle keywords above
    output = next(iter(bundle.config.outputs.values()))
    names = output.get("channel_def") or {}
    count = int(output.get("num_channels") or len(names) or 2)
    return [
        SegmentDescription(
            segment_label=str(names.get(str(label), f"label {label}")),
            segmented_property_category=codes.SCT.Organ,
            segmented_property_type=codes.SCT.Organ,
            algorithm_name=f"monai_triton_ops bundle_seg {infer.model_name}",
            algorithm_version=VERSION,
        )
        for label in range(1, count)
    ]


if __name__ == "__main__":
    import sys

    from monai_triton_ops.app_args import run_app

    sys.exit(run_app(BundleSegApp))
