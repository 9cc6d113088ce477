"""MkDocs hooks for the user guide: its home page, its nav and its API reference, made from what the repository holds.

- ``index.md`` is ``README.md`` and ``contributing.md`` is ``CONTRIBUTING.md``, their links into ``docs/`` made
  relative to the guide (links to other files of the repository become plain text: the guide holds no code).
- The nav lists the pages of ``GUIDE_ORDER`` first, then every other ``docs/*.md`` in name order, so a page added
  by anyone appears without an edit here.
- ``api/<part>.md`` is generated for every part of the package (the top-level modules, then each subpackage),
  one ``::: module`` block per public module found on disk: a module added anywhere appears, one removed or
  renamed disappears, and a docstring mkdocstrings cannot read fails the strict build.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

from mkdocs.structure.files import File, Files

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = "monai_triton_ops"
#: Pages in reading order; any other docs/*.md follows them.
GUIDE_ORDER = [
    "quickstart.md", "architecture.md", "config-generation.md", "serving.md", "remote.md", "inprocess.md",
    "binding.md", "packaging.md", "fleet.md", "benchmarks.md",
]  # fmt: skip
#: Generated pages: (page in the guide, file of the repository).
COPIED = {"index.md": "README.md", "contributing.md": "CONTRIBUTING.md"}
_LINK = re.compile(r"\[([^\]]+)\]\(([^)#\s]+)(#[^)\s]*)?\)")


def on_files(files: Files, config: Any) -> Files:
    for page, source in COPIED.items():
        text = (ROOT / source).read_text(encoding="utf-8")
        files.append(File.generated(config, page, content=_relink(text, config["docs_dir"])))
    for page, content in api_pages().items():
        files.append(File.generated(config, page, content=content))
    return files


def on_config(config: Any) -> Any:
    docs = Path(config["docs_dir"])
    present = sorted(p.name for p in docs.glob("*.md"))
    guide = [name for name in GUIDE_ORDER if name in present] + [n for n in present if n not in GUIDE_ORDER]
    config["nav"] = [
        {"Home": "index.md"},
        {"Guide": [{_title(docs / name): name} for name in guide]},
        {"API reference": [{title: page} for page, title in api_titles().items()]},
        {"Contributing": "contributing.md"},
    ]
    return config


def _title(path: Path) -> str:
    """A page's first heading, for the nav."""
    for line in path.read_text(encoding="utf-8").splitlines():
        if line.startswith("# "):
            return line[2:].strip()
    return path.stem


def _relink(text: str, docs_dir: str) -> str:
    """Links to ``docs/x.md`` become ``x.md``; links to other repository files become their text and path."""
    docs = Path(docs_dir).resolve()

    def fix(match: re.Match[str]) -> str:
        label, target, anchor = match.group(1), match.group(2), match.group(3) or ""
        if "://" in target or target.startswith("mailto:"):
            return match.group(0)
        path = (ROOT / target).resolve()
        if path.suffix == ".md" and path.parent == docs:
            return f"[{label}]({path.name}{anchor})"
        return f"{label} (`{target}`)"

    return _LINK.sub(fix, text)


# -- the API reference ---------------------------------------------------------------------------------------------
def _modules() -> dict[str, list[str]]:
    """Part (``""`` for the top level, else the subpackage) -> its public modules, found on disk."""
    base = ROOT / PACKAGE
    parts: dict[str, list[str]] = {}
    for path in sorted(base.rglob("*.py")):
        relative = path.relative_to(base).with_suffix("")
        if any(piece.startswith("_") and piece != "__init__" for piece in relative.parts):
            continue
        pieces = [p for p in relative.parts if p != "__init__"]
        part = pieces[0] if len(relative.parts) > 1 else ""
        parts.setdefault(part, []).append(".".join([PACKAGE, *pieces]))
    return {part: sorted(modules, key=lambda m: (m.count("."), m)) for part, modules in sorted(parts.items())}


def api_titles() -> dict[str, str]:
    return {
        (f"api/{part}.md" if part else "api/index.md"): (f"{PACKAGE}.{part}" if part else PACKAGE)
        for part in _modules()
    }


def api_pages() -> dict[str, str]:
    pages = {}
    titles = api_titles()
    for part, modules in _modules().items():
        page = f"api/{part}.md" if part else "api/index.md"
        intro = "The package and its top-level modules." if not part else f"The `{PACKAGE}.{part}` subpackage."
        blocks = "\n\n".join(f"::: {module}\n    options:\n      show_submodules: false" for module in modules)
        pages[page] = f"# {titles[page]}\n\n{intro} Generated from the docstrings.\n\n{blocks}\n"
    return pages
