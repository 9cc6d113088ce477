"""A classification bundle through ``InferenceOperator`` on ``torch``, against the bundle run by MONAI alone.

The bundle (``tests/bundles/classify.py``) is shaped like the zoo's ``breast_density_classification``: its metadata
declares the output ``type "image"`` with ``spatial_shape [1, 4]``, which must not be made an ``Image``. The
reference is ``monai.bundle.ConfigWorkflow`` running the bundle's own items on the PNG files (``LoadImaged``
included); ours reads the files with ``read_image_2d`` (the loader operator's) and must give the identical
scores, labelled with the bundle's class names. Every ``IOMapping`` type the App SDK allows for a non-image port
gets the result in that type; an ``Image`` port for the scores, or a type the operator cannot make, is refused when
the operator is made. The Triton backends are in ``test_bundle.py`` (its servers).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from monai.deploy.core import Application, Image, IOType
from monai.deploy.operators.monai_bundle_inference_operator import IOMapping

from monai_triton_ops import InferenceOperator
from monai_triton_ops.bundles.images import image_to_tensor
from monai_triton_ops.bundles.outputs import OutputKind, output_kind, tensor_dims
from monai_triton_ops.errors import BundleError, InputDataError
from monai_triton_ops.operators.image2d import read_image_2d
from monai_triton_ops.operators.results_writer import write_result

from ..bundles.classify import CLASSES, classify_bundle, monai_alone, png_images
from .test_bundle import Ports


@pytest.fixture(scope="module")
def fragment() -> Application:
    return Application()


@pytest.fixture(scope="module")
def case(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    root = tmp_path_factory.mktemp("classify")
    bundle = classify_bundle(root / "bundle")
    files = png_images(root / "images")
    return {"bundle": bundle, "files": files, "want": monai_alone(bundle, files)}


def classify(fragment: Application, bundle: Path, files: list[Path], port: Any = dict, backend: str = "torch") -> list:
    op = InferenceOperator(
        fragment,
        bundle_path=bundle,
        backend=backend,
        input_mapping=[IOMapping("image", Image, IOType.IN_MEMORY)],
        output_mapping=[IOMapping("pred", port, IOType.IN_MEMORY)],
    )
    op.start()
    try:
        found = []
        for path in files:
            ports = Ports({"image": read_image_2d(path)})
            op.compute(ports, ports, None)
            found.append(ports.emitted["pred"])
        return found
    finally:
        op.stop()


def test_torch_gives_monai_alones_scores_with_the_bundles_class_names(
    fragment: Application, case: dict[str, Any], tmp_path: Path
) -> None:
    results = classify(fragment, case["bundle"], case["files"])
    assert len({tuple(np.round(w, 6)) for w in case["want"]}) == len(case["files"])  # the images differ
    for result, want in zip(results, case["want"], strict=True):
        assert list(result["probabilities"]) == list(CLASSES)  # channel_def, in channel order
        np.testing.assert_array_equal(np.array(list(result["probabilities"].values())), want)
        assert result["predicted_class"] == CLASSES[int(np.argmax(want))]
        assert result["confidence"] == float(np.max(want))
    written = json.loads(write_result(tmp_path, "image_0", results[0]).read_text())
    assert written == {"filename": "image_0", **results[0]}  # the writer's JSON: the result as it is


def test_every_port_type_the_app_sdk_allows_gets_the_result_in_that_type(
    fragment: Application, case: dict[str, Any]
) -> None:
    """``str`` is what ``DICOMTextSRWriterOperator`` takes; ``np.ndarray`` is the App SDK operator's own hand-on."""
    files, want = case["files"][:1], case["want"][0]
    (text,) = classify(fragment, case["bundle"], files, str)
    assert json.loads(text)["probabilities"] == dict(zip(CLASSES, want.tolist(), strict=True))
    (scores,) = classify(fragment, case["bundle"], files, list)
    assert scores == want.tolist()
    (top,) = classify(fragment, case["bundle"], files, float)
    assert top == float(np.max(want))
    (array,) = classify(fragment, case["bundle"], files, np.ndarray)
    assert array.shape == (len(CLASSES),)  # the post-processed scores (the App SDK unbatches them), not an image
    (typed,) = classify(fragment, case["bundle"], files, dict[str, Any])
    assert typed["predicted_class"] == CLASSES[int(np.argmax(want))]
    (tensor,) = classify(fragment, case["bundle"], files, torch.Tensor)
    assert isinstance(tensor, torch.Tensor)


