"""``InferenceOperator`` with the App SDK ``MonaiBundleInferenceOperator``'s keywords: a MONAI Bundle on any backend.

The operator is given ``input_mapping`` / ``output_mapping`` (the App SDK's ``IOMapping`` objects: their
labels are the ports, and must be the bundle's ``network_data_format`` names), ``bundle_path`` and
``bundle_config_names`` (the App SDK's ``BundleConfigNames``). ``BundleRun`` holds what that takes:

- where the bundle is: ``bundle_path``, else the app context's model path (``-m``) as the App SDK looks for
  it: a bundle folder or ``.ts`` itself, or a Triton repository whose ``NAME`` folder holds the bundle's
  configs (``repo build`` copies them there); the network then comes from that repository;
- the backend: ``torch`` and ``triton`` load the model from the repository given (``-m``/``model_repository``),
  else from one built from the bundle into a cache keyed by its content; a remote one asks its server for
  model ``NAME`` (``repo build`` made it), the pre- and post-processing always coming from the local bundle;
  with ``mode=volume``, model ``NAME_volume`` (``repo build --whole-volume``), which runs the bundle's sliding
  window on the server with the inferer's settings (``bundle_volume.py``);
- one inference: ``bundles.run_bundle`` with the backend as the inferer's network (``pipeline.Predictor``);
- what each output port emits, an ``Image`` or a plain result (class scores, any dict) in the type its
  ``IOMapping`` declares: ``bundles.outputs`` decides (``port_forms`` checks the ports when the operator is made).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np
from monai.deploy.core import AppContext, Image

from ..backends.base import BaseBackend
from ..backends.registry import backend_class, create_backend
from ..bundles import DEFAULT_CONFIG_NAMES, Bundle, ItemNames, is_bundle, read_bundle, run_bundle
from ..bundles.images import array_to_tensor, image_to_tensor
from ..bundles.inferer import describe as describe_inferer
from ..bundles.outputs import OutputKind, OutputSpec, check_port, emit, output_spec
from ..errors import BundleError, ConfigError, InputDataError
from ..pipeline.predictor import Predictor
from ..preflight import is_remote
from ..repository import layout
from ..repository.bundle import cached_repository, model_name_of
from ..repository.heads import LAYOUT_KEY, check_layout, rebuild
from .bundle_volume import WHOLE_IMAGE, VolumeNetwork, inferer_settings, volume_network
from .report import log_run

logger = logging.getLogger(__name__)

#: The App SDK operator's keywords that make ``InferenceOperator`` a bundle operator.
BUNDLE_KEYWORDS = ("input_mapping", "output_mapping", "bundle_path", "bundle_config_names")


def bundle_keywords(kwargs: dict[str, Any]) -> dict[str, Any]:
    """Take the bundle operator's keywords out of ``kwargs`` (empty: not a bundle operator)."""
    return {key: kwargs.pop(key) for key in BUNDLE_KEYWORDS if key in kwargs}


