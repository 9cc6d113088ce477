"""Broken bundles as users make them, each with the file and config item its one error must name.

``BROKEN[kind](folder) -> (path to give, config names)``; ``EXPECTED[kind] = (file ending, item, words)``:
the error must name a file ending so, the item (``""``: the whole file) and say the words.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from .classify import classify_bundle
from .heads import detection_maker, heads_bundle
from .makers import UNET_CONFIG, metadata, unet_bundle

Made = tuple[Path, tuple[str, ...]]
INFERENCE = ("inference",)


def _config(folder: Path) -> dict[str, Any]:
    return dict(json.loads((folder / "configs" / "inference.json").read_text()))


def _write(folder: Path, config: dict[str, Any]) -> None:
    (folder / "configs" / "inference.json").write_text(json.dumps(config, indent=1))


def no_metadata(folder: Path) -> Made:
    (unet_bundle(folder) / "configs" / "metadata.json").unlink()
    return folder, INFERENCE


def json_syntax(folder: Path) -> Made:
    unet_bundle(folder)
    text = (folder / "configs" / "inference.json").read_text()
    (folder / "configs" / "inference.json").write_text(text.replace('"inferer": {', '"inferer": {,', 1))
    return folder, INFERENCE


def yaml_syntax(folder: Path) -> Made:
    unet_bundle(folder)
    (folder / "configs" / "override.yaml").write_text("inferer:\n  roi_size: [16, 16\n  mode: gaussian\n")
    return folder, ("inference", "override")


def missing_network_def(folder: Path) -> Made:
    unet_bundle(folder, form="pt")
    config = _config(folder)
    del config["network_def"], config["network"]
    _write(folder, config)
    return folder, INFERENCE


def unknown_transform(folder: Path) -> Made:
    config = json.loads(json.dumps(UNET_CONFIG))
    config["preprocessing"]["transforms"][2] = {"_target_": "Orientationdd", "keys": "image", "axcodes": "RAS"}
    unet_bundle(folder, preprocessing=config["preprocessing"])
    return folder, INFERENCE


def weights_do_not_fit(folder: Path) -> Made:
    unet_bundle(folder, form="pt")
    config = _config(folder)
    config["network_def"]["channels"] = [8, 16]
    _write(folder, config)
    return folder, INFERENCE


def two_inputs(folder: Path) -> Made:
    unet_bundle(folder)
    meta = metadata("tiny_spleen", 1, 3, 3)
    inputs = meta["network_data_format"]["inputs"]
    inputs["label"] = dict(inputs["image"])
    (folder / "configs" / "metadata.json").write_text(json.dumps(meta))
    return folder, INFERENCE


def module_inferer(folder: Path) -> Made:
    """``SaliencyInferer`` hooks the network's layers: it needs a torch module, which no server has."""
    unet_bundle(folder, inferer={"_target_": "SaliencyInferer", "cam_name": "GradCAM", "target_layers": "model.2"})
    return folder, INFERENCE


def config_name_missing(folder: Path) -> Made:
    return unet_bundle(folder), ("inference", "infer_tta")


def no_data_format(folder: Path) -> Made:
    unet_bundle(folder)
    meta = metadata("tiny_spleen", 1, 3, 3)
    del meta["network_data_format"]
    (folder / "configs" / "metadata.json").write_text(json.dumps(meta))
    return folder, INFERENCE


def no_network(folder: Path) -> Made:
    (unet_bundle(folder) / "models" / "model.ts").unlink()
    return folder, INFERENCE


def plain_torchscript(folder: Path) -> Made:
    folder.mkdir(parents=True)
    torch.jit.script(torch.nn.Identity()).save(str(folder / "model.ts"))
    return folder / "model.ts", INFERENCE


def not_a_compose(folder: Path) -> Made:
    unet_bundle(folder, postprocessing={"_target_": "AsDiscreted", "keys": "pred", "argmax": True})
    return folder, INFERENCE


def class_names_count(folder: Path) -> Made:
    """The zoo's breast density metadata with one class name left out: results would name the wrong classes."""
    return classify_bundle(folder, channel_def={"0": "A", "1": "B", "2": "C"}), INFERENCE


def class_names_not_numbered(folder: Path) -> Made:
    return classify_bundle(
        folder, channel_def={"A": "fatty", "B": "scattered", "C": "dense", "D": "extreme"}
    ), INFERENCE


def scores_without_channels(folder: Path) -> Made:
    """``type "probabilities"`` (the zoo's endoscopy classifier's) without ``num_channels``: no tensor size."""
    return classify_bundle(folder, type="probabilities", num_channels=None, channel_def={}), INFERENCE


def _detection(folder: Path, **changes: Any) -> Path:
    bundle = detection_maker().make_bundle(folder)
    config = {**_config(bundle), **changes}
    _write(bundle, {k: v for k, v in config.items() if v is not None})
    return bundle


