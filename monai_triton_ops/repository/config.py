"""``config.pbtxt`` <-> ``(ModelSignature, ConfigOptions)``, through Triton's own protobuf model.

The text is always produced by ``model_config_pb2`` and ``text_format`` (never a string template),
so what we write is what Triton parses. Two flavours:

``python``    ``backend: "python"`` with our TorchScript runner ``model.py`` (what the local server runs)
``libtorch``  ``platform: "pytorch_libtorch"`` (NGC Triton containers); how that backend maps tensor
              names is in ``naming.py``
``onnxruntime`` ``platform: "onnxruntime_onnx"`` for an ONNX model (Triton's ONNX Runtime backend); the
              python flavour serves the same ``model.onnx`` through the runner's ONNX Runtime session

The MONAI metadata travels in ``parameters["monai_metadata"]`` (a JSON string), so a remote client
learns channel meanings from the server alone. Protobuf drops zero scalars, but Triton needs
``max_batch_size: 0`` spelled out, so that one line is added to the text after rendering. Fields this
module does not model (``optimization``, ``model_warmup``, ...) travel as ``ConfigOptions.extra``, so a
configuration taken as a template (``--like``) keeps them.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from types import MappingProxyType
from typing import Any

from google.protobuf import text_format
from tritonclient.grpc import model_config_pb2 as pb

from ..errors import ConfigError, ModelNotFoundError
from ..signature import ModelSignature, TensorSpec
from . import layout
from .metadata import parse_metadata_text
from .naming import libtorch_naming

FLAVORS = ("python", "libtorch", "onnxruntime")
INSTANCE_KINDS = ("KIND_AUTO", "KIND_CPU", "KIND_GPU", "KIND_MODEL")
#: ``parameters`` keys this package owns.
METADATA_PARAMETER = "monai_metadata"
TORCHSCRIPT_PARAMETER = "torchscript_filename"
LIBTORCH_PLATFORM = "pytorch_libtorch"
ONNXRUNTIME_PLATFORM = "onnxruntime_onnx"
#: Parameters a flavour always sets (libtorch: run under torch.inference_mode, like our runner).
_FLAVOR_PARAMETERS: Mapping[str, Mapping[str, str]] = MappingProxyType(
    {"libtorch": MappingProxyType({"INFERENCE_MODE": "true"})}
    | dict.fromkeys(("python", "onnxruntime"), MappingProxyType({}))
)
#: Top-level ``ModelConfig`` fields that the signature and ``ConfigOptions`` model; the rest is ``extra``.
MODELLED_FIELDS = frozenset(
    {
        "name", "platform", "backend", "max_batch_size", "input", "output", "instance_group",
        "dynamic_batching", "version_policy", "parameters", "default_model_filename",
    }
)  # fmt: skip


@dataclass(frozen=True, kw_only=True)
class DynamicBatching:
    """Triton's dynamic batcher; needs ``max_batch_size > 0``."""

    preferred_batch_sizes: tuple[int, ...] = ()
    max_queue_delay_us: int = 0

    def __post_init__(self) -> None:
        object.__setattr__(self, "preferred_batch_sizes", tuple(int(s) for s in self.preferred_batch_sizes))
        if any(s < 1 for s in self.preferred_batch_sizes):
            raise ConfigError(f"preferred_batch_sizes must be >= 1, got {list(self.preferred_batch_sizes)}")
        if self.max_queue_delay_us < 0:
            raise ConfigError(f"max_queue_delay_us must be >= 0, got {self.max_queue_delay_us}")


@dataclass(frozen=True, kw_only=True)
class InstanceGroup:
    """How many copies of the model run, and where (``KIND_CPU``, ``KIND_GPU``, ``KIND_AUTO``)."""

    kind: str = "KIND_AUTO"
    count: int = 1

    def __post_init__(self) -> None:
        kind = self.kind.upper()
        kind = kind if kind.startswith("KIND_") else f"KIND_{kind}"
        if kind not in INSTANCE_KINDS:
            raise ConfigError(f"instance kind must be one of {', '.join(INSTANCE_KINDS)}, got {self.kind!r}")
        object.__setattr__(self, "kind", kind)
        if self.count < 1:
            raise ConfigError(f"instance count must be >= 1, got {self.count}")


