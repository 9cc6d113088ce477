"""Whole-volume models: ``<name>_volume`` next to a network's model, so the sliding window runs beside the server.

Per-window remote inference sends every window over the network and every window's scores back
(``docs/remote.md``, "Whole-volume mode"). ``wrap_network`` adds to a repository a Python-backend
model ``<name>_volume`` that takes the whole pre-processed volume (dynamic spatial dims), runs MONAI's
sliding-window inferer on the server (``runner/volume.py``) and calls the network model through BLS.
It answers with the argmax label map (``LABELS``, uint8) or, when asked for the network's output
name, the blended scores.

What it wraps travels in its ``config.pbtxt``: the network's MONAI metadata (so a client reads the
same ``inference`` defaults from either model) with a ``whole_volume`` block added, which the runner
and the client both read (:class:`~monai_triton_ops.volume_spec.VolumeSpec`, beside the signature: the
client reads it without this package).
"""

from __future__ import annotations

import json
import logging
import shutil
from dataclasses import asdict, replace
from pathlib import Path
from typing import TYPE_CHECKING

from ..errors import ConfigError, ModelNotFoundError
from ..volume_spec import DEFAULT_MAX_IN_FLIGHT, DEFAULT_MAX_VOLUME_MB, VOLUME_KEY, VolumeSpec
from . import layout

if TYPE_CHECKING:  # torch comes with it; the CLI reads this module's defaults without loading torch
    from ..signature import ModelSignature

logger = logging.getLogger(__name__)

SUFFIX = "_volume"
RUNNER = Path(__file__).parent / "runner" / "volume.py"
#: The runner's own module of settings, copied beside it under the same name (the runner imports it from there).
RUNNER_SETTINGS = RUNNER.with_name("volume_settings.py")
#: Labels are uint8: an argmax over more channels than this cannot be stored.
MAX_LABEL_CHANNELS = 256


def volume_model_name(network: str) -> str:
    """``brain_tissue_seg`` -> ``brain_tissue_seg_volume``."""
    return layout.check_model_name(f"{network}{SUFFIX}")


def plan_volume(
    network: ModelSignature,
    *,
    output: str | None = None,
    max_volume_mb: int = DEFAULT_MAX_VOLUME_MB,
    max_in_flight: int = DEFAULT_MAX_IN_FLIGHT,
) -> tuple[ModelSignature, VolumeSpec]:
    """The signature of ``<network>_volume`` and what it wraps; refuses a network a sliding window cannot feed."""
    from ..signature import ModelSignature, TensorSpec

    name = network.name
    if len(network.inputs) != 1:
        raise ConfigError(
            f"model {name!r} has {len(network.inputs)} inputs {list(network.input_names)}; a sliding window feeds "
            "one, so it cannot be wrapped as a whole-volume model"
        )
    chosen = output or network.output_names[0]
    if chosen not in network.output_names:
        raise ConfigError(f"model {name!r} has no output {chosen!r}; its outputs are {list(network.output_names)}")
    batch = network.max_batch_size
    source, target = network.inputs[0], network.output(chosen)
    image, scores = source.full_shape(batch), target.full_shape(batch)
    if network.batch_axis != 0 or len(image) < 3 or len(scores) != len(image):
        raise ConfigError(
            f"model {name!r}: input {source.name!r} {list(image)} and output {chosen!r} {list(scores)} must both be "
            "(batch, channels, spatial...) with the same spatial rank to be fed window by window"
        )
    channels = scores[1] if scores[1] > 0 else None
    if channels is not None and channels > MAX_LABEL_CHANNELS:
        raise ConfigError(f"model {name!r} output {chosen!r} has {channels} channels: uint8 labels hold at most 256")
    if target.dtype not in ("FP16", "FP32", "FP64", "BF16"):
        raise ConfigError(f"model {name!r} output {chosen!r} is {target.dtype}: the windows are blended as scores")
    spec = VolumeSpec(
        network=name,
        input=source.name,
        output=chosen,
        channels=channels,
        spatial_rank=len(image) - 2,
        batch_axis=True,
        network_max_batch_size=batch,
        max_volume_mb=max_volume_mb,
        max_in_flight=max_in_flight,
    )
    spatial = (-1,) * spec.spatial_rank
    metadata = {**network.metadata, VOLUME_KEY: asdict(spec)}
    signature = ModelSignature(
        name=volume_model_name(name),
        inputs=(TensorSpec(name=source.name, dtype=source.dtype, shape=(-1, image[1], *spatial)),),
        outputs=(
            TensorSpec(name=spec.labels, dtype="UINT8", shape=(-1, 1, *spatial)),
            TensorSpec(name=chosen, dtype=target.dtype, shape=(-1, scores[1], *spatial)),
        ),
        max_batch_size=0,
        metadata=metadata,
    )
    if chosen == spec.labels:
        raise ConfigError(f"model {name!r}: its output is called {spec.labels!r}, the name of the labels output")
    return signature, spec


