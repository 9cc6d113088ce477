"""In-process ONNX Runtime: ``model.onnx`` run in the app's process, no server needed.

Reads the same Triton repository layout as every backend (``<repo>/<name>/<version>/model.onnx``, the file
a ``config.pbtxt`` names when there is one) and takes its signature from ``config.pbtxt`` when present, else
from the graph itself (names, dtypes, dims; MONAI metadata from ``metadata_props``). A ``config.pbtxt`` that
contradicts the graph (dtype, rank, a fixed dim) is refused at open, naming model, tensor and both values.

Options map onto ONNX Runtime's session: ``intra_op_threads`` / ``inter_op_threads`` (0: ONNX Runtime's
default), ``graph_optimization`` (``disable``, ``basic``, ``extended``, ``layout``, ``all``),
``providers`` (in order of preference, the CPU provider last, added when left out), ``cache_dir`` for
providers that build engines (TensorRT, OpenVINO) and ``spin`` (ONNX Runtime's thread pools busy-wait between
steps; off by default, since a spinning pool takes the cores that the app's other threads, and a second request
in flight, need). ``rewrite_graph`` (on by default) hands ONNX Runtime the graph after the exact rewrites of
``repository/onnx_rewrite.py`` (PReLU with one slope as ``LeakyRelu``, which it fuses into the convolution; with
``norm_in_float64``, also on by default, each ``InstanceNormalization`` taking its statistics in float64 as
torch does: torch's labels, for 10-18% of an instance-norm UNet's time; ``norm_in_float64=false`` turns it
off), made on an in-memory copy: the file is not changed. ``InferenceSession.run`` is thread-safe, so requests
run side by side on the base's worker pool; a request past its deadline or cut off at close is stopped through
its ``RunOptions.terminate``.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal, cast

from ..errors import BackendStateError, ConfigError, DeviceUnavailableError, InferenceError, ModelLoadError
from ..repository import layout
from ..repository.onnx_model import DEFAULT_ONNX_FILENAME, OnnxModel, graph_conflicts, is_onnx_file, read_onnx
from ..repository.onnx_rewrite import rewritten_bytes
from ..repository.signatures import local_entry
from ..signature import ModelSignature
from .arrays import ArrayLike, as_numpy
from .base import Availability, BaseBackend, InferRequest
from .options import BackendOptions

if TYPE_CHECKING:
    import onnxruntime

logger = logging.getLogger(__name__)

CPU_PROVIDER = "CPUExecutionProvider"
GraphOptimization = Literal["disable", "basic", "extended", "layout", "all"]
#: Providers that build engines and the provider options that point their cache at ``cache_dir``.
_CACHE_OPTIONS = {
    "TensorrtExecutionProvider": lambda d: {"trt_engine_cache_enable": "True", "trt_engine_cache_path": d},
    "OpenVINOExecutionProvider": lambda d: {"cache_dir": d},
    "MIGraphXExecutionProvider": lambda d: {"migraphx_model_cache_dir": d},
}


@dataclass(frozen=True, kw_only=True)
class OnnxOptions(BackendOptions):
    """ONNX Runtime session settings (see the module docstring)."""

    intra_op_threads: int = 0
    inter_op_threads: int = 0
    graph_optimization: GraphOptimization = "all"
    providers: tuple[str, ...] = (CPU_PROVIDER,)
    cache_dir: Path | None = None
    spin: bool = False
    rewrite_graph: bool = True
    norm_in_float64: bool = True

    def __post_init__(self) -> None:
        super().__post_init__()
        for option in ("intra_op_threads", "inter_op_threads"):
            value = getattr(self, option)
            if isinstance(value, bool) or not isinstance(value, int) or value < 0:
                raise ConfigError(f"option {option} must be an integer >= 0 (0: ONNX Runtime's default), got {value!r}")
        providers = tuple(self.providers)
        if CPU_PROVIDER in providers[:-1]:
            raise ConfigError(f"option providers: {CPU_PROVIDER} must come last (the fallback), got {list(providers)}")
        if CPU_PROVIDER not in providers:
            providers = (*providers, CPU_PROVIDER)
        object.__setattr__(self, "providers", providers)


class OnnxBackend(BaseBackend):
    """Runs ``model.onnx`` with an ONNX Runtime ``InferenceSession`` on the base's worker pool."""

    kind = "onnx"
    options_type = OnnxOptions

    @classmethod
    def availability(cls, scheme: str) -> Availability:
        """Runs wherever onnxruntime imports; names the execution providers this build offers."""
        import onnxruntime

        return Availability(True, f"ONNX Runtime {onnxruntime.__version__} in the app's process; providers "
                            + ", ".join(onnxruntime.get_available_providers()))  # fmt: skip

    def describe(self) -> str:
        providers = cast(OnnxOptions, self.options).providers
        return (
            f"onnx (ONNX Runtime in this process, {', '.join(p.removesuffix('ExecutionProvider') for p in providers)})"
        )

    def __init__(self, model_name: str, **kwargs: Any) -> None:
        super().__init__(model_name, **kwargs)
        if self.model_repository is None:
            raise ConfigError("the 'onnx' backend needs a local model repository folder (model_repository=...)")
        if self.urls:
            raise ConfigError(f"the 'onnx' backend takes no server URL, got {list(self.urls)}")
        self._repository: Path = self.model_repository
        self._session: onnxruntime.InferenceSession | None = None
        self._runs: dict[int, Any] = {}  # id(request) -> its RunOptions, to terminate it
        self._runs_lock = threading.Lock()

    def _open(self) -> ModelSignature:
        version, version_dir = layout.resolve_version(self._repository, self.model_name, self.version)
        entry = local_entry(self._repository, self.model_name)
        path = layout.model_file(version_dir, self.model_name, onnx_filename(entry.config, self.model_name))
        model = read_onnx(path, self.model_name)
        if entry.config is not None:
            signature = entry.signature(version, path=path)
            check_against_graph(signature, model)
        else:
            signature = model.signature(self.model_name, version=version)
        self._session = make_session(path, self.model_name, model, cast(OnnxOptions, self.options))
        logger.info("loaded ONNX %s (opset %d) with %s", path, model.opset, self._session.get_providers())
        return signature

    def _infer(self, request: InferRequest) -> Mapping[str, ArrayLike]:
        session = self._session
        if session is None:  # close() cut this request off and released the session before it started
            raise BackendStateError(f"{self!r}: the model was released by close()")
        import onnxruntime

        run_options = onnxruntime.RunOptions()
        with self._runs_lock:
            self._runs[id(request)] = run_options
        if request.cancelled.is_set():
            run_options.terminate = True
        try:
            feeds = {name: as_numpy(value) for name, value in request.inputs.items()}
            results = session.run(list(request.outputs), feeds, run_options)
        except Exception as exc:  # onnxruntime raises its own Fail/InvalidArgument/RuntimeException types
            if request.cancelled.is_set():
                raise InferenceError(f"model {self.model_name!r}: the run was stopped ({exc})") from exc
            raise InferenceError(f"model {self.model_name!r} failed in ONNX Runtime: {_last_line(exc)}") from exc
        finally:
            with self._runs_lock:
                self._runs.pop(id(request), None)
        return dict(zip(request.outputs, results, strict=True))

    def _cancel(self, request: InferRequest) -> None:
        with self._runs_lock:
            run_options = self._runs.get(id(request))
        if run_options is not None:
            run_options.terminate = True

    def _close(self) -> None:
        with self._runs_lock:
            for run_options in self._runs.values():
                run_options.terminate = True
        self._session = None


