"""Any detection MONAI Bundle on any backend: a CT volume (NIfTI or DICOM) in, the boxes as JSON out.

The model zoo's ``lung_nodule_ct_detection`` kind of bundle (a RetinaNet, a ``RetinaNetDetector`` set up by
``detector_ops``, a bundle-local inferer) through the one bundle operator of this project,
``monai_triton_ops.InferenceOperator``, with its output port declared ``dict``: the network runs on the backend
(``--backend torch | triton | grpc://HOST:PORT | http://HOST:PORT``); the detector's anchors, box decoding, box
selection and NMS, the bundle's inferer and its post-processing run beside the app, as the bundle defines them.
The bundle is the app's ``-m`` (a bundle folder, or a Triton repository made by ``monai-triton repo build``).

Input: a NIfTI file, or a folder with a DICOM CT series. Output: ``<name>_result.json``,
``{"filename", "box": [[x, y, z, w, h, d], ...], "label": [...], "label_scores": [...]}``: boxes in world
coordinates (mm) as the bundle's post-processing makes them (the zoo's: centre and size, RAS).

    python apps/bundle_detect -i CT.nii.gz -o out -m BUNDLE [--backend grpc://triton:8001]
"""

from __future__ import annotations

import logging
from pathlib import Path

from monai.deploy.conditions import CountCondition
from monai.deploy.core import Application, Image, IOType
from monai.deploy.operators.dicom_data_loader_operator import DICOMDataLoaderOperator
from monai.deploy.operators.dicom_series_selector_operator import DICOMSeriesSelectorOperator
from monai.deploy.operators.dicom_series_to_volume_operator import DICOMSeriesToVolumeOperator
from monai.deploy.operators.monai_bundle_inference_operator import BundleConfigNames, IOMapping

from monai_triton_ops import InferenceOperator
from monai_triton_ops.app_args import init_app_context
from monai_triton_ops.operators.nifti import NiftiImageLoader
from monai_triton_ops.operators.results_writer import JSONResultsWriter
from monai_triton_ops.pipeline.inputs import check_dicom_images, classify_input

VERSION = "0.1.0"
#: The model zoo's detection bundle names its one output ``pred`` (boxes, labels, scores).
OUTPUT = "pred"
#: A CT series of the study, as the App SDK's CT apps select it.
SERIES_RULES = '{"selections": [{"name": "CT Series", "conditions": {"Modality": "(?i)CT"}}]}'

logger = logging.getLogger(__name__)


class BundleDetectApp(Application):
    """A CT volume in; the bundle's boxes, labels and scores as one JSON file out."""

    def compose(self) -> None:
        context = init_app_context(self.argv)
        input_path, output = Path(context.input_path), Path(context.output_path)
        detect = InferenceOperator(
            self,
            input_mapping=[IOMapping("image", Image, IOType.IN_MEMORY)],
            output_mapping=[IOMapping(OUTPUT, dict, IOType.IN_MEMORY)],
            app_context=context,
            bundle_config_names=BundleConfigNames(config_names=["inference"]),
            name="bundle_detect_op",
        )
        kind = classify_input(input_path)
        logger.info("input %s (%s), output %s, model %r", input_path, kind, output, detect.model_name)
        name = input_path.name.split(".")[0] if input_path.is_file() else input_path.name
        writer = JSONResultsWriter(self, output_folder=output, default_filename=name, name="json_writer")
        self.add_flow(detect, writer, {(OUTPUT, "pred")})
        if kind == "nifti":
            loader = NiftiImageLoader(self, CountCondition(self, 1), input_path=input_path, name="nifti_loader")
            self.add_flow(loader, detect, {("image", "image")})
            return
        check_dicom_images(input_path, modality="CT")
        study_loader = DICOMDataLoaderOperator(self, CountCondition(self, 1), input_folder=input_path, name="dicom")
        selector = DICOMSeriesSelectorOperator(self, rules=SERIES_RULES, name="series_selector")
        to_volume = DICOMSeriesToVolumeOperator(self, name="series_to_volume")
        self.add_flow(study_loader, selector, {("dicom_study_list", "dicom_study_list")})
        self.add_flow(selector, to_volume, {("study_selected_series_list", "study_selected_series_list")})
        self.add_flow(to_volume, detect, {("image", "image")})


if __name__ == "__main__":
    import sys

    from monai_triton_ops.app_args import run_app

    sys.exit(run_app(BundleDetectApp))
