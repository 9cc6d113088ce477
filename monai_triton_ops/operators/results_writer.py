"""Plain results (class scores, any dict of named arrays or numbers) written as one JSON file per input.

``JSONResultsWriter`` takes what a bundle ``InferenceOperator`` emits for a non-image output (a port declared
``dict``: ``bundles.outputs``) on port ``pred`` and the input's name on the optional port ``filename`` (the
``Image2DLoader``'s), and writes ``<output_folder>/<filename>_result.json``:
``{"filename": ..., "probabilities": {class: score}, "predicted_class": ..., "confidence": ...}`` for class
scores (the JSON shape of the App SDK pipeline generator's writer), ``{"filename": ..., <name>: ...}`` for
any other result, arrays as lists. Without a filename, ``default_filename`` names the first input and the others
are numbered (``result_1``, ``result_2``...).
A file is written whole or not at all (written beside, then renamed).
"""

from __future__ import annotations

import json
import logging
import os
import tempfile
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from monai.deploy.core import ConditionType, Fragment, OperatorSpec
from monai.deploy.core import Operator as SdkOperator

from ..bundles.outputs import plain_result, to_json
from ..preflight import check_output_folder

logger = logging.getLogger(__name__)


def write_result(folder: Path, filename: str, result: Any) -> Path:
    """``folder/<filename>_result.json`` holding ``{"filename": filename, **result}``; returns its path."""
    content = dict(result) if isinstance(result, Mapping) else plain_result("pred", result)
    document = {"filename": filename, **to_json(content)}
    path = folder / f"{filename}_result.json"
    fd, tmp = tempfile.mkstemp(dir=folder, prefix=".tmp-", suffix=".json")
    try:
        with os.fdopen(fd, "w") as handle:
            json.dump(document, handle, indent=2)
        os.chmod(tmp, 0o644)
        os.replace(tmp, path)
    finally:
        Path(tmp).unlink(missing_ok=True)
    logger.info("wrote %s", path)
    return path


class JSONResultsWriter(SdkOperator):  # type: ignore[misc]
    """Writes the result on port ``pred`` to ``output_folder/<filename>_result.json`` (``filename``: optional port)."""

    def __init__(
        self,
        fragment: Fragment,
        *args: Any,
        output_folder: str | os.PathLike[str],
        default_filename: str = "result",
        **kwargs: Any,
    ) -> None:
        self.output_folder = check_output_folder(output_folder)
        self.default_filename = default_filename
        self.written: list[Path] = []
        super().__init__(fragment, *args, **kwargs)

    def setup(self, spec: OperatorSpec) -> None:
        spec.input("pred")
        spec.input("filename").condition(ConditionType.NONE)

    def compute(self, op_input: Any, op_output: Any, context: Any) -> None:
        result = op_input.receive("pred")
        name = op_input.receive("filename")
        count = len(self.written)
        filename = str(name) if name else self.default_filename if not count else f"result_{count}"
        self.written.append(write_result(self.output_folder, filename, result))
