"""The App SDK's ``breast_density_classifier_app``, migrated: its hand-written ``ClassifierOperator`` replaced by
``InferenceOperator`` with a bundle; everything else as the App SDK example has it.

The graph is the example's (DICOM study loader, series selector with its MG rules, series-to-volume, the App SDK's
own ``DICOMTextSRWriterOperator``, unchanged). The classifier's port ``result_text`` becomes the bundle operator's
output ``pred`` declared ``str``: the class scores as JSON text, which the SR writer takes as it took the old text.
The bundle (pre-processing, network, sigmoid, class names) is the app's ``-m``, as in the App SDK.
"""

import logging
from pathlib import Path

from monai.deploy.conditions import CountCondition
from monai.deploy.core import AppContext, Application, Image, IOType
from monai.deploy.operators.dicom_data_loader_operator import DICOMDataLoaderOperator
from monai.deploy.operators.dicom_series_selector_operator import DICOMSeriesSelectorOperator
from monai.deploy.operators.dicom_series_to_volume_operator import DICOMSeriesToVolumeOperator
from monai.deploy.operators.dicom_text_sr_writer_operator import DICOMTextSRWriterOperator, EquipmentInfo, ModelInfo
from monai.deploy.operators.monai_bundle_inference_operator import BundleConfigNames, IOMapping

from monai_triton_ops import InferenceOperator


class BreastClassificationApp(Application):
    """Breast density classification: a DICOM MG image in, a DICOM SR with the class scores out."""

    def compose(self):
        app_context: AppContext = Application.init_app_context(self.argv)
        app_input_path = Path(app_context.input_path)
        app_output_path = Path(app_context.output_path)

        model_info = ModelInfo("MONAI Model for Breast Density", "BreastDensity", "0.1", "test")
        my_equipment = EquipmentInfo(manufacturer="MONAI Deploy App SDK", manufacturer_model="DICOM SR Writer")
        my_special_tags = {"SeriesDescription": "Not for clinical use"}
        study_loader_op = DICOMDataLoaderOperator(
            self, CountCondition(self, 1), input_folder=app_input_path, name="study_loader_op"
        )
        series_selector_op = DICOMSeriesSelectorOperator(self, rules=Sample_Rules_Text, name="series_selector_op")
        series_to_vol_op = DICOMSeriesToVolumeOperator(self, name="series_to_vol_op")
        classifier_op = InferenceOperator(  # was: ClassifierOperator(self, app_context=..., model_path=...)
            self,
            input_mapping=[IOMapping("image", Image, IOType.IN_MEMORY)],
            output_mapping=[IOMapping("pred", str, IOType.IN_MEMORY)],
            app_context=app_context,
            bundle_config_names=BundleConfigNames(config_names=["inference"]),
            name="classifier_op",
        )
        sr_writer_op = DICOMTextSRWriterOperator(
            self,
            copy_tags=True,
            model_info=model_info,
            equipment_info=my_equipment,
            custom_tags=my_special_tags,
            output_folder=app_output_path,
            name="sr_writer_op",
        )

        self.add_flow(study_loader_op, series_selector_op, {("dicom_study_list", "dicom_study_list")})
        self.add_flow(
            series_selector_op, series_to_vol_op, {("study_selected_series_list", "study_selected_series_list")}
        )
        self.add_flow(series_to_vol_op, classifier_op, {("image", "image")})
        self.add_flow(classifier_op, sr_writer_op, {("pred", "text")})  # was: ("result_text", "text")
        self.add_flow(series_selector_op, sr_writer_op, {("study_selected_series_list", "study_selected_series_list")})


Sample_Rules_Text = """
{
    "selections": [
        {
            "name": "MG Series",
            "conditions": {
                "Modality": "(?i)MG",
                "ImageType": ["PRIMARY"]
            }
        }
    ]
}
"""


if __name__ == "__main__":
    logging.basicConfig(level=logging.INFO)
    BreastClassificationApp().run()