def detector_without_ops(folder: Path) -> Made:
    """The detector never set up: no sliding window, no box selector thresholds, no target keys."""
    return _detection(folder, detector_ops=None), INFERENCE


def not_a_detector(folder: Path) -> Made:
    return _detection(folder, detector="$@anchor_generator"), INFERENCE


def scripts_import_error(folder: Path) -> Made:
    heads_bundle(folder)
    script = folder / "scripts" / "heads.py"
    script.write_text("import not_installed_package\n" + script.read_text())
    return folder, INFERENCE


def head_missing(folder: Path) -> Made:
    """The metadata names a head (``edge``) the network does not return."""
    heads_bundle(folder)
    meta = json.loads((folder / "configs" / "metadata.json").read_text())
    outputs = meta["network_data_format"]["outputs"]
    outputs["edge"] = dict(outputs["dist"])
    (folder / "configs" / "metadata.json").write_text(json.dumps(meta))
    return folder, INFERENCE


def head_without_dims(folder: Path) -> Made:
    """A head that is one number per image: a served output needs a batch and a channel dim."""
    heads_bundle(folder)
    script = folder / "scripts" / "heads.py"
    text = script.read_text().replace('"dist": torch.tanh(self.dist(features))', '"dist": self.dist(features).mean()')
    script.write_text(text)
    return folder, INFERENCE


#: Broken bundles found only when the network runs on an example (``repo describe``, ``build``, ``check``).
AT_DESCRIBE = frozenset({"head_missing", "head_without_dims"})

BROKEN: dict[str, Callable[[Path], Made]] = {
    "no_metadata": no_metadata,
    "json_syntax": json_syntax,
    "yaml_syntax": yaml_syntax,
    "missing_network_def": missing_network_def,
    "unknown_transform": unknown_transform,
    "weights_do_not_fit": weights_do_not_fit,
    "two_inputs": two_inputs,
    "module_inferer": module_inferer,
    "config_name_missing": config_name_missing,
    "no_data_format": no_data_format,
    "no_network": no_network,
    "plain_torchscript": plain_torchscript,
    "not_a_compose": not_a_compose,
    "class_names_count": class_names_count,
    "class_names_not_numbered": class_names_not_numbered,
    "scores_without_channels": scores_without_channels,
    "detector_without_ops": detector_without_ops,
    "not_a_detector": not_a_detector,
    "scripts_import_error": scripts_import_error,
    "head_missing": head_missing,
    "head_without_dims": head_without_dims,
}

EXPECTED: dict[str, tuple[str, str, str]] = {
    "no_metadata": ("configs/metadata.json", "", "is missing"),
    "json_syntax": ("configs/inference.json", "", "is not valid JSON: .* at line \\d+ column \\d+"),
    "yaml_syntax": ("configs/override.yaml", "", "is not valid YAML"),
    "missing_network_def": ("configs/inference.json", "network_def", "has no 'network_def' item"),
    "unknown_transform": ("configs/inference.json", "preprocessing", "Orientationdd"),
    "weights_do_not_fit": ("models/model.pt", "network_def", "weights do not fit the network"),
    "two_inputs": ("configs/metadata.json", "network_data_format#inputs", "takes 2 inputs"),
    "module_inferer": ("configs/inference.json", "inferer", "SaliencyInferer .* needs? the network as a torch module"),
    "config_name_missing": ("configs", "", "has no config 'infer_tta'"),
    "no_data_format": ("configs/metadata.json", "network_data_format", "has no network_data_format"),
    "no_network": ("models", "", "neither models/model.ts nor models/model.pt"),
    "plain_torchscript": ("model.ts", "", "without embedded bundle configs"),
    "not_a_compose": ("configs/inference.json", "postprocessing", "must be a Compose"),
    "class_names_count": ("configs/metadata.json", "network_data_format#outputs#pred", "names 3 classes .* is 4"),
    "class_names_not_numbered": ("configs/metadata.json", "network_data_format#outputs#pred", "keyed '0'..'3'"),
    "scores_without_channels": ("configs/metadata.json", "network_data_format#outputs#pred", "gives no num_channels"),
    "detector_without_ops": ("configs/inference.json", "detector_ops", "has no 'detector_ops' item"),
    "not_a_detector": ("configs/inference.json", "detector", "must build a detector holding its network"),
    "scripts_import_error": ("scripts/heads.py", "network_def", "cannot be imported .*not_installed_package"),
    "head_missing": ("configs/metadata.json", "network_data_format#outputs#edge", "heads \\['seg', 'dist'\\]"),
    "head_without_dims": ("configs/inference.json", "network_def", "output 'dist' has shape \\[\\]"),
}
