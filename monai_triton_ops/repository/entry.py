"""What a caller says about a new repository entry, resolved into the plan that builds it.

One set of keywords for ``generate_config`` and ``build_repository`` (and the CLI's ``repo build`` /
``config``). Each setting comes from the first of::

    an explicit keyword (a CLI option)  >  the template (like=, --like CONFIG)  >  the model file  >  the default

so ``like="spleen_ct/config.pbtxt", flavor="python", instance_kind="cpu"`` keeps everything of the
App SDK's client-side config but serves it with the python runner on CPU instances.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from ..errors import ConfigError, MonaiTritonError
from . import layout
from .config import ConfigOptions, DynamicBatching, InstanceGroup, VersionPolicy
from .describe import ExampleKeywords, ModelSource
from .like import Template, read_template
from .onnx_model import DEFAULT_ONNX_FILENAME, is_onnx_file

logger = logging.getLogger(__name__)


class EntryKeywords(ExampleKeywords, total=False):
    """What describes a model and shapes its ``config.pbtxt``, as keywords (one declaration for every caller).

    ``flavor``: ``python`` (default) or ``libtorch``. ``instance_groups`` replace the groups;
    ``instance_kind`` / ``instance_count`` then change every group (or make one). ``parameters`` are
    added to the template's. ``input_names`` / ``output_names``: one per tensor, in order.
    ``like``: a ``config.pbtxt`` (or its model folder) to take everything else from.
    """

    max_batch_size: int | None
    flavor: str | None
    dynamic_batching: DynamicBatching | None
    instance_groups: Sequence[InstanceGroup]
    instance_kind: str | None
    instance_count: int | None
    version_policy: VersionPolicy | None
    parameters: Mapping[str, str]
    model_filename: str | None
    input_names: Sequence[str] | None
    output_names: Sequence[str] | None
    like: str | Path | None


@dataclass(frozen=True, kw_only=True, eq=False)
class EntryPlan:
    """A model file, how to describe it, how to serve it, and the names and template to apply."""

    source: ModelSource
    options: ConfigOptions
    input_names: tuple[str, ...] = ()
    output_names: tuple[str, ...] = ()
    template: Template | None = None


def plan_entry(model_path: str | Path, name: str | None, keywords: EntryKeywords) -> EntryPlan:
    """Resolve ``keywords`` (and the template they name) into an ``EntryPlan``; nothing is run yet."""
    like = keywords.get("like")
    template = read_template(like) if like is not None else None
    if name is None and template is not None:
        name = template.name
    if name is None:
        raise ConfigError("a model name is needed: pass --name (name=), or --like a config.pbtxt that has one")
    layout.check_model_name(name)
    given_batch = keywords.get("max_batch_size")
    max_batch_size = given_batch if given_batch is not None else template.max_batch_size if template else 0
    shapes = keywords.get("input_shapes")
    dtypes = keywords.get("input_dtypes")
    if template is not None and not shapes and _needs_probe(Path(model_path), keywords.get("bundle_metadata")):
        shapes = template.example_shapes(max_batch_size)  # probe the model on the template's shapes
        dtypes = dtypes or (template.input_dtypes() if shapes else None)
    source = ModelSource(
        path=Path(model_path),
        name=name,
        input_shapes=shapes,
        input_dtypes=dtypes,
        bundle_metadata=keywords.get("bundle_metadata"),
        max_batch_size=max_batch_size,
    )
    flavor = keywords.get("flavor")
    base = template.options(flavor) if template is not None else ConfigOptions(flavor=flavor or "python")
    return EntryPlan(
        source=source,
        options=_override(base, keywords, name, max_batch_size, Path(model_path)),
        input_names=tuple(keywords.get("input_names") or ()),
        output_names=tuple(keywords.get("output_names") or ()),
        template=template,
    )


def _needs_probe(path: Path, bundle_metadata: str | Path | None) -> bool:
    """A TorchScript file without MONAI metadata (and no bundle's): its signature must come from a run.

    With metadata the model is checked on the shapes the metadata implies, and the template is then
    compared with it tensor by tensor, so a contradiction names the template, not a probe shape.
    """
    from .metadata import read_torchscript_metadata

    if bundle_metadata is not None or not path.is_file() or is_onnx_file(path):
        return False
    try:
        return read_torchscript_metadata(path) is None
    except MonaiTritonError:
        return False  # not TorchScript: describe() says what it is


def _override(
    base: ConfigOptions, keywords: EntryKeywords, name: str, max_batch_size: int, path: Path
) -> ConfigOptions:
    """``base`` (the template's options, or the defaults) with every explicit keyword applied."""
    changes: dict[str, Any] = {}
    if keywords.get("dynamic_batching") is not None:
        changes["dynamic_batching"] = keywords["dynamic_batching"]
    elif base.dynamic_batching is not None and max_batch_size == 0:
        logger.warning("model %r: max_batch_size 0 leaves no batch to form; the dynamic batcher is dropped", name)
        changes["dynamic_batching"] = None
    groups = tuple(keywords.get("instance_groups") or base.instance_groups)
    kind, count = keywords.get("instance_kind"), keywords.get("instance_count")
    if kind is not None or count is not None:
        groups = tuple(
            InstanceGroup(kind=kind or group.kind, count=count or group.count) for group in groups or (InstanceGroup(),)
        )
    changes["instance_groups"] = groups
    if keywords.get("version_policy") is not None:
        changes["version_policy"] = keywords["version_policy"]
    if keywords.get("parameters"):
        changes["parameters"] = {**base.parameters, **dict(keywords["parameters"])}
    if keywords.get("model_filename"):
        changes["model_filename"] = keywords["model_filename"]
    elif is_onnx_file(path) and base.model_filename == layout.DEFAULT_MODEL_FILENAME:
        changes["model_filename"] = DEFAULT_ONNX_FILENAME
    elif path.suffix.lower() == layout.PT2_SUFFIX and base.model_filename == layout.DEFAULT_MODEL_FILENAME:
        changes["model_filename"] = layout.DEFAULT_PT2_FILENAME  # the runner tells a program by its suffix
    return replace(base, **changes)
