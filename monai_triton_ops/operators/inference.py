"""The App SDK operator: one ``InferenceOperator`` whose backend is chosen at run time (public API).

Heavy work happens in ``start()`` (create and open the backend: load TorchScript, connect to a
server), release in ``stop()``; ``compute()`` only moves data through ``compute_impl``, which
calls the Holoscan-free pipeline. The backend spec, the model name and the backend options come
from the app context (command line, environment, ``app.yaml``: ``app_settings``) over the code's.

Pre- and post-processing are MONAI array transforms (the image channel first, with its affine) or
dictionary transforms, as the App SDK's ``MonaiSegInferenceOperator`` takes them (keys
``input_dataset_key`` / ``pred_dataset_key``, ``Invertd`` against the pre-transforms, the image's
metadata): ``pipeline/dictionary.py``. Its keyword arguments (``roi_size``, ``overlap``,
``sw_batch_size``, ``inferer``, ``model_path``) are accepted too, so an App SDK app moves over by
changing the class name; built inside another operator's ``compute()``, as App SDK apps do, the
operator opens its backend for that ``compute_impl`` call and closes it afterwards.

What can be checked without loading the model is checked when the app composes its graph, before
anything runs: the backend exists, and for a local backend the model folder, its version folder,
``config.pbtxt`` and model file. Each image is checked for NaN/Inf voxels before the model sees it.

Pass ``name=`` (a Holoscan operator argument): it names the operator in every log line and error,
where an unnamed one shows up as ``unnamed_operator_1``.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import numpy as np
import torch
from monai.deploy.core import AppContext, Fragment, Image, OperatorSpec
from monai.deploy.operators import InferenceOperator as SdkInferenceOperator

from .. import deployment, interrupts
from ..app_args import allow_non_finite_from
from ..app_settings import backend_keywords, describe, model_name_for
from ..backends.base import BaseBackend
from ..backends.registry import create_backend
from ..bundles import Bundle
from ..deployment import MODEL_NAME_ARG, PREVIEW_ARG
from ..errors import BackendStateError, ConfigError, InputDataError
from ..pipeline.checks import check_finite, image_context
from ..pipeline.dictionary import (
    INPUT_KEY,
    PRED_KEY,
    as_labels,
    has_loader,
    is_dictionary_transform,
    run_dictionary_inference,
)
from ..pipeline.ensemble import EnsemblePredictor
from ..pipeline.image import from_channel_first, to_channel_first
from ..pipeline.run import Transform, run_inference
from ..pipeline.settings import InferenceSettings
from ..preflight import check_model_entry
from .arguments import deployed_options, repository_of, sdk_settings, spec_from
from .bundle import BundleRun, bundle_keywords
from .report import log_run

logger = logging.getLogger(__name__)

#: Creates a (not yet open) backend; the operator opens it in ``start()`` and closes it in ``stop()``.
BackendFactory = Callable[[], BaseBackend]
#: Seconds ``stop()`` (and an interrupt) give requests still in flight.
CLOSE_TIMEOUT_S = 5.0


def settings_overrides_of(
    settings: InferenceSettings | None, settings_overrides: Mapping[str, Any] | None, kwargs: dict[str, Any]
) -> dict[str, Any]:
    """The inferer settings an app overrides: ``settings_overrides`` and the App SDK's keywords, not with ``settings``.

    The App SDK's ``roi_size``/``overlap``/``sw_batch_size``/``inferer``/``mode`` keywords are taken out of ``kwargs``.
    """
    overrides = dict(settings_overrides or {})
    overrides.update(sdk_settings(kwargs))
    if settings is not None and overrides:
        raise ConfigError(
            f"give InferenceOperator either settings or settings_overrides ({sorted(overrides)}), not both"
        )
    return overrides


class InferenceOperator(SdkInferenceOperator):
    """Image in (port ``image``), prediction out (port ``seg_image``) as an App SDK ``Image``.

    The output keeps the input's metadata and voxel order, so the App SDK's DICOM SEG writer and
    NIfTI writers downstream see the same geometry as the input.

    ``model_name`` is the model's folder name in the repository (``-m``); ``--model-name`` /
    ``MONAI_TRITON_MODEL_NAME`` replace it at deploy time. Array ``pre_transforms`` get the image
    channel first, ``(C, W, H, D)`` (the NIfTI ``i, j, k`` order) as a ``MetaTensor`` with its affine;
    array ``post_transforms`` get the model's output for the whole image, ``(C_out, W, H, D)``.
    Dictionary transforms get ``{input_dataset_key: ...}`` as ``MonaiSegInferenceOperator`` gives it
    (``pipeline/dictionary.py``) and leave the result under ``pred_dataset_key``; a label map (integral
    values 0-255) is then handed on as uint8, as that operator does. Non-finite voxels are refused
    unless the app context allows them (``--allow-non-finite``).
    """

    INPUT_PORT = "image"
    OUTPUT_PORT = "seg_image"

    def __init__(
        self,
        fragment: Fragment,
        *args: Any,
        model_name: str = "",
        app_context: AppContext | None = None,
        backend: str | BackendFactory | None = None,
        backend_options: Mapping[str, Any] | None = None,
        settings: InferenceSettings | None = None,
        settings_overrides: Mapping[str, Any] | None = None,
        pre_transforms: Transform | None = None,
        post_transforms: Transform | None = None,
        input_dataset_key: str = INPUT_KEY,
        pred_dataset_key: str = PRED_KEY,
        label_names: Mapping[int, str] | None = None,
        model_path: str | Path | None = None,
        **kwargs: Any,
    ) -> None:
        """``backend`` is a spec string (default: the app context's ``--backend``) or a factory.

        ``backend_options`` go to ``create_backend`` with the spec (``model_repository`` defaults
        to the app's ``-m``, or ``model_path``; ``version``, ``timeout_s``, ``device``...); options set at
        deploy time win over them. Without ``settings``, settings come from the model's metadata at
        ``start()`` (``InferenceSettings.from_metadata``) with ``settings_overrides`` and the App SDK's
        ``roi_size``/``overlap``/``sw_batch_size``/``inferer``/``mode`` keywords applied.
        ``label_names`` name the labels in ``--preview`` (default: ``label N``).

        With the App SDK ``MonaiBundleInferenceOperator``'s keywords (``input_mapping``, ``output_mapping``,
        ``bundle_path``, ``bundle_config_names``) it runs a MONAI Bundle instead (``operators/bundle.py``):
        ports, pre/post-processing and inferer come from the bundle; ``model_name`` may then be left out.
        """
        bundle = bundle_keywords(kwargs)
        overrides = settings_overrides_of(settings, settings_overrides, kwargs)
        args_of = deployment.args_of(app_context)
        self.model_name = model_name_for(model_name, args_of.get(MODEL_NAME_ARG))
        self._factory = backend if callable(backend) else None
        self._choose_backend(None if callable(backend) else backend, app_context, backend_options or {})
        repository = app_context.model_path if app_context is not None and app_context.model_path else model_path
        self._bundle = self._bundle_run(bundle, backend, app_context, backend_options) if bundle else None
        if not bundle:
            self._place_model(repository)
        self._given_settings = settings
        self.settings_overrides = overrides
        self.pre_transforms = pre_transforms
        self.post_transforms = post_transforms
        self.input_dataset_key = input_dataset_key
        self.pred_dataset_key = pred_dataset_key
        self.label_names = dict(label_names or {})
        self.preview = str(args_of.get(PREVIEW_ARG, "false")).lower() == "true"
        self.preview_folder = Path(app_context.output_path) if app_context is not None else None
        self.allow_non_finite = allow_non_finite_from(app_context)
        self._backend: BaseBackend | None = None
        self._settings: InferenceSettings | None = None
        self._interrupt_key: int | None = None
        self._lock = threading.Lock()
        super().__init__(fragment, *args, **kwargs)  # Holoscan calls setup() from here

    def _place_model(self, repository: str | Path | None) -> None:
        """The model's repository from the app's ``-m`` (or ``model_path``), its entry checked before the graph runs."""
        if not self.model_name:
            raise ConfigError("InferenceOperator needs model_name= (the model's folder name in the repository)")
        if repository:
            self.backend_options.setdefault("model_repository", repository_of(repository, self.model_name))
        if self.backend_spec is not None:
            options = self.backend_options
            check_model_entry(
                self.backend_spec, options.get("model_repository"), self.model_name, options.get("version")
            )

    def _bundle_run(
        self,
        bundle: Mapping[str, Any],
        backend: str | BackendFactory | None,
        app_context: AppContext | None,
        backend_options: Mapping[str, Any] | None,
    ) -> BundleRun:
        """The bundle's run; the bundle says where its network is (the app's -m may be the bundle itself).

        A bundle that names its model (no ``model_name=`` given) gets that model's own deploy-time backend.
        """
        run = BundleRun(
            bundle,
            model_name=self.model_name,
            app_context=app_context,
            backend_spec=self.backend_spec,
            backend_options=self.backend_options,
        )
        if run.model_name != self.model_name:
            self.model_name = run.model_name
            self._choose_backend(None if callable(backend) else backend, app_context, backend_options or {})
            run.backend_spec, run.backend_options = self.backend_spec, dict(self.backend_options)
        return run

    def _choose_backend(self, backend: str | None, app_context: AppContext | None, code: Mapping[str, Any]) -> None:
        """This model's backend spec and options: deploy-time (its ``NAME=SPEC``, else the app's) over the code's."""
        deployed = deployed_options(app_context, self.model_name)
        if self._factory is not None:
            self.backend_spec = None
            self.backend_options = {**code, **{k: v.value for k, v in deployed.items()}}
        else:
            self.backend_spec, spec_source = spec_from(backend, app_context, self.model_name)
            self.backend_options = backend_keywords(self.backend_spec, spec_source, deployed, code)
        self._deployed_options = describe(deployed)

    def setup(self, spec: OperatorSpec) -> None:
        for port in self._bundle.input_ports if self._bundle else (self.INPUT_PORT,):
            spec.input(port)
        for port in self._bundle.output_ports if self._bundle else (self.OUTPUT_PORT,):
            spec.output(port)

    # -- lifecycle -------------------------------------------------------------------------
    def start(self) -> None:
        """Create and open the backend: the model loads (or the server connects) once, here."""
        if self._factory is not None:
            backend = self._factory()
        elif self._bundle is not None:
            backend = self._bundle.create_backend()
        else:
            logger.info(
                "model %r: backend %r, options %s (deploy-time: %s)",
                self.model_name,
                self.backend_spec,
                self.backend_options,
                self._deployed_options,
            )
            backend = create_backend(self.backend_spec, self.model_name, **self.backend_options)
        self._interrupt_key = interrupts.register(self._close_now)  # before open: a load can be interrupted too
        self._backend = backend
        try:
            self._open(backend)
        except BaseException:  # a model or bundle that cannot run here leaves no server, connection or region behind
            self.stop()
            raise

    def _open(self, backend: BaseBackend) -> None:
        backend.open()
        if self._bundle is not None:  # the bundle's own inferer: no settings to read
            self._bundle.open(backend)
            return
        self._settings = self._given_settings or InferenceSettings.from_metadata(
            backend.signature.metadata, **self.settings_overrides
        )
        logger.info("model %r: %s", self.model_name, self._settings)

    def stop(self) -> None:
        """Release the backend; safe when ``start()`` never ran or failed."""
        backend, self._backend = self._backend, None
        if self._bundle is not None:
            self._bundle.close()
        if self._interrupt_key is not None:
            interrupts.unregister(self._interrupt_key)
            self._interrupt_key = None
        if backend is not None:
            backend.close(timeout_s=CLOSE_TIMEOUT_S)

    def _close_now(self) -> None:
        """At an interrupt: cut off what is in flight and release the backend (server, shared memory)."""
        backend = self._backend
        if backend is not None:
            backend.close(timeout_s=0.5)

    @property
    def settings(self) -> InferenceSettings:
        """The settings in use: given, or read from the model's metadata at ``start()``."""
        if self._settings is None:
            if self._given_settings is None:
                raise BackendStateError(f"operator for model {self.model_name!r}: settings are read in start()")
            return self._given_settings
        return self._settings

    @property
    def bundle(self) -> Bundle | None:
        """The MONAI Bundle this operator runs (read when it was made), or ``None`` outside bundle mode."""
        return self._bundle.bundle if self._bundle is not None else None

    @property
    def backend(self) -> BaseBackend:
        if self._backend is None:
            raise BackendStateError(f"operator for model {self.model_name!r}: the backend opens in start()")
        return self._backend

    @property
    def dictionary_mode(self) -> bool:
        """Whether the transforms are dictionary transforms (``MonaiSegInferenceOperator``'s way)."""
        return is_dictionary_transform(self.pre_transforms) or is_dictionary_transform(self.post_transforms)

    # -- data flow -------------------------------------------------------------------------
    def compute(self, op_input: Any, op_output: Any, context: Any) -> None:
        if self._bundle is not None:
            with self._lock:
                self._bundle.emit(self._bundle.infer(self._bundle.receive(op_input)), op_output)
            return
        image = op_input.receive(self.INPUT_PORT)
        if image is None:
            raise InputDataError(f"operator for model {self.model_name!r} received no image")
        with self._lock:  # one image at a time per operator, as the App SDK operators do
            op_output.emit(self.compute_impl(image), self.OUTPUT_PORT)

    def compute_impl(self, image: Image, context: Any = None) -> Image:
        """Infer one App SDK ``Image``; the testable core of ``compute``.

        Outside a running graph (built inside another operator's ``compute``, as App SDK apps do with
        ``MonaiSegInferenceOperator``) the backend is opened for this call and closed after it.
        """
        if self._backend is not None:
            return self._infer_image(image)
        self.start()
        try:
            return self._infer_image(image)
        finally:
            self.stop()

    def _infer_image(self, image: Image) -> Image:
        metadata = dict(image.metadata() or {})
        started = time.perf_counter()
        if self.dictionary_mode:
            result = self._infer_dictionary(image, metadata)
        else:
            result = self.post_process(self.predict(self.pre_process(image)))
        log_run(self.model_name, self.backend, 1, time.perf_counter() - started)
        if self.preview and self.preview_folder is not None:
            self._write_preview(image, result, self.preview_folder / "preview.png")
        return Image(result, metadata=metadata)

    def _write_preview(self, image: Image, result: np.ndarray, path: Path) -> None:
        """``--preview``: a picture is not worth failing a finished inference for, so a problem is a warning."""
        from ..preview import write_preview

        try:
            write_preview(image, result, path, label_names=self.label_names)
        except (ValueError, OSError) as exc:
            logger.warning("model %r: no preview written: %s", self.model_name, exc)

    def _infer_dictionary(self, image: Image, metadata: Mapping[str, Any]) -> np.ndarray:
        """``MonaiSegInferenceOperator``'s data flow over this operator's backend."""
        from monai.deploy.operators.monai_seg_inference_operator import InMemImageReader
        from monai.transforms import LoadImage

        name = str(metadata.get("SeriesInstanceUID", "Img_in_context"))
        if has_loader(self.pre_transforms):  # the chain reads the image itself (a reader bound to it)
            source: Any = name
        else:
            source = LoadImage(reader=InMemImageReader(image), image_only=True)(name)
            check_finite(source, model=self.model_name, allow=self.allow_non_finite)
        with image_context(image.asnumpy(), self.settings, model=self.model_name):
            result = run_dictionary_inference(
                {self.input_dataset_key: source},
                self.backend,
                self.settings,
                pre_transforms=self.pre_transforms,
                post_transforms=self.post_transforms,
                input_key=self.input_dataset_key,
                pred_key=self.pred_dataset_key,
                predictor=self._predictor(),
            )
        return as_labels(from_channel_first(result))

    def pre_process(self, data: Any, *args: Any, **kwargs: Any) -> torch.Tensor:
        """App SDK ``Image`` -> channel-first MetaTensor in MONAI's voxel order, with its affine."""
        signature = self.backend.signature
        spatial_rank = len(signature.inputs[0].full_shape(signature.max_batch_size)) - 2
        array = data.asnumpy() if isinstance(data, Image) else data
        metadata = data.metadata() if isinstance(data, Image) else {}
        tensor = to_channel_first(array, metadata or {}, spatial_rank=spatial_rank, model=self.model_name)
        check_finite(tensor, model=self.model_name, allow=self.allow_non_finite)
        return tensor

    def predict(self, data: Any, *args: Any, **kwargs: Any) -> torch.Tensor:
        """Transforms, inferer and backend, through the shared pipeline."""
        with image_context(data, self.settings, model=self.model_name):  # errors name the image, not a patch
            return run_inference(
                data,
                self.backend,
                self.settings,
                pre_transforms=self.pre_transforms,
                post_transforms=self.post_transforms,
                predictor=self._predictor(),
            )

    def _predictor(self) -> EnsemblePredictor | None:
        """The predictor under the inferer: ``None``, the backend's own; an ensemble's in ``operators/ensemble.py``."""
        return None

    def post_process(self, data: Any, *args: Any, **kwargs: Any) -> Any:
        """Back to the input's voxel order (``(D, H, W)``), as numpy for the App SDK writers."""
        return from_channel_first(data)
