"""Two bundles on one DICOM CT series, two DICOM SEGs out: an App SDK multi-AI app in the shape of the App SDK's
``examples/apps/ai_multi_ai_app``, ported by changing only which class its two bundle operators are.

It keeps what such an app keeps: the App SDK's own ``Application.init_app_context`` (whose parser knows no
option of ours, so ``monai-triton exec`` hands them over as the environment), a models folder ``-m MODELS`` with
one model per folder, each operator finding its model by ``model_name``, and ``App().run()`` as its ``__main__``.
The only line that differs from an App SDK app is the import of the operator class.
"""

from __future__ import annotations

from pathlib import Path

from monai.deploy.conditions import CountCondition
from monai.deploy.core import AppContext, Application, Image, IOType
from monai.deploy.operators.dicom_data_loader_operator import DICOMDataLoaderOperator
from monai.deploy.operators.dicom_seg_writer_operator import DICOMSegmentationWriterOperator, SegmentDescription
from monai.deploy.operators.dicom_series_selector_operator import DICOMSeriesSelectorOperator
from monai.deploy.operators.dicom_series_to_volume_operator import DICOMSeriesToVolumeOperator
from monai.deploy.operators.monai_bundle_inference_operator import BundleConfigNames, IOMapping
from pydicom.sr.codedict import codes

from monai_triton_ops import InferenceOperator as MonaiBundleInferenceOperator  # the port: this line only

#: The models, by folder name in ``-m``, and the segments each one's labels 1..N are.
MODELS = {"spleen_ct": ["Spleen"], "pancreas_ct_dints": ["Pancreas", "Tumor"]}
CT_RULES = '{"selections": [{"name": "CT Series", "conditions": {"Modality": "(?i)CT"}}]}'


class MultiAIApp(Application):
    """One CT series in; for each model its labels as a DICOM SEG (``SeriesDescription`` names the model)."""

    def compose(self) -> None:
        app_context: AppContext = Application.init_app_context(self.argv)
        loader = DICOMDataLoaderOperator(
            self, CountCondition(self, 1), input_folder=Path(app_context.input_path), name="study_loader_op"
        )
        selector = DICOMSeriesSelectorOperator(self, rules=CT_RULES, name="series_selector_op")
        to_volume = DICOMSeriesToVolumeOperator(self, name="series_to_vol_op")
        self.add_flow(loader, selector, {("dicom_study_list", "dicom_study_list")})
        self.add_flow(selector, to_volume, {("study_selected_series_list", "study_selected_series_list")})
        for model_name, segments in MODELS.items():
            seg_op = MonaiBundleInferenceOperator(
                self,
                input_mapping=[IOMapping("image", Image, IOType.IN_MEMORY)],
                output_mapping=[IOMapping("pred", Image, IOType.IN_MEMORY)],
                app_context=app_context,
                bundle_config_names=BundleConfigNames(config_names=["inference"]),
                model_name=model_name,
                name=f"bundle_{model_name}_op",
            )
            writer = DICOMSegmentationWriterOperator(
                self,
                segment_descriptions=[
                    SegmentDescription(
                        segment_label=label,
                        segmented_property_category=codes.SCT.Organ,
                        segmented_property_type=codes.SCT.Organ,
                        algorithm_name=f"{model_name} test model",
                        algorithm_family=codes.DCM.ArtificialIntelligence,
                        algorithm_version="0.1.0",
                    )
                    for label in segments
                ],
                custom_tags={"SeriesDescription": f"AI {model_name}"},
                output_folder=Path(app_context.output_path),
                name=f"dicom_seg_writer_{model_name}",
            )
            self.add_flow(to_volume, seg_op, {("image", "image")})
            self.add_flow(selector, writer, {("study_selected_series_list", "study_selected_series_list")})
            self.add_flow(seg_op, writer, {("pred", "seg_image")})