class BundleRun:
    """A bundle, its ports and its backend: what ``InferenceOperator`` does in bundle mode."""

    def __init__(
        self,
        keywords: Mapping[str, Any],
        *,
        model_name: str,
        app_context: AppContext | None,
        backend_spec: str | None,
        backend_options: Mapping[str, Any],
        models_folder: str | Path | None = None,
    ) -> None:
        """``models_folder`` replaces the app context's ``-m`` as where the bundle is looked for (an ensemble's)."""
        names = keywords.get("bundle_config_names")
        config_names: Sequence[str] = getattr(names, "config_names", None) or DEFAULT_CONFIG_NAMES
        model_path = getattr(app_context, "model_path", None) if app_context is not None else None
        model_path = models_folder or model_path
        path, repository = locate(keywords.get("bundle_path"), model_path, model_name)
        self.bundle: Bundle = read_bundle(path, config_names, ItemNames.of(names))
        # a repository's model is its folder's name (repo build --name may differ from the metadata's)
        self.model_name = model_name or (path.name if repository is not None else model_name_of(self.bundle))
        self.repository = repository
        self.input_ports = _labels(keywords.get("input_mapping"), "input_mapping")
        self.output_ports = _labels(keywords.get("output_mapping"), "output_mapping")
        _check_ports(self.bundle, self.input_ports, self.output_ports)
        self.outputs = port_forms(self.bundle, keywords["output_mapping"])
        self.backend_spec = backend_spec
        self.backend_options = dict(backend_options)
        self._backend: BaseBackend | None = None
        self._volume: VolumeNetwork | None = None
        self._network: Callable[[Any], Any] | None = None

    # -- lifecycle -------------------------------------------------------------------------
    def create_backend(self) -> BaseBackend:
        """The backend for the bundle's network (not yet open); says where the network comes from."""
        spec = self.backend_spec or "torch"
        options = dict(self.backend_options)
        options.pop("model_repository", None)
        if is_remote(spec):
            where = f"model {self.model_name!r} on {spec}"
            backend = create_backend(spec, self.model_name, **options)
            if str(getattr(backend.options, "mode", "window")) == "volume":  # refused before anything connects
                inferer_settings(self.bundle, None)
        else:
            if self.bundle.network.suffix == ".onnx" and backend_class(spec).kind == "torch":
                raise BundleError(
                    "is ONNX (monai-triton convert --to onnx), which the 'torch' backend (TorchScript and .pt2) "
                    "cannot run; pass --backend onnx (ONNX Runtime in this process) or --backend triton",
                    file=str(self.bundle.network),
                )
            repository, name = self.repository, self.model_name
            if repository is None:  # built from the bundle, once per content
                repository, name = cached_repository(self.bundle, self.model_name)
            where = f"model {name!r} in {repository}"
            backend = create_backend(spec, name, model_repository=str(repository), **options)
        logger.info("bundle: configs from %s; network: %s (backend %r)", self.bundle.label, where, spec)
        return backend

    @property
    def backend(self) -> BaseBackend | None:
        return self._backend

    def open(self, backend: BaseBackend) -> None:
        """Open ``backend``; in volume mode (its model ``<name>_volume``) the bundle's inferer must be one the server
        runs (``bundle_volume.py``), else the error names the inferer item."""
        self._backend = backend
        backend.open()
        self._network = backend_network(backend)
        self._volume = volume_network(self.bundle, backend)
        if self._volume is not None:
            logger.info("bundle: mode=volume, the inferer on the server: %s", describe_inferer(self.bundle.inferer))

    def use(self, backend: BaseBackend, network: Callable[[Any], Any]) -> None:
        """Run with ``network`` over ``backend``, both already open: an ensemble's predictor over its members'
        backends, which the ensemble opened (``operators/ensemble.py``)."""
        self._backend, self._network, self._volume = backend, network, None

    def close(self) -> BaseBackend | None:
        backend, self._backend, self._volume, self._network = self._backend, None, None, None
        return backend

    # -- data flow -------------------------------------------------------------------------
    def receive(self, op_input: Any) -> dict[str, Any]:
        return {name: op_input.receive(name) for name in self.bundle.input_names}

    def emit(self, outputs: Mapping[str, Any], op_output: Any) -> None:
        for name, value in outputs.items():
            if name in self.output_ports:
                op_output.emit(value, name)

    def infer(self, inputs: Mapping[str, Any]) -> dict[str, Any]:
        """One inference: ``{input name: Image | array}`` -> ``{output name: Image | array}``."""
        backend = self._backend
        if backend is None:
            raise ConfigError(f"bundle operator for model {self.model_name!r}: the backend opens in start()")
        tensors = {name: self._tensor(name, inputs.get(name)) for name in self.bundle.input_names}
        started = time.perf_counter()
        if self._volume is not None:  # the whole image to the server, which runs the bundle's sliding window
            outputs, meta = run_bundle(self.bundle, tensors, self._volume, WHOLE_IMAGE)
        else:
            outputs, meta = run_bundle(self.bundle, tensors, self._network or Predictor(backend))
        log_run(self.model_name, backend, 1, time.perf_counter() - started)
        return {name: self._output(name, value, meta) for name, value in outputs.items()}

    def _tensor(self, name: str, value: Any) -> Any:
        if isinstance(value, Image):
            return image_to_tensor(value, name)
        if isinstance(value, np.ndarray):
            return array_to_tensor(value, self.bundle.config.inputs[name], name)
        raise InputDataError(
            f"bundle model {self.model_name!r} input {name!r}: expected an App SDK Image or a numpy array, "
            f"got {type(value).__name__}"
        )

    def _output(self, name: str, value: Any, meta: dict[str, Any]) -> Any:
        """An ``Image`` or a plain result, as ``bundles.outputs`` decides for the port's declared type."""
        if name not in self.outputs:  # an output no port takes: handed on as the App SDK hands an array
            return value.detach().cpu().numpy() if hasattr(value, "detach") else np.asarray(value)
        spec, form = self.outputs[name]
        return emit(spec, form, value, meta)


def backend_network(backend: BaseBackend) -> Callable[[Any], Any]:
    """The backend as the bundle's network: one output as a tensor, several rebuilt into the structure the
    network returns (its layout in the model's metadata, ``repository.heads``), whatever the backend."""
    predictor = Predictor(backend)
    signature = backend.signature
    layout = signature.metadata.get(LAYOUT_KEY)
    if layout is None:
        return predictor
    check_layout(layout, signature.output_names)
    return lambda batch: rebuild(layout, predictor.outputs(batch))


