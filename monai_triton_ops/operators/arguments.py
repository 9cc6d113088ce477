"""Where ``InferenceOperator``'s backend and settings come from: the app context and the App SDK's keywords.

The backend spec is the deploy-time choice (command line, environment, ``app.yaml``) over the code's, and an
App SDK app context's ``-t`` / ``TRITON_SERVER_NETLOC`` means ``http://HOST:PORT`` as there;
``MonaiSegInferenceOperator``'s inference keywords become settings; ``-m`` / ``model_path`` is the repository.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from monai.deploy.core import AppContext

from ..app_args import resolve_backend
from ..app_settings import Setting, load_settings
from ..deployment import (
    BACKEND_ARG,
    BACKEND_MAP_ARG,
    BACKEND_OPTIONS_ARG,
    BACKEND_SOURCE_ARG,
    MODEL_OPTIONS_ARG,
    args_of,
    load_model_options,
)
from ..errors import ConfigError

#: ``MonaiSegInferenceOperator`` keywords that are inference settings here.
SDK_SETTINGS = ("roi_size", "overlap", "sw_batch_size", "inferer", "mode")


def sdk_settings(kwargs: dict[str, Any]) -> dict[str, Any]:
    """Take ``MonaiSegInferenceOperator``'s inference keywords out of ``kwargs``, as settings."""
    taken = {key: kwargs.pop(key) for key in SDK_SETTINGS if key in kwargs}
    if "inferer" in taken:
        taken["inferer"] = str(getattr(taken["inferer"], "value", taken["inferer"])).strip().lower()
    if "roi_size" in taken and taken["roi_size"] is not None:
        roi = taken["roi_size"]
        taken["roi_size"] = tuple(int(s) for s in (roi if isinstance(roi, list | tuple) else (roi,)))
    if isinstance(taken.get("overlap"), list | tuple):
        raise ConfigError(f"overlap per axis {list(taken['overlap'])} is not supported; give one fraction")
    return taken


def repository_of(path: str | Path, model_name: str) -> str:
    """The model repository for ``-m`` / ``model_path``: the folder, or the folder above a model folder given."""
    folder = Path(path)
    if folder.is_file():
        raise ConfigError(
            f"model {model_name!r}: model_path {str(folder)!r} is a file; give the model repository folder "
            f"(<repository>/{model_name}/config.pbtxt)"
        )
    return str(folder)


def spec_from(backend: str | None, app_context: AppContext | None, model_name: str = "") -> tuple[str, str]:
    """The deploy-time choice for ``model_name`` (its own ``NAME=SPEC``, else the app-wide one: command line,
    environment, ``app.yaml``), else the code's, else the default; with its source (``app_settings.SOURCES``), by
    which the options in its query string rank.

    An app context made by the App SDK's own ``init_app_context`` carries none of ours: they come from the
    environment and ``app.yaml`` (``deployment.args_of``), and its ``-t`` means ``http://HOST:PORT``, as there.
    """
    args = args_of(app_context)
    own = load_settings(args.get(BACKEND_MAP_ARG)).get(model_name) if model_name else None
    if own is not None:
        return own.value, own.source
    source = str(args.get(BACKEND_SOURCE_ARG, "command line"))
    deployed = args.get(BACKEND_ARG) if source != "code" else None
    if deployed:
        return str(deployed), source
    if backend:
        return resolve_backend(backend), "code"
    if args.get(BACKEND_ARG):
        return str(args[BACKEND_ARG]), "code"
    return resolve_backend(None), "code"


def deployed_options(app_context: AppContext | None, model_name: str) -> dict[str, Setting]:
    """The deploy-time backend options of ``model_name``: those of its own backend, else the app-wide backend's."""
    args = args_of(app_context)
    own = load_model_options(args.get(MODEL_OPTIONS_ARG), model_name) if model_name else None
    return own if own is not None else load_settings(args.get(BACKEND_OPTIONS_ARG))
