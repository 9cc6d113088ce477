"""The bundle's network: as TorchScript for every backend, and as the inferer's network over a backend.

A bundle holds its network as ``models/model.ts`` (TorchScript), or as ``models/model.pt`` weights for
the config's ``network_def``. A backend needs TorchScript, so ``network_def`` + weights are built, loaded
(``strict``: weights that do not fit the network are an error naming both) and scripted, and saved with
the bundle's metadata; the file is the same whatever backend then loads it.

``MetaNetwork`` is what the inferer gets as its network: it calls the backend (any predictor) and gives
the result back as a ``MetaTensor`` carrying the input's metadata, as local TorchScript does. With a plain
tensor, ``Invertd`` in the post-processing would find no applied operations and silently do nothing.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import torch
from monai.data import MetaTensor

from ..errors import BundleError
from .config import BundleConfig

logger = logging.getLogger(__name__)

#: Where a checkpoint dict keeps the weights, in the order the App SDK looks.
CHECKPOINT_KEYS = ("state_dict", "model")


#: What a torch module offers that a network on a server cannot: asked for, they name the inferer item.
MODULE_ONLY = (
    "parameters", "named_parameters", "buffers", "named_buffers", "state_dict", "load_state_dict",
    "register_forward_hook", "register_forward_pre_hook", "register_full_backward_hook", "get_submodule",
)  # fmt: skip


class MetaNetwork(torch.nn.Module):
    """``network(x)`` for a MONAI inferer: ``predict(x)``, every tensor a ``MetaTensor`` with ``x``'s metadata.

    A ``torch.nn.Module`` in eval mode, so a detector can hold it as its ``network`` (a RetinaNet inferer assigns
    it there and reads ``training``). ``predict`` may return a tensor or the network's own structure (a dict of
    heads, RetinaNet's dict of lists per level). What only a local module has (``parameters()``, hooks, weights)
    is a ``BundleError`` naming the bundle's inferer item (``item``, ``file``): the network runs on a backend.
    """

    def __init__(self, predict: Callable[[torch.Tensor], Any], *, item: str = "inferer", file: str | None = None):
        super().__init__()
        self.predict = predict
        self.item, self.file = item, file
        self.eval()

    def __call__(self, x: torch.Tensor, *args: Any, **kwargs: Any) -> Any:
        if args or kwargs:
            raise BundleError(
                "the network got more than one input; a bundle run on a backend feeds one tensor",
                item="network_data_format#inputs",
            )
        return _with_meta(self.predict(x), x)

    def forward(self, x: torch.Tensor) -> Any:
        return self(x)

    def __getattribute__(self, name: str) -> Any:
        if name in MODULE_ONLY:
            raise BundleError(
                f"asks the network for {name}(), which a network on a backend does not have (only network(tensor) "
                "calls reach the server); use an inferer that only calls the network",
                file=object.__getattribute__(self, "file"),
                item=object.__getattribute__(self, "item"),
            )
        return super().__getattribute__(name)


def _with_meta(result: Any, x: torch.Tensor) -> Any:
    """Every tensor of ``result`` as a ``MetaTensor`` with ``x``'s metadata, the structure kept."""
    if isinstance(result, Mapping):
        return {key: _with_meta(value, x) for key, value in result.items()}
    if isinstance(result, tuple | list):
        return type(result)(_with_meta(value, x) for value in result)
    if isinstance(x, MetaTensor) and isinstance(result, torch.Tensor) and not isinstance(result, MetaTensor):
        out = MetaTensor(result, meta=x.meta, applied_operations=x.applied_operations)
        out.is_batch = x.is_batch
        return out
    return result


def network_file(config: BundleConfig) -> tuple[Path, bool]:
    """The bundle's network file and whether it is TorchScript (else weights for ``network_def``)."""
    model = config.source.model_file
    if model is None:
        root = config.source.root
        raise BundleError(
            "has neither models/model.ts nor models/model.pt: the bundle has no network",
            file=str(root / "models") if root else config.source.label,
        )
    return model, _is_torchscript(model)