def onnx_filename(config: Any, name: str) -> str:
    """The ONNX file of a model folder: the one its ``config.pbtxt`` names, else ``model.onnx``.

    A configuration that names a file that is not ONNX (a TorchScript entry) is refused with the way out.
    """
    if config is None:
        return DEFAULT_ONNX_FILENAME
    from ..repository.config import torchscript_filename

    filename = torchscript_filename(config)
    if filename == layout.DEFAULT_MODEL_FILENAME and not config.default_model_filename and config.backend != "python":
        return DEFAULT_ONNX_FILENAME  # Triton's onnxruntime backend's own default
    if not is_onnx_file(filename):
        raise ConfigError(
            f"model {name!r}: config.pbtxt serves {filename!r}, not an ONNX file; run it on the 'torch' backend, "
            "or build an ONNX entry: monai-triton repo build model.onnx"
        )
    return filename


def check_against_graph(signature: ModelSignature, model: OnnxModel) -> None:
    """Refuse a ``config.pbtxt`` whose tensors the graph does not have or cannot take."""
    problems = graph_conflicts(signature, model)
    if problems:
        raise ConfigError("; ".join(problems))


def make_session(path: Path, name: str, model: OnnxModel, options: OnnxOptions) -> onnxruntime.InferenceSession:
    """An ``InferenceSession`` for ``path`` as ``options`` say; what ONNX Runtime refuses is a clear error."""
    import onnxruntime

    available = onnxruntime.get_available_providers()
    missing = [p for p in options.providers if p not in available]
    if missing:
        raise DeviceUnavailableError(
            f"model {name!r}: execution provider(s) {missing} are not in this ONNX Runtime build "
            f"(available: {available})"
        )
    session_options = session_settings(options)
    providers: list[Any] = [_provider(p, options.cache_dir) for p in options.providers]
    try:
        rewritten = rewritten_bytes(path, norm_in_float64=options.norm_in_float64) if options.rewrite_graph else None
        graph = rewritten or str(path)
        return onnxruntime.InferenceSession(graph, sess_options=session_options, providers=providers)
    except Exception as exc:  # onnxruntime's Fail / InvalidGraph / NotImplemented: not Python's own types
        text = _last_line(exc)
        if "opset" in str(exc).lower():
            raise ModelLoadError(
                f"model {name!r}: {str(path)!r} uses ONNX opset {model.opset}, which ONNX Runtime "
                f"{onnxruntime.__version__} does not support ({text}); export it with an older opset "
                "(torch.onnx.export(..., opset_version=17))"
            ) from exc
        raise ModelLoadError(f"model {name!r}: ONNX Runtime cannot load {str(path)!r}: {text}") from exc


