"""Ensembles of MONAI Bundles on torch: folds of one bundle in a models folder, one pre- and post-processing pass.

The folds (``tests/bundles/makers.py``'s ``fold_bundle``) share the zoo-like 3D UNet bundle's configs and differ in
their weights. With a post-processing linear in the prediction (``Invertd`` only, read from an ``np.ndarray``
port) the ensemble's output must be the mean of each fold run alone as a bundle, and its labels (the argmax) must
change when one fold's weights do (``test_ensemble_servers.py`` runs the usual post-processing, argmax included).
Bundles whose configs differ, a member that is not there, one with other output channels and one in
``mode=volume`` are refused, naming the member.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from monai.deploy.core import Application, Image, IOType
from monai.deploy.operators.monai_bundle_inference_operator import IOMapping

from monai_triton_ops import Ensemble, EnsembleInferenceOperator, InferenceOperator
from monai_triton_ops.errors import BundleError, ConfigError, ModelNotFoundError

from ..bundles.heads import heads_bundle
from ..bundles.makers import ct_image, fold_bundle, private_bundle_cache, resampled
from .test_bundle import MAPPING, Ports

FOLDS = ["fold0", "fold1", "fold2"]
HEADS_PORTS = {"input_mapping": ["image"], "output_mapping": ["seg", "dist"]}
#: The scores as they come out of the post-processing (an ``Image`` port would take uint8 labels).
SCORES: dict[str, Any] = {**MAPPING, "output_mapping": [IOMapping("pred", np.ndarray, IOType.IN_MEMORY)]}


@pytest.fixture(scope="module", autouse=True)
def bundle_cache(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """The cache of Triton models built from bundles (the torch backend loads from it), private to this module."""
    with private_bundle_cache(tmp_path_factory) as folder:
        yield folder


@pytest.fixture(scope="module")
def models(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """``MODELS/``: three folds, one with another resampling, one with 2 output channels."""
    folder = tmp_path_factory.mktemp("models")
    for seed, name in enumerate(FOLDS):
        fold_bundle(folder / name, seed)
    fold_bundle(folder / "resampled", 3, preprocessing=resampled([2.0, 2.0, 2.0]))
    fold_bundle(folder / "two_channels", 4, channels=2)
    return folder


@pytest.fixture(scope="module")
def fragment() -> Application:
    return Application()


@pytest.fixture(scope="module")
def image() -> Image:
    return ct_image((32, 32, 32))


def run(op: Any, image: Image) -> Any:
    """The operator's whole life on one image: start, compute (as Holoscan calls it), stop."""
    op.start()
    try:
        ports = Ports({"image": image})
        op.compute(ports, ports, None)
        return ports.emitted["pred"]
    finally:
        op.stop()


def ensemble(fragment: Application, folder: Path, image: Image, members: list[str], **keywords: Any) -> Any:
    mapping = {key: keywords.pop(key) for key in ("input_mapping", "output_mapping") if key in keywords} or SCORES
    backend = keywords.pop("backend", "torch")
    op = EnsembleInferenceOperator(
        fragment, ensemble=Ensemble(members, **keywords), backend=backend, model_path=folder, **mapping
    )
    return run(op, image)


def test_a_bundle_ensemble_is_the_mean_of_each_fold_run_alone(
    fragment: Application, models: Path, image: Image
) -> None:
    alone = [run(InferenceOperator(fragment, bundle_path=models / n, backend="torch", **SCORES), image) for n in FOLDS]
    got = ensemble(fragment, models, image, FOLDS)
    assert got.shape == (3, 32, 32, 32)  # Invertd: back on the input's grid
    assert np.abs(got - np.mean(alone, axis=0)).max() <= 1e-5
    assert np.abs(got - alone[0]).max() > 1e-3  # not one fold's answer
    weighted = ensemble(fragment, models, image, FOLDS[:2], weights=(1, 3))
    assert np.abs(weighted - (alone[0] + 3 * alone[1]) / 4).max() <= 1e-5


def test_the_labels_change_when_one_folds_weights_change(
    fragment: Application, models: Path, image: Image, tmp_path: Path
) -> None:
    """The labels are the argmax of the scores (what the usual post-processing's softmax and argmax give)."""
    changed = tmp_path / "models"
    for name in ("fold0", "fold1"):
        (changed / name).parent.mkdir(exist_ok=True)
        (changed / name).symlink_to(models / name)
    fold_bundle(changed / "fold2", 11)
    labels = [ensemble(fragment, folder, image, FOLDS).argmax(0) for folder in (models, changed)]
    assert len(np.unique(labels[0])) > 1
    assert (labels[0] != labels[1]).any()


def test_bad_bundle_ensembles_are_refused_naming_the_member(fragment: Application, models: Path, image: Image) -> None:
    with pytest.raises(
        BundleError,
        match=r"resampled/configs/inference.json, item 'preprocessing#transforms#3#pixdim': ensemble member "
        r"'resampled' has \[2.0, 2.0, 2.0\], member 'fold0' has \[1.5, 1.5, 2.0\]",
    ):
        ensemble(fragment, models, image, ["fold0", "resampled"])
    with pytest.raises(ModelNotFoundError, match=r"ensemble member 'fold9' is not in the models folder '.*' \(models"):
        ensemble(fragment, models, image, ["fold0", "fold9"])
    with pytest.raises(
        ConfigError, match="ensemble member 'two_channels' gives 2 output channels, member 'fold0' gives"
    ):
        ensemble(fragment, models, image, ["fold0", "two_channels"])
    with pytest.raises(ConfigError, match="ensemble member 'fold0': mode=volume sends the whole image"):
        ensemble(fragment, models, image, ["fold0", "fold1"], backend="grpc://127.0.0.1:9?mode=volume")  # no connect
    heads = heads_bundle(models.parent / "with_heads" / "heads")  # a folder of its own: the fixture's stays folds
    ports = {key: [IOMapping(name, Image, IOType.IN_MEMORY) for name in names] for key, names in HEADS_PORTS.items()}
    with pytest.raises(BundleError, match=r"'network_data_format#outputs': ensemble member 'heads': its network has 2"):
        ensemble(fragment, heads.parent, image, ["heads"], **ports)
    with pytest.raises(ConfigError, match=r"needs the models folder that holds them, one folder each .*fold0"):
        ensemble(fragment, models / "fold0", image, ["fold0", "fold1"])  # one bundle: every member would be it
    with pytest.raises(ConfigError, match="bundle_path= names one bundle"):
        EnsembleInferenceOperator(
            fragment, ensemble=Ensemble(FOLDS), model_path=models, bundle_path=models / "fold0", **SCORES
        )