@pytest.mark.parametrize(
    ("port", "words"),
    [(Image, r"is scores \(not a spatial image\).*declares it an Image port"), (bytes, r"as bytes, which the")],
)
def test_a_port_the_scores_cannot_take_is_refused_naming_the_metadata_and_output(
    fragment: Application, case: dict[str, Any], port: Any, words: str
) -> None:
    with pytest.raises(BundleError, match=words) as caught:
        classify(fragment, case["bundle"], [], port)
    assert caught.value.file.endswith("configs/metadata.json")
    assert caught.value.item == "network_data_format#outputs#pred"


def test_a_2d_image_the_loader_cannot_read_is_one_error_naming_the_file(tmp_path: Path) -> None:
    broken = tmp_path / "scan.png"
    broken.write_bytes(b"\x89PNG\r\n\x1a\n not really")
    with pytest.raises(InputDataError, match=r"'.*scan.png' cannot be read as a 2D image"):
        read_image_2d(broken)


def test_a_single_instance_dicom_image_without_an_affine_is_taken(tmp_path: Path) -> None:
    """``DICOMSeriesToVolumeOperator`` gives a one-instance series (every MG image) no ``nifti_affine_transform``."""
    pixels = np.arange(1 * 6 * 5, dtype=np.float32).reshape(1, 6, 5)  # (D, H, W): one slice of 6 rows, 5 columns
    meta = {"SeriesInstanceUID": "1.2", "row_pixel_spacing": 0.1, "col_pixel_spacing": 0.2, "depth_pixel_spacing": 1.0}
    tensor = image_to_tensor(Image(pixels, metadata=meta), "image")
    assert tuple(tensor.shape) == (5, 6, 1)  # (W, H, D) as every DICOM image is handed to a bundle
    np.testing.assert_allclose(np.asarray(tensor.meta["spacing"]), [0.2, 0.1, 1.0])  # columns along i
    np.testing.assert_allclose(np.asarray(tensor.affine), np.diag([0.2, 0.1, 1.0, 1.0]))
    with pytest.raises(InputDataError, match=r"shape \[2, 6, 5\] has no nifti_affine_transform"):
        image_to_tensor(Image(np.zeros((2, 6, 5), np.float32), metadata=meta), "image")


def test_repo_describe_check_and_build_a_classification_bundle(
    case: dict[str, Any], tmp_path: Path, capsys: pytest.CaptureFixture[str], restore_console: None
) -> None:
    """The zoo's ``spatial_shape [1, 4]`` is a ``[-1, 4]`` tensor everywhere a bundle's signature is written."""
    from monai_triton_ops.cli import main

    capsys.readouterr()
    assert main(["repo", "describe", str(case["bundle"])]) == 0
    out = capsys.readouterr().out
    assert "output 0  pred FP32 [-1, 4]" in out
    assert "pred: class scores (A, B, C, D), emitted as a result" in out
    assert main(["repo", "check", str(case["bundle"])]) == 0
    assert "pred FP32 [-1, 4]" in capsys.readouterr().out
    assert main(["repo", "build", str(case["bundle"]), "-o", str(tmp_path / "repo")]) == 0
    config = (tmp_path / "repo" / "tiny_density" / "config.pbtxt").read_text()
    assert 'name: "pred"' in config
    assert "dims: [-1, 4]" in config


#: ``network_data_format#outputs`` entries as the model zoo's bundles write them (trimmed to the keys read).
ZOO_OUTPUTS = {
    "spleen_ct_segmentation": ({"type": "image", "format": "segmentation", "num_channels": 2,
                                "spatial_shape": [96, 96, 96]}, OutputKind.IMAGE, None),
    "breast_density_classification": ({"type": "image", "format": "labels", "num_channels": 4,
                                       "spatial_shape": [1, 4]}, OutputKind.SCORES, (4,)),
    "endoscopic_inbody_classification": ({"type": "probabilities", "format": "classes", "num_channels": 2,
                                          "spatial_shape": [1, 2]}, OutputKind.SCORES, (2,)),
    "pathology_tumor_detection": ({"type": "probability", "format": "classification", "num_channels": 1,
                                   "spatial_shape": [1, 1]}, OutputKind.SCORES, (1,)),
    "mednist_gan": ({"type": "image", "format": "magnitude", "num_channels": 1, "spatial_shape": [64, 64]},
                    OutputKind.IMAGE, None),
    "a detector's boxes": ({"type": "object_detection", "format": "boxes", "num_channels": 0, "spatial_shape": []},
                           OutputKind.RESULT, None),
}  # fmt: skip


@pytest.mark.parametrize("bundle", sorted(ZOO_OUTPUTS))
def test_each_zoo_output_is_the_kind_it_is(bundle: str) -> None:
    desc, kind, dims = ZOO_OUTPUTS[bundle]
    assert output_kind(desc) is kind
    assert tensor_dims(desc) == dims