def session_settings(options: OnnxOptions) -> onnxruntime.SessionOptions:
    """``SessionOptions`` from the backend's options (threads, graph optimisation level)."""
    import onnxruntime

    levels = {
        "disable": onnxruntime.GraphOptimizationLevel.ORT_DISABLE_ALL,
        "basic": onnxruntime.GraphOptimizationLevel.ORT_ENABLE_BASIC,
        "extended": onnxruntime.GraphOptimizationLevel.ORT_ENABLE_EXTENDED,
        "layout": onnxruntime.GraphOptimizationLevel.ORT_ENABLE_LAYOUT,
        "all": onnxruntime.GraphOptimizationLevel.ORT_ENABLE_ALL,
    }
    settings = onnxruntime.SessionOptions()
    settings.graph_optimization_level = levels[options.graph_optimization]
    settings.intra_op_num_threads = options.intra_op_threads
    settings.inter_op_num_threads = options.inter_op_threads
    if not options.spin:  # idle pool threads sleep instead of spinning: the app's other threads get the cores
        settings.add_session_config_entry("session.intra_op.allow_spinning", "0")
        settings.add_session_config_entry("session.inter_op.allow_spinning", "0")
    settings.log_severity_level = 4  # fatal only: what fails reaches the caller as an exception (a stopped run too)
    return settings


def _provider(provider: str, cache_dir: Path | None) -> Any:
    if cache_dir is None or provider not in _CACHE_OPTIONS:
        return provider
    cache_dir.mkdir(parents=True, exist_ok=True)
    return (provider, _CACHE_OPTIONS[provider](str(cache_dir)))


def _last_line(exc: BaseException) -> str:
    lines = [line.strip() for line in str(exc).splitlines() if line.strip()]
    return lines[-1] if lines else type(exc).__name__
