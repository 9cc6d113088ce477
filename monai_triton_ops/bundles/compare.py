"""Whether two bundles share their pre-processing, inferer and post-processing: their config items compared.

An ensemble of bundles (folds of one bundle, as nnU-Net trains them, or bundles with one data flow) runs one
pre-processing, one inferer and one post-processing for all its members, the first member's
(``operators/ensemble_bundles.py``). That is right only where every member's are the same, so they are compared
first: each item as written, its macros (``%``) and relative ids resolved, together with every item it references
(``@id``, as a value or inside a ``$`` expression), however deep. ``bundle_root`` is each bundle's own folder and
is not compared. The first difference comes back with its config id (``preprocessing#transforms#3#pixdim``), both
values and the file it came from, so the error says what to make the same.

Compared as written, not as built: numbers by value (``2`` is ``2.0``), anything else by its text, so an item
that builds the same thing from other text (``"@roi"`` here, ``[96, 96, 96]`` there) is reported as a difference,
which errs on the safe side.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from monai.bundle.reference_resolver import ReferenceResolver
from monai.bundle.utils import EXPR_KEY, ID_REF_KEY, ID_SEP_KEY

from .config import BundleConfig
from .reader import Bundle

#: What each bundle has of its own, never compared: its folder.
OWN_IDS = frozenset({"bundle_root"})
#: How a missing item or key is shown.
NOT_SET = "(not set)"


@dataclass(frozen=True)
class Difference:
    """Where the other bundle's config differs: the item's id, the first bundle's value, the other's, its file."""

    item: str
    expected: str
    actual: str
    file: str


def config_difference(first: Bundle, other: Bundle) -> Difference | None:
    """The first config item in which ``other``'s pre-processing, inferer or post-processing differs from
    ``first``'s (the items ``first.items`` names); ``None`` when they are the same."""
    comparison = _Comparison(first.config, other.config)
    for item in (first.items.preprocessing, first.items.inferer, first.items.postprocessing):
        found = comparison.item(item)
        if found is not None:
            return found
    return None


class _Comparison:
    """One walk over two configs; each referenced item is compared once (references may repeat or loop)."""

    def __init__(self, first: BundleConfig, other: BundleConfig) -> None:
        self.first, self.other = first, other
        for config in (first, other):
            config.parser.resolve_macro_and_relative_ids()  # type: ignore[no-untyped-call]
        self.done: set[str] = set()

    def item(self, item: str) -> Difference | None:
        shown = item.replace(ID_SEP_KEY, "#")
        if shown in self.done or shown.split("#", 1)[0] in OWN_IDS:
            return None
        self.done.add(shown)
        return self.values(shown, self.first.parser.get(shown), self.other.parser.get(shown))

    def values(self, path: str, expected: Any, actual: Any) -> Difference | None:
        """The first difference between two values of item ``path``, following what they reference."""
        if isinstance(expected, dict) and isinstance(actual, dict):
            for key in [*expected, *(k for k in actual if k not in expected)]:
                if key not in expected or key not in actual:
                    return self.difference(f"{path}#{key}", expected.get(key, NOT_SET), actual.get(key, NOT_SET))
                found = self.values(f"{path}#{key}", expected[key], actual[key])
                if found is not None:
                    return found
            return None
        if _nested(expected) and _nested(actual) and len(expected) == len(actual):  # a list of values is one value
            for index, (left, right) in enumerate(zip(expected, actual, strict=True)):
                found = self.values(f"{path}#{index}", left, right)
                if found is not None:
                    return found
            return None
        if (type(expected) is not type(actual) and not _both_numbers(expected, actual)) or expected != actual:
            return self.difference(path, expected, actual)
        for reference in _references(expected):  # the same text: what it refers to must be the same too
            found = self.item(reference)
            if found is not None:
                return found
        return None

    def difference(self, path: str, expected: Any, actual: Any) -> Difference:
        return Difference(path, _shown(expected), _shown(actual), self.other.file_of(path))


def _nested(value: Any) -> bool:
    """A list holding dicts or lists (a ``Compose``'s transforms), compared item by item."""
    return isinstance(value, list) and any(isinstance(v, dict | list) for v in value)


def _both_numbers(left: Any, right: Any) -> bool:
    return all(isinstance(v, int | float) and not isinstance(v, bool) for v in (left, right))


def _references(value: Any) -> list[str]:
    """The ids a config string (or a list of them) refers to: ``@id`` itself, or each ``@id`` in a ``$`` expression."""
    if isinstance(value, list):
        return [ref for item in value for ref in _references(item)]
    if not isinstance(value, str):
        return []
    if value.startswith(ID_REF_KEY):
        return [value[len(ID_REF_KEY) :]]
    if value.startswith(EXPR_KEY):
        return list(ReferenceResolver.match_refs_pattern(value))
    return []


def _shown(value: Any, limit: int = 120) -> str:
    """A value as the config writes it (JSON), cut to ``limit`` characters."""
    text = value if value == NOT_SET else json.dumps(value, default=str)
    return text if len(text) <= limit else text[: limit - 3] + "..."