def render_volume_config(signature: ModelSignature, *, instance_kind: str = "KIND_CPU", instance_count: int = 1) -> str:
    """``config.pbtxt`` of a whole-volume model: Python backend, the runner as ``model.py``, checked by parsing back."""
    from .config import (
        TORCHSCRIPT_PARAMETER,
        ConfigOptions,
        InstanceGroup,
        build_config,
        config_text,
        parse_config,
        signature_from_config,
    )

    options = ConfigOptions(flavor="python", instance_groups=(InstanceGroup(kind=instance_kind, count=instance_count),))
    config = build_config(signature, options)
    del config.parameters[TORCHSCRIPT_PARAMETER]  # no TorchScript file: the runner is the model
    text = config_text(config)
    parsed = signature_from_config(parse_config(text, source=f"generated config of {signature.name!r}"))
    if parsed != replace(signature, version=None):
        raise ConfigError(f"model {signature.name!r}: the generated config.pbtxt does not parse back ({parsed})")
    return text


def wrap_network(
    repository: str | Path,
    name: str,
    *,
    output: str | None = None,
    max_volume_mb: int = DEFAULT_MAX_VOLUME_MB,
    max_in_flight: int = DEFAULT_MAX_IN_FLIGHT,
    instance_kind: str = "KIND_CPU",
    instance_count: int = 1,
    force: bool = False,
) -> Path:
    """Write ``<repository>/<name>_volume`` for the network ``<repository>/<name>``; returns its folder.

    The network needs a ``config.pbtxt`` (any platform: ``repo build`` writes one). All or nothing; an existing
    volume model is replaced only with ``force``. ``instance_kind``: where the blending runs (``KIND_CPU`` by
    default, so the volume's buffers stay in host memory while the network may run on a GPU).
    """
    from .builder import install_entry
    from .config import read_config, signature_from_config

    folder = layout.model_dir(repository, name)
    config_path = folder / layout.CONFIG_FILENAME
    if not config_path.is_file():
        raise ModelNotFoundError(
            f"model {name!r} in {str(Path(repository))!r} has no config.pbtxt to wrap; build it first with "
            f"'monai-triton repo build MODEL -o {repository} --name {name}'"
        )
    network = signature_from_config(read_config(config_path, name=name))
    signature, _ = plan_volume(network, output=output, max_volume_mb=max_volume_mb, max_in_flight=max_in_flight)
    text = render_volume_config(signature, instance_kind=instance_kind, instance_count=instance_count)

    def write(staging: Path) -> None:
        (staging / "1").mkdir()
        (staging / layout.CONFIG_FILENAME).write_text(text, encoding="utf-8")
        shutil.copyfile(RUNNER, staging / "1" / "model.py")
        shutil.copyfile(RUNNER_SETTINGS, staging / "1" / RUNNER_SETTINGS.name)

    target = install_entry(repository, signature.name, write, force=force)
    logger.info("wrote whole-volume model %r for %r to %s", signature.name, name, target)
    return target


def describe_spec(spec: VolumeSpec) -> str:
    """One line for logs: what the volume model wraps."""
    return json.dumps(asdict(spec), sort_keys=True)
