"""Fail when a module of the package is longer than MAX_LINES: a module that size holds more than one concept.

Run by ``make lint``. Lines are counted as ``wc -l`` counts them (newline characters). A module still over the
limit is named in ALLOWED with the size it may not pass, until it is split; an entry whose module is back under
the limit, or gone, fails too, so the list only shrinks.

    python tools/module_sizes.py [PACKAGE_DIR]     (default: monai_triton_ops next to this folder)
"""

from __future__ import annotations

import sys
from collections.abc import Mapping
from pathlib import Path

MAX_LINES = 400

#: Modules still over MAX_LINES (path relative to the package's parent -> the most lines it may have), each to
#: be split by concept and then removed from here.
ALLOWED: Mapping[str, int] = {}


def line_count(path: Path) -> int:
    """Lines as ``wc -l`` counts them, plus a last line without its newline."""
    data = path.read_bytes()
    return data.count(b"\n") + (1 if data and not data.endswith(b"\n") else 0)


def problems(package: Path, *, max_lines: int = MAX_LINES, allowed: Mapping[str, int] = ALLOWED) -> list[str]:
    """What is wrong with the sizes of ``package``'s modules, one line each; empty when all is well."""
    root = package.parent
    found = []
    sizes = {path.relative_to(root).as_posix(): line_count(path) for path in sorted(package.rglob("*.py"))}
    for name, lines in sizes.items():
        ceiling = allowed.get(name)
        if ceiling is None and lines > max_lines:
            found.append(f"{name}: {lines} lines, over {max_lines}: split it by concept (one module per concept)")
        elif ceiling is not None and lines > ceiling:
            found.append(f"{name}: {lines} lines, over its allowance of {ceiling} (tools/module_sizes.py): split it")
        elif ceiling is not None and lines <= max_lines:
            found.append(f"{name}: {lines} lines, no longer over {max_lines}: remove it from ALLOWED")
    for name in sorted(set(allowed) - set(sizes)):
        found.append(f"{name}: in ALLOWED but not in the package: remove it from ALLOWED")
    return found


def main(argv: list[str]) -> int:
    package = Path(argv[1]) if len(argv) > 1 else Path(__file__).resolve().parents[1] / "monai_triton_ops"
    found = problems(package)
    for line in found:
        print(f"error: {line}", file=sys.stderr)
    return 1 if found else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
