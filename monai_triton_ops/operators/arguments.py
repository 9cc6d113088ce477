"""Where ``InferenceOperator``'s backend and settings come from: the app context and the App SDK's keywords.

The backend spec is the deploy-time choice (command line, environment, ``app.yaml``) over the code's, and an
App SDK app context's ``-t`` / ``TRITON_SERVER_NETLOC`` means ``http://HOST:PORT`` as there;
``MonaiSegInferenceOperator``'s inference keywords become settings; ``-m`` / ``model_path`` is the repository.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from monai.deploy.core import AppContext

from ..app_args import BACKEND_ARG, BACKEND_SOURCE_ARG, resolve_backend
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


def spec_from(backend: str | None, app_context: AppContext | None) -> tuple[str, str]:
    """The deploy-time choice (command line, environment, app.yaml), else the code's, else the default;
    with its source (``app_settings.SOURCES``), by which the options in its query string rank.

    An app context made by the App SDK's own ``init_app_context`` has no ``backend``: its ``-t`` /
    ``TRITON_SERVER_NETLOC`` (``triton_server_netloc``) means ``http://HOST:PORT``, as there.
    """
    args = dict(app_context.args) if app_context is not None else {}
    source = str(args.get(BACKEND_SOURCE_ARG, "command line"))
    deployed = args.get(BACKEND_ARG) if source != "code" else None
    if deployed:
        return str(deployed), source
    if backend:
        return resolve_backend(backend), "code"
    if args.get(BACKEND_ARG):
        return str(args[BACKEND_ARG]), "code"
    netloc = getattr(app_context, "triton_server_netloc", "") if app_context is not None else ""
    return resolve_backend(None, netloc=netloc or None), "command line" if netloc else "code"