@dataclass(frozen=True, kw_only=True)
class VersionPolicy:
    """Which versions Triton serves: the ``latest`` N, ``all``, or ``specific`` ones (exactly one)."""

    latest: int | None = None
    all: bool = False
    specific: tuple[int, ...] = ()

    def __post_init__(self) -> None:
        object.__setattr__(self, "specific", tuple(int(v) for v in self.specific))
        chosen = [self.latest is not None, self.all, bool(self.specific)]
        if sum(chosen) != 1:
            raise ConfigError("version_policy: set exactly one of latest, all, specific")
        if (self.latest is not None and self.latest < 1) or any(v < 1 for v in self.specific):
            raise ConfigError(f"version_policy: versions must be >= 1, got {self}")


@dataclass(frozen=True, kw_only=True)
class ConfigOptions:
    """Everything in ``config.pbtxt`` that the signature does not say.

    ``model_filename`` is the TorchScript file in each version folder: ``default_model_filename``
    for libtorch, the ``torchscript_filename`` parameter for the python flavour (whose own
    default file is the runner ``model.py``). ``parameters`` are extra string parameters
    (``DISABLE_OPTIMIZED_EXECUTION``...). ``extra`` holds the other top-level fields as protobuf text.
    """

    flavor: str = "python"
    dynamic_batching: DynamicBatching | None = None
    instance_groups: tuple[InstanceGroup, ...] = ()
    model_filename: str = layout.DEFAULT_MODEL_FILENAME
    version_policy: VersionPolicy | None = None
    parameters: Mapping[str, str] = field(default_factory=dict)
    extra: str = ""

    def __post_init__(self) -> None:
        if self.flavor not in FLAVORS:
            raise ConfigError(f"flavor must be one of {', '.join(FLAVORS)}, got {self.flavor!r}")
        object.__setattr__(self, "instance_groups", tuple(self.instance_groups))
        name = self.model_filename
        if not name or "/" in name or "\\" in name or name in {".", ".."} or name == "model.py":
            raise ConfigError(f"model_filename {name!r} must be a plain file name other than model.py")
        reserved = {METADATA_PARAMETER, TORCHSCRIPT_PARAMETER} & set(self.parameters)
        if reserved:
            raise ConfigError(f"parameters {sorted(reserved)} are set by monai-triton-ops itself")
        if self.extra:
            _check_extra(self.extra)


def _check_extra(text: str) -> None:
    extra = pb.ModelConfig()
    try:
        text_format.Parse(text, extra)
    except text_format.ParseError as exc:
        raise ConfigError(f"extra config.pbtxt fields are not valid: {exc}") from exc
    modelled = sorted(f.name for f, _ in extra.ListFields() if f.name in MODELLED_FIELDS)
    if modelled:
        raise ConfigError(f"extra config.pbtxt fields {modelled} are set through their own options, not extra")


# -- signature + options -> protobuf -> text --------------------------------------------------
def build_config(signature: ModelSignature, options: ConfigOptions) -> pb.ModelConfig:
    """The ``ModelConfig`` message for ``signature`` served as ``options`` say."""
    if options.flavor == "libtorch":
        libtorch_naming(signature)  # raises for names libtorch would map to the wrong tensor
    config = pb.ModelConfig(name=signature.name)
    _set_flavor(config, options)
    _set_batching(config, signature, options)
    _set_tensors(config, signature)
    _set_instance_groups(config, options)
    _set_version_policy(config, options)
    _set_parameters(config, signature, options)
    if options.extra:
        text_format.Merge(options.extra, config)
    return config


def render_config(signature: ModelSignature, options: ConfigOptions) -> str:
    """``config.pbtxt`` text; ``max_batch_size: 0`` is written explicitly, as Triton requires."""
    return config_text(build_config(signature, options))


def config_text(config: pb.ModelConfig) -> str:
    """A ``ModelConfig`` as ``config.pbtxt`` text, with ``max_batch_size: 0`` spelled out (protobuf drops it)."""
    text = str(text_format.MessageToString(config, use_short_repeated_primitives=True))
    if config.max_batch_size == 0:
        text = _insert_before_inputs(text, "max_batch_size: 0\n")
    return text


def _set_flavor(config: pb.ModelConfig, options: ConfigOptions) -> None:
    if options.flavor == "libtorch":
        config.platform = LIBTORCH_PLATFORM
        config.default_model_filename = options.model_filename
    elif options.flavor == "onnxruntime":
        config.platform = ONNXRUNTIME_PLATFORM
        config.default_model_filename = options.model_filename
    else:
        config.backend = "python"


