"""Any classification MONAI Bundle on any backend: 2D images (PNG, JPEG) or a volume in, one JSON file per input out.

What the App SDK's pipeline generator writes into every generated classification app (an image loader, a
classification operator, a JSON writer), with the one bundle operator of this project in the middle:
``monai_triton_ops.InferenceOperator`` with the App SDK's bundle keywords, its output port declared ``dict`` so it
emits the class scores as a plain result (``bundles/outputs.py``). The bundle is the app's ``-m`` (a bundle folder, a
bundle ``.ts``, or a Triton repository made by ``monai-triton repo build``); where its network runs is chosen at run
time (``--backend torch | triton | grpc://HOST:PORT | http://HOST:PORT``).

Input: a 2D image file or a folder of them (one result each), a NIfTI file, or a folder with a DICOM series (a
single-instance one too: MG, CR, DX). Output: ``<name>_result.json`` per input, ``{"filename", "probabilities":
{class: score}, "predicted_class", "confidence"}`` with the class names of the bundle's ``channel_def``.

    python apps/bundle_classify -i IMAGES_FOLDER -o out -m BUNDLE [--backend grpc://triton:8001]
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
from monai_triton_ops.errors import InputDataError
from monai_triton_ops.operators.image2d import Image2DLoader, image_files, is_image_2d
from monai_triton_ops.operators.nifti import NiftiImageLoader
from monai_triton_ops.operators.results_writer import JSONResultsWriter
from monai_triton_ops.pipeline.inputs import classify_input

VERSION = "0.1.0"
#: The model zoo's classification bundles name their one output ``pred``.
OUTPUT = "pred"
#: Any image series of the study (the first one the App SDK's selector finds).
SERIES_RULES = '{"selections": [{"name": "any series", "conditions": {"Modality": "(.*?)"}}]}'

logger = logging.getLogger(__name__)


class BundleClassifyApp(Application):
    """2D images, NIfTI or DICOM in; the bundle's class scores as one JSON file per input out."""

    def compose(self) -> None:
        context = init_app_context(self.argv)
        input_path, output = Path(context.input_path), Path(context.output_path)
        infer = InferenceOperator(
            self,
            input_mapping=[IOMapping("image", Image, IOType.IN_MEMORY)],
            output_mapping=[IOMapping(OUTPUT, dict, IOType.IN_MEMORY)],
            app_context=context,
            bundle_config_names=BundleConfigNames(config_names=["inference"]),
            name="bundle_classify_op",
        )
        kind = "images" if is_image_2d(input_path) or _has_images(input_path) else classify_input(input_path)
        logger.info("input %s (%s), output %s, model %r", input_path, kind, output, infer.model_name)
        name = input_path.name.split(".")[0] if input_path.is_file() else input_path.name
        writer = JSONResultsWriter(self, output_folder=output, default_filename=name, name="json_writer")
        self.add_flow(infer, writer, {(OUTPUT, "pred")})
        if kind == "images":
            count = len(image_files(input_path))
            images = Image2DLoader(self, CountCondition(self, count), input_path=input_path, name="image_loader")
            self.add_flow(images, infer, {("image", "image")})
            self.add_flow(images, writer, {("filename", "filename")})
        elif kind == "nifti":
            loader = NiftiImageLoader(self, CountCondition(self, 1), input_path=input_path, name="nifti_loader")
            self.add_flow(loader, infer, {("image", "image")})
        else:
            study_loader = DICOMDataLoaderOperator(
                self, CountCondition(self, 1), input_folder=input_path, name="dicom_loader"
            )
            selector = DICOMSeriesSelectorOperator(self, rules=SERIES_RULES, name="series_selector")
            to_volume = DICOMSeriesToVolumeOperator(self, name="series_to_volume")
            self.add_flow(study_loader, selector, {("dicom_study_list", "dicom_study_list")})
            self.add_flow(selector, to_volume, {("study_selected_series_list", "study_selected_series_list")})
            self.add_flow(to_volume, infer, {("image", "image")})


def _has_images(path: Path) -> bool:
    try:
        return path.is_dir() and bool(image_files(path))
    except (InputDataError, OSError):  # no 2D image in the folder: another kind of input
        return False


if __name__ == "__main__":
    import sys

    from monai_triton_ops.app_args import run_app

    sys.exit(run_app(BundleClassifyApp))