def scripted_network(config: BundleConfig, weights: Path) -> torch.jit.ScriptModule:
    """``network_def`` built by MONAI, ``weights`` loaded strictly, then ``torch.jit.script``-ed (in eval mode)."""
    network, item = built_network(config, weights)
    try:
        return torch.jit.script(network)
    except Exception as exc:  # TorchScript's frontend raises many kinds
        raise BundleError(
            f"the network cannot be scripted for a backend: {str(exc).splitlines()[0]}",
            file=config.file_of(item),
            item=item,
        ) from exc


def built_network(config: BundleConfig, weights: Path) -> tuple[torch.nn.Module, str]:
    """``network_def`` (or ``network``) built by MONAI with ``weights`` loaded strictly, in eval mode; and its item.

    The Python network itself, for what needs more than TorchScript (``torch.export``, ONNX tracing).
    """
    item = "network_def" if config.has("network_def") else "network" if config.has("network") else ""
    if not item:
        raise BundleError(
            f"has no 'network_def' item, which {weights.name} (weights, not TorchScript) needs to become a network",
            file=config.file_of("network_def"),
            item="network_def",
        )
    network = config.parsed(item)
    if not isinstance(network, torch.nn.Module):
        raise BundleError(
            f"must build a torch.nn.Module, got a {type(network).__name__}", file=config.file_of(item), item=item
        )
    _load_weights(network, weights, config.file_of(item), item)
    return network.eval(), item


def export_torchscript(
    config: BundleConfig,
    target: Path,
    scripted: torch.jit.ScriptModule | None = None,
    metadata: dict[str, Any] | None = None,
) -> Path:
    """Write the bundle's network as TorchScript with its metadata to ``target`` (a copy for ``model.ts``).

    ``scripted``: the network already built from ``network_def`` + weights (``Bundle.scripted``);
    ``metadata``: what the served model is described by, when not the bundle's own (several outputs).
    """
    module = network_module(config, scripted)
    extra = {"metadata.json": json.dumps(config.metadata if metadata is None else metadata).encode()}
    target.parent.mkdir(parents=True, exist_ok=True)
    torch.jit.save(module, str(target), _extra_files=extra)
    logger.info("bundle %s: network written as TorchScript to %s", config.source.label, target)
    return target


def network_module(config: BundleConfig, scripted: torch.jit.ScriptModule | None = None) -> torch.jit.ScriptModule:
    """The bundle's network as a TorchScript module: ``scripted``, else ``models/model.ts`` loaded or
    ``network_def`` + weights scripted."""
    if scripted is not None:
        return scripted
    model, is_script = network_file(config)
    return _load_script(model) if is_script else scripted_network(config, model)


def _load_script(path: Path) -> torch.jit.ScriptModule:
    try:
        module: torch.jit.ScriptModule = torch.jit.load(str(path), map_location="cpu")  # type: ignore[no-untyped-call]
    except Exception as exc:  # a file that is not TorchScript after all
        raise BundleError(f"cannot be loaded as TorchScript: {str(exc).splitlines()[0]}", file=str(path)) from exc
    return module


def _load_weights(network: torch.nn.Module, weights: Path, config_file: str, item: str) -> None:
    try:
        checkpoint = torch.load(str(weights), map_location="cpu", weights_only=True)
    except Exception as exc:  # pickle and zip errors of every kind
        raise BundleError(f"cannot be read as weights: {str(exc).splitlines()[0]}", file=str(weights)) from exc
    state = checkpoint
    if isinstance(checkpoint, dict):
        state = next((checkpoint[k] for k in CHECKPOINT_KEYS if isinstance(checkpoint.get(k), dict)), checkpoint)
    if not isinstance(state, dict):
        raise BundleError(f"holds a {type(state).__name__}, not a state dict", file=str(weights))
    try:
        network.load_state_dict(state, strict=True)
    except RuntimeError as exc:
        detail = " ".join(str(exc).split())[:400]
        raise BundleError(
            f"weights do not fit the network of {config_file} item {item!r}: {detail}", file=str(weights), item=item
        ) from None


def _is_torchscript(path: Path) -> bool:
    """TorchScript archives hold ``<root>/code/`` (or ``constants.pkl``); a state dict does not."""
    import zipfile

    if path.suffix == ".ts":
        return True
    if not zipfile.is_zipfile(path):
        return False
    with zipfile.ZipFile(path) as archive:
        return any("/code/" in n or n.endswith("constants.pkl") for n in archive.namelist())