def _set_batching(config: pb.ModelConfig, signature: ModelSignature, options: ConfigOptions) -> None:
    config.max_batch_size = signature.max_batch_size
    batching = options.dynamic_batching
    if batching is None:
        return
    model = signature.name
    if signature.max_batch_size == 0:
        raise ConfigError(f"model {model!r}: dynamic batching needs max_batch_size > 0, got 0")
    too_big = [s for s in batching.preferred_batch_sizes if s > signature.max_batch_size]
    if too_big:
        raise ConfigError(
            f"model {model!r}: preferred batch sizes {too_big} exceed max_batch_size {signature.max_batch_size}"
        )
    config.dynamic_batching.SetInParent()
    config.dynamic_batching.preferred_batch_size.extend(batching.preferred_batch_sizes)
    config.dynamic_batching.max_queue_delay_microseconds = batching.max_queue_delay_us


def _set_tensors(config: pb.ModelConfig, signature: ModelSignature) -> None:
    for specs, target in ((signature.inputs, config.input), (signature.outputs, config.output)):
        for spec in specs:
            tensor = target.add(name=spec.name, data_type=_wire_to_proto(spec.dtype))
            tensor.dims.extend(spec.shape)


def _set_instance_groups(config: pb.ModelConfig, options: ConfigOptions) -> None:
    for group in options.instance_groups:
        config.instance_group.add(kind=pb.ModelInstanceGroup.Kind.Value(group.kind), count=group.count)


def _set_version_policy(config: pb.ModelConfig, options: ConfigOptions) -> None:
    policy = options.version_policy
    if policy is None:
        return
    if policy.latest is not None:
        config.version_policy.latest.num_versions = policy.latest
    elif policy.all:
        config.version_policy.all.SetInParent()
    else:
        config.version_policy.specific.versions.extend(policy.specific)


def _set_parameters(config: pb.ModelConfig, signature: ModelSignature, options: ConfigOptions) -> None:
    values = {**_FLAVOR_PARAMETERS[options.flavor], **options.parameters}
    if options.flavor == "python":
        values[TORCHSCRIPT_PARAMETER] = options.model_filename
    if signature.metadata:
        values[METADATA_PARAMETER] = json.dumps(dict(signature.metadata), sort_keys=True)
    for key, value in values.items():
        config.parameters[key].string_value = value


def _insert_before_inputs(text: str, line: str) -> str:
    """Put ``line`` where protobuf would have printed the field: just before the first ``input {``."""
    lines = text.splitlines(keepends=True)
    at = next((i for i, current in enumerate(lines) if current.startswith("input {")), len(lines))
    return "".join([*lines[:at], line, *lines[at:]])


def _wire_to_proto(dtype: str) -> int:
    return int(pb.DataType.Value("TYPE_STRING" if dtype == "BYTES" else f"TYPE_{dtype}"))


def _proto_to_wire(data_type: int, where: str) -> str:
    name = pb.DataType.Name(data_type)
    if name == "TYPE_INVALID":
        raise ConfigError(f"{where}: data_type is missing or TYPE_INVALID")
    return "BYTES" if name == "TYPE_STRING" else name.removeprefix("TYPE_")


# -- text -> protobuf -> signature + options -----------------------------------------------------
def parse_config(
    text: str, *, source: str = "config.pbtxt", name: str | None = None, default_name: str | None = None
) -> pb.ModelConfig:
    """Parse ``config.pbtxt`` text into a ``ModelConfig``.

    ``name`` is the model folder's: it fills in an omitted name and must match a given one (as
    Triton requires). ``default_name`` only fills in an omitted name (a template's, say).
    """
    config = pb.ModelConfig()
    try:
        text_format.Parse(text, config)
    except text_format.ParseError as exc:
        raise ConfigError(f"{source}: not a valid Triton model configuration: {exc}") from exc
    if not config.name:
        if (name or default_name) is None:
            raise ConfigError(f"{source}: the configuration has no name")
        config.name = name or default_name
    elif name is not None and config.name != name:
        raise ConfigError(f"{source}: name {config.name!r} does not match the model folder {name!r}")
    return config


def read_config(path: str | Path, *, name: str | None = None, default_name: str | None = None) -> pb.ModelConfig:
    """Read and parse a ``config.pbtxt`` file (``name``, ``default_name``: as for ``parse_config``)."""
    path = Path(path)
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError as exc:
        raise ModelNotFoundError(f"no model configuration at {str(path)!r}") from exc
    except (OSError, UnicodeDecodeError) as exc:
        raise ConfigError(f"{str(path)!r}: cannot read the model configuration: {exc}") from exc
    return parse_config(text, source=str(path), name=name, default_name=default_name)


