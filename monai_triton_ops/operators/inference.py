"""The App SDK operator: one ``InferenceOperator`` whose backend is chosen at run time.

Heavy work happens in ``start()`` (create and open the backend: load TorchScript, connect to a
server), release in ``stop()``; ``compute()`` only moves data through ``compute_impl``, which
calls the Holoscan-free pipeline. The backend spec comes from the app context (``--backend``,
``MONAI_TRITON_BACKEND``) unless the app passes one explicitly.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Mapping
from typing import Any

import torch
from monai.deploy.core import AppContext, Fragment, Image, OperatorSpec
from monai.deploy.operators import InferenceOperator as SdkInferenceOperator

from ..app_args import BACKEND_ARG, resolve_backend
from ..backends.base import BaseBackend
from ..backends.registry import create_backend
from ..errors import BackendStateError, ConfigError, InputDataError
from ..pipeline.image import from_channel_first, to_channel_first
from ..pipeline.run import InferenceSettings, Transform, run_inference

logger = logging.getLogger(__name__)

#: Creates a (not yet open) backend; the operator opens it in ``start()`` and closes it in ``stop()``.
BackendFactory = Callable[[], BaseBackend]


class InferenceOperator(SdkInferenceOperator):
    """Image in (port ``image``), prediction out (port ``seg_image``) as an App SDK ``Image``.

    The output keeps the input's metadata and voxel order, so the App SDK's DICOM SEG writer and
    NIfTI writers downstream see the same geometry as the input.
    """

    INPUT_PORT = "image"
    OUTPUT_PORT = "seg_image"

    def __init__(
        self,
        fragment: Fragment,
        *args: Any,
        model_name: str,
        app_context: AppContext | None = None,
        backend: str | BackendFactory | None = None,
        backend_options: Mapping[str, Any] | None = None,
        settings: InferenceSettings | None = None,
        settings_overrides: Mapping[str, Any] | None = None,
        pre_transforms: Transform | None = None,
        post_transforms: Transform | None = None,
        **kwargs: Any,
    ) -> None:
        """``backend`` is a spec string (default: the app context's ``--backend``) or a factory.

        ``backend_options`` go to ``create_backend`` with the spec (``model_repository`` defaults
        to the app's ``-m``; ``version``, ``timeout_s``, ``device``...). Without ``settings``, they
        come from the model's metadata at ``start()`` (``InferenceSettings.from_metadata``) with
        ``settings_overrides`` applied.
        """
        self.model_name = model_name
        self._factory = backend if callable(backend) else None
        self.backend_spec = None if callable(backend) else _spec_from(backend, app_context)
        self.backend_options = dict(backend_options or {})
        if app_context is not None and app_context.model_path:
            self.backend_options.setdefault("model_repository", app_context.model_path)
        if settings is not None and settings_overrides:
            raise ConfigError("give InferenceOperator either settings or settings_overrides, not both")
        self._given_settings = settings
        self.settings_overrides = dict(settings_overrides or {})
        self.pre_transforms = pre_transforms
        self.post_transforms = post_transforms
        self._backend: BaseBackend | None = None
        self._settings: InferenceSettings | None = None
        self._lock = threading.Lock()
        super().__init__(fragment, *args, **kwargs)  # Holoscan calls setup() from here

    def setup(self, spec: OperatorSpec) -> None:
        spec.input(self.INPUT_PORT)
        spec.output(self.OUTPUT_PORT)

    # -- lifecycle -------------------------------------------------------------------------
    def start(self) -> None:
        """Create and open the backend: the model loads (or the server connects) once, here."""
        if self._factory is not None:
            backend = self._factory()
        else:
            logger.info("model %r: backend %r, options %s", self.model_name, self.backend_spec, self.backend_options)
            backend = create_backend(self.backend_spec, self.model_name, **self.backend_options)
        self._backend = backend.open()
        self._settings = self._given_settings or InferenceSettings.from_metadata(
            backend.signature.metadata, **self.settings_overrides
        )
        logger.info("model %r: %s", self.model_name, self._settings)

    def stop(self) -> None:
        """Release the backend; safe when ``start()`` never ran or failed."""
        backend, self._backend = self._backend, None
        if backend is not None:
            backend.close()

    @property
    def settings(self) -> InferenceSettings:
        """The settings in use: given, or read from the model's metadata at ``start()``."""
        if self._settings is None:
            if self._given_settings is None:
                raise BackendStateError(f"operator for model {self.model_name!r}: settings are read in start()")
            return self._given_settings
        return self._settings

    @property
    def backend(self) -> BaseBackend:
        if self._backend is None:
            raise BackendStateError(f"operator for model {self.model_name!r}: the backend opens in start()")
        return self._backend

    # -- data flow -------------------------------------------------------------------------
    def compute(self, op_input: Any, op_output: Any, context: Any) -> None:
        image = op_input.receive(self.INPUT_PORT)
        if image is None:
            raise InputDataError(f"operator for model {self.model_name!r} received no image")
        with self._lock:  # one image at a time per operator, as the App SDK operators do
            op_output.emit(self.compute_impl(image), self.OUTPUT_PORT)

    def compute_impl(self, image: Image) -> Image:
        """Infer one App SDK ``Image``; the testable core of ``compute``."""
        metadata = dict(image.metadata() or {})
        tensor = self.pre_process(image)
        result = self.predict(tensor)
        return Image(self.post_process(result), metadata=metadata)

    def pre_process(self, data: Any, *args: Any, **kwargs: Any) -> torch.Tensor:
        """App SDK ``Image`` -> channel-first MetaTensor in MONAI's voxel order, with its affine."""
        signature = self.backend.signature
        spatial_rank = len(signature.inputs[0].full_shape(signature.max_batch_size)) - 2
        array = data.asnumpy() if isinstance(data, Image) else data
        metadata = data.metadata() if isinstance(data, Image) else {}
        return to_channel_first(array, metadata or {}, spatial_rank=spatial_rank, model=self.model_name)

    def predict(self, data: Any, *args: Any, **kwargs: Any) -> torch.Tensor:
        """Transforms, inferer and backend, through the shared pipeline."""
        return run_inference(
            data,
            self.backend,
            self.settings,
            pre_transforms=self.pre_transforms,
            post_transforms=self.post_transforms,
        )

    def post_process(self, data: Any, *args: Any, **kwargs: Any) -> Any:
        """Back to the input's voxel order (``(D, H, W)``), as numpy for the App SDK writers."""
        return from_channel_first(data)


def _spec_from(backend: str | None, app_context: AppContext | None) -> str:
    """Explicit argument, else the spec resolved from the app's command line / environment."""
    if backend:
        return resolve_backend(backend)
    if app_context is not None and app_context.args.get(BACKEND_ARG):
        return str(app_context.args[BACKEND_ARG])
    return resolve_backend(None)