def locate(bundle_path: Any, model_path: Any, model_name: str) -> tuple[Path, Path | None]:
    """The bundle to read, and the Triton repository holding its network (``None``: build from the bundle).

    ``bundle_path`` wins; else the app context's model path: a bundle itself, or a folder whose ``NAME``
    folder (or only folder) is a bundle, as the App SDK looks for ``REPO/NAME/metadata.json``: a Triton
    repository ``repo build`` made (its network is then taken from there), or a MAP's models folder
    (``/opt/holoscan/models/NAME/`` holding the bundle folder's files, or its one ``.ts`` file).
    """
    if bundle_path is not None and str(bundle_path).strip():
        return Path(bundle_path).expanduser(), None
    if model_path is None or not str(model_path).strip():
        raise BundleError(
            "no bundle given: pass bundle_path=, or run the app with -m pointing at the bundle (folder or .ts)"
        )
    given = Path(model_path).expanduser()
    if is_bundle(given) and not (given / layout.CONFIG_FILENAME).is_file():
        return given, None
    if (given / layout.CONFIG_FILENAME).is_file() and is_bundle(given):  # one model folder made by repo build
        return given, given.parent
    folders = (
        [p for p in sorted(given.iterdir()) if p.is_dir() and not p.name.startswith(".")] if given.is_dir() else []
    )
    if model_name and folders and not (given / model_name).exists():  # a models folder without this model
        raise BundleError(
            f"model {model_name!r} is not in the models folder {str(given)!r} (models there: "
            f"{', '.join(p.name for p in folders)}); model_name must be a model's folder name"
        )
    candidates = [given / model_name] if model_name else folders
    found = [bundle for bundle in map(_bundle_in, candidates) if bundle is not None]
    if len(found) == 1:
        served = (found[0] / layout.CONFIG_FILENAME).is_file()  # a repository entry: its network is there
        return found[0], given if served else None
    raise BundleError(
        f"the model path {str(given)!r} is neither a bundle nor a Triton repository with "
        f"{'folder ' + repr(model_name) if model_name else 'exactly one model folder'} holding a bundle's configs/ "
        "(monai-triton repo build copies them there); pass bundle_path= or model_name=",
        file=str(given),
    )


def _bundle_in(folder: Path) -> Path | None:
    """``folder`` when it is a bundle, else its one bundle ``.ts`` file (a MAP's ``models/NAME/model.ts``)."""
    if is_bundle(folder):
        return folder
    files = [p for p in folder.iterdir() if p.is_file() and is_bundle(p)] if folder.is_dir() else []
    return files[0] if len(files) == 1 else None


def _labels(mapping: Any, what: str) -> tuple[str, ...]:
    """The labels of the App SDK's ``IOMapping`` objects (or plain strings), in order."""
    if not mapping:
        raise BundleError(f"the bundle operator needs {what} (a list of IOMapping(label, Image, IOType.IN_MEMORY))")
    return tuple(str(getattr(item, "label", item)) for item in mapping)


def port_forms(bundle: Bundle, mapping: Sequence[Any]) -> dict[str, tuple[OutputSpec, str]]:
    """Each output port's spec and form (``bundles.outputs``): its ``IOMapping`` type checked against the metadata.

    A bare label (no ``data_type``) takes an image output as an ``Image`` and any other as the result dict.
    """
    found: dict[str, tuple[OutputSpec, str]] = {}
    label = bundle.config.metadata_file.label
    for entry in mapping:
        name = str(getattr(entry, "label", entry))
        spec = output_spec(name, bundle.config.outputs[name], file=label)
        declared = getattr(entry, "data_type", Image if spec.kind is OutputKind.IMAGE else dict)
        found[name] = (spec, check_port(spec, declared))
    return found


def _check_ports(bundle: Bundle, inputs: Sequence[str], outputs: Sequence[str]) -> None:
    for side, names, labels in (("inputs", bundle.input_names, inputs), ("outputs", bundle.output_names, outputs)):
        missing = [name for name in names if name not in labels] if side == "inputs" else []
        unknown = [label for label in labels if label not in names]
        if missing or unknown:
            raise BundleError(
                f"the operator's {side[:-1]}_mapping labels {list(labels)} must be the network's {side} {names} "
                f"(network_data_format); not in it: {unknown or missing}",
                file=bundle.config.metadata_file.label,
                item=f"network_data_format#{side}",
            )