def signature_from_config(config: pb.ModelConfig, *, version: int | None = None) -> ModelSignature:
    """The ``ModelSignature`` a ``ModelConfig`` declares (any backend, not only ours)."""
    model = config.name
    return ModelSignature(
        name=model,
        inputs=tuple(_tensor(model, "input", t) for t in config.input),
        outputs=tuple(_tensor(model, "output", t) for t in config.output),
        max_batch_size=config.max_batch_size,
        version=version,
        metadata=_metadata(config),
    )


def options_from_config(config: pb.ModelConfig, *, flavor: str | None = None) -> ConfigOptions:
    """The ``ConfigOptions`` that render ``config`` again (flavours of this package only).

    ``flavor`` overrides the one ``config`` names: a configuration for another backend (or for
    libtorch, served here by the python runner) then gives everything else it holds.
    """
    flavor = flavor or _flavor(config)
    own = {METADATA_PARAMETER, TORCHSCRIPT_PARAMETER}
    defaults = _FLAVOR_PARAMETERS[flavor]
    parameters = {
        key: value.string_value
        for key, value in config.parameters.items()
        if key not in own and defaults.get(key) != value.string_value
    }
    batching = None
    if config.HasField("dynamic_batching"):
        batching = DynamicBatching(
            preferred_batch_sizes=tuple(config.dynamic_batching.preferred_batch_size),
            max_queue_delay_us=config.dynamic_batching.max_queue_delay_microseconds,
        )
    return ConfigOptions(
        flavor=flavor,
        dynamic_batching=batching,
        instance_groups=tuple(
            InstanceGroup(kind=pb.ModelInstanceGroup.Kind.Name(g.kind), count=g.count or 1)
            for g in config.instance_group
        ),
        model_filename=torchscript_filename(config),
        version_policy=_version_policy(config),
        parameters=parameters,
        extra=extra_fields(config),
    )


def extra_fields(config: pb.ModelConfig) -> str:
    """The top-level fields of ``config`` that no option models, as protobuf text ("" when none)."""
    rest = pb.ModelConfig()
    rest.CopyFrom(config)
    for name in MODELLED_FIELDS:
        rest.ClearField(name)
    return str(text_format.MessageToString(rest, use_short_repeated_primitives=True))


def torchscript_filename(config: pb.ModelConfig) -> str:
    """The TorchScript file in each version folder, whichever flavour wrote the configuration."""
    if TORCHSCRIPT_PARAMETER in config.parameters:
        return str(config.parameters[TORCHSCRIPT_PARAMETER].string_value)
    if config.backend != "python" and config.default_model_filename:
        return str(config.default_model_filename)
    return layout.DEFAULT_MODEL_FILENAME


def _tensor(model: str, kind: str, tensor: Any) -> TensorSpec:
    where = f"model {model!r} {kind} {tensor.name!r}"
    if not tensor.dims:
        raise ConfigError(f"{where}: dims are empty; expected at least one dim (-1 for dynamic)")
    return TensorSpec(name=tensor.name, dtype=_proto_to_wire(tensor.data_type, where), shape=tuple(tensor.dims))


def _metadata(config: pb.ModelConfig) -> dict[str, Any]:
    if METADATA_PARAMETER not in config.parameters:
        return {}
    text = config.parameters[METADATA_PARAMETER].string_value
    what = f"parameter {METADATA_PARAMETER!r}"
    return parse_metadata_text(text, source=f"model {config.name!r}", what=what) or {}


def _flavor(config: pb.ModelConfig) -> str:
    if config.platform == LIBTORCH_PLATFORM or config.backend == "pytorch":
        return "libtorch"
    if config.backend == "python":
        return "python"
    if config.platform == ONNXRUNTIME_PLATFORM or config.backend == "onnxruntime":
        return "onnxruntime"
    found = config.platform or config.backend or "none"
    raise ConfigError(
        f"model {config.name!r}: platform/backend {found!r} is not one this package writes "
        f"(expected platform {LIBTORCH_PLATFORM!r}, {ONNXRUNTIME_PLATFORM!r} or backend 'python')"
    )


def _version_policy(config: pb.ModelConfig) -> VersionPolicy | None:
    choice = config.version_policy.WhichOneof("policy_choice") if config.HasField("version_policy") else None
    if choice == "latest":
        return VersionPolicy(latest=config.version_policy.latest.num_versions)
    if choice == "all":
        return VersionPolicy(all=True)
    if choice == "specific":
        return VersionPolicy(specific=tuple(config.version_policy.specific.versions))
    return None
