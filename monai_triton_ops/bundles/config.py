"""A bundle's configs parsed with ``monai.bundle.ConfigParser``, as MONAI and the App SDK parse them.

Several config names are merged in order (a later file's items replace an earlier one's, ``+item``
extends it: MONAI's own ``merge_kv``), JSON and YAML alike; ``metadata.json`` becomes ``_meta_``;
``bundle_root`` is the bundle folder, and that folder is put on ``sys.path`` so a config can name the
bundle's own code (``scripts.transforms.MyTransformd``), as the App SDK does. Every failure names the file
the item came from and the item: a user sees which line of which config to fix.
"""

from __future__ import annotations

import re
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from monai.bundle import ConfigParser
from monai.bundle.utils import merge_kv

from ..errors import BundleError
from .source import DEFAULT_CONFIG_NAMES as DEFAULT_CONFIG_NAMES
from .source import BundleFile, BundleSource

#: The App SDK's defaults (``BundleConfigNames``).


@dataclass(frozen=True)
class ItemNames:
    """The config item ids the operator reads (the App SDK's ``BundleConfigNames`` fields)."""

    preprocessing: str = "preprocessing"
    postprocessing: str = "postprocessing"
    inferer: str = "inferer"

    @classmethod
    def of(cls, names: Any) -> ItemNames:
        """From an App SDK ``BundleConfigNames`` (or ``None``: the defaults)."""
        if names is None:
            return cls()
        return cls(
            preprocessing=str(getattr(names, "preproc_name", cls.preprocessing)),
            postprocessing=str(getattr(names, "postproc_name", cls.postprocessing)),
            inferer=str(getattr(names, "inferer_name", cls.inferer)),
        )


class BundleConfig:
    """The parsed configs of one bundle; ``parsed(item)`` builds an item as MONAI builds it."""

    def __init__(self, source: BundleSource, config_names: Sequence[str] = DEFAULT_CONFIG_NAMES) -> None:
        names = [config_names] if isinstance(config_names, str) else list(config_names)
        if not names:
            raise BundleError("bundle_config_names lists no config names; give at least one, e.g. 'inference'")
        self.source = source
        self.config_names = tuple(names)
        self.metadata_file = source.metadata_file()
        self.metadata = self.metadata_file.load()
        self._origin: dict[str, str] = {}
        self._files: list[str] = []
        merged = ConfigParser(config={})
        for name in names:
            config = source.config_file(name)
            self._files.append(config.label)
            for key, value in config.load().items():
                try:
                    merge_kv(merged, key, value)
                except ValueError as exc:
                    raise BundleError(
                        f"cannot merge into earlier configs: {exc}", file=config.label, item=key
                    ) from None
                self._origin[key.lstrip("+")] = config.label
        content = merged.get()
        if source.root is not None:
            content["bundle_root"] = str(source.root)
            _importable(str(source.root))
        self.parser = ConfigParser(content)
        self.parser.read_meta(self.metadata)
        self._check_data_format()

    def file_of(self, item: str) -> str:
        """The config file an item (``a#b`` ids too) came from; for a missing one the last file read (to add it to)."""
        return self._origin.get(item.split("#", 1)[0], self._files[-1])

    def has(self, item: str) -> bool:
        return self.parser.get(item) is not None

    def parsed(self, item: str) -> Any:
        """Item ``item`` instantiated by MONAI; any failure becomes a ``BundleError`` naming file and item."""
        try:
            return self.parser.get_parsed_content(item)
        except BundleError:
            raise
        except Exception as exc:  # MONAI raises anything a config's code raises
            cause = _cause(exc)
            script = self._script_of(cause)
            if script is not None:  # the bundle's own code does not import: name its file
                raise BundleError(
                    f"cannot be imported (needed by {self.file_of(item)}): {cause.split(' - ', 1)[-1]}",
                    file=script,
                    item=item,
                ) from exc
            raise BundleError(cause, file=self.file_of(item), item=item) from exc

    def _script_of(self, cause: str) -> str | None:
        """The bundle's ``scripts/`` file a MONAI "problem in scripts.x" message is about, if it is one."""
        found = re.search(r"problem in (scripts(?:\.\w+)*)", cause)
        root = self.source.root
        if found is None or root is None:
            return None
        module = Path(root, *found.group(1).split("."))
        candidates = (module.with_suffix(".py"), module / "__init__.py")
        return str(next((c for c in candidates if c.is_file()), module))

    @property
    def inputs(self) -> dict[str, dict[str, Any]]:
        return dict(self.metadata["network_data_format"]["inputs"])

    @property
    def outputs(self) -> dict[str, dict[str, Any]]:
        return dict(self.metadata["network_data_format"]["outputs"])

    @property
    def name(self) -> str | None:
        """The bundle's name in its metadata (``name``), if any."""
        value = self.metadata.get("name")
        return str(value) if value else None

    def _check_data_format(self) -> None:
        label = self.metadata_file.label
        data_format = self.metadata.get("network_data_format")
        if not isinstance(data_format, dict):
            raise BundleError(
                "has no network_data_format object (its inputs and outputs: name, num_channels, spatial_shape, dtype)",
                file=label,
                item="network_data_format",
            )
        for side in ("inputs", "outputs"):
            tensors = data_format.get(side)
            if not isinstance(tensors, dict) or not tensors:
                raise BundleError(
                    f"network_data_format has no {side} (an object: tensor name -> description)",
                    file=label,
                    item=f"network_data_format#{side}",
                )


def load_config(source: BundleSource, config_names: Sequence[str] = DEFAULT_CONFIG_NAMES) -> BundleConfig:
    return BundleConfig(source, config_names)


def _importable(root: str) -> None:
    """Put the bundle folder first on ``sys.path`` (its ``scripts`` package), as the App SDK operator does.

    Every zoo bundle calls its package ``scripts``: one imported from another bundle's folder is forgotten
    (``sys.modules``), so this bundle's configs find their own classes; what was built from the other stays as built.
    """
    if root in sys.path:
        sys.path.remove(root)
    sys.path.insert(0, root)
    loaded = sys.modules.get("scripts")
    if loaded is None:
        return
    places = [*getattr(loaded, "__path__", []), getattr(loaded, "__file__", None) or ""]
    mine = Path(root, "scripts").resolve()
    if not any(place and Path(place).resolve().is_relative_to(mine) for place in places):
        for name in [m for m in sys.modules if m == "scripts" or m.startswith("scripts.")]:
            del sys.modules[name]


def _cause(exc: BaseException) -> str:
    """MONAI wraps a component's error ("Failed to instantiate ..."): the innermost message says what is wrong."""
    texts: list[str] = []
    current: BaseException | None = exc
    while current is not None and len(texts) < 4:
        line = str(current).strip().splitlines()[0] if str(current).strip() else type(current).__name__
        if line not in texts:
            texts.append(line)
        current = current.__cause__
    return " <- ".join(reversed(texts)) if len(texts) > 1 else texts[0]


__all__ = ["DEFAULT_CONFIG_NAMES", "BundleConfig", "BundleFile", "ItemNames", "load_config"]
