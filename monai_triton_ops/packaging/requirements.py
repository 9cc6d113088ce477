"""What pip installs into the image, and at which versions.

- ``requirements.txt``: the app's own ``requirements.txt`` and ``app.yaml``'s ``pip-packages``, plus this
  project's dependencies read from the wheel being installed; the line naming ``monai-triton-ops`` itself
  is dropped (no package index has it: the wheel built from the checkout stands in for it).
- ``constraints.txt``: every distribution of the environment that packages the app, pinned to the version
  installed there, so the image runs what was tested here (``torch`` at the local CPU build included);
  the user's ``--constraint`` files follow and win for the names they pin.
- the Triton server files (``nvidia-pytriton``, installed with ``--no-deps`` as ``make setup`` does: the
  wheel pins numpy<2, and only its server files are used) when this environment has them.
"""

from __future__ import annotations

import importlib.metadata
import json
import re
import zipfile
from collections.abc import Iterable, Sequence
from pathlib import Path

from ..errors import ConfigError

PROJECT = "monai-triton-ops"
#: The distribution that carries Triton's server, its library and the Python backend (``discovery.py``).
SERVER_FILES = "nvidia-pytriton"
#: Never pinned: the image's venv brings its own installer.
_UNPINNED = {"pip", "setuptools", "wheel"}
_NAME = re.compile(r"^\s*([A-Za-z0-9][A-Za-z0-9._-]*)")


def canonical(name: str) -> str:
    """PEP 503 normalised name: ``Monai_Triton.Ops`` -> ``monai-triton-ops``."""
    return re.sub(r"[-_.]+", "-", name).lower()


def requirement_name(line: str) -> str | None:
    """The distribution a requirement line names (``None`` for comments, options and URLs)."""
    text = line.split("#", 1)[0].strip()
    if not text or "://" in text or text.startswith(("-", ".", "/")):
        return None
    match = _NAME.match(text)
    return canonical(match.group(1)) if match else None


def app_requirements(requirements_file: Path | None, pip_packages: Sequence[str]) -> list[str]:
    """The app's requirement lines without this project's own (the wheel provides it)."""
    lines: list[str] = []
    if requirements_file is not None and requirements_file.is_file():
        for raw in requirements_file.read_text(encoding="utf-8").splitlines():
            text = raw.split("#", 1)[0].strip()
            if text.startswith(("-e", "--editable")):
                raise ConfigError(f"{requirements_file}: editable requirement {text!r} cannot go into an image")
            if text and requirement_name(text) != PROJECT:
                lines.append(text)
    lines += [p for p in pip_packages if requirement_name(p) != PROJECT]
    return lines


def wheel_requirements(wheel: Path) -> list[str]:
    """The wheel's ``Requires-Dist`` entries that apply without extras."""
    with zipfile.ZipFile(wheel) as archive:
        metadata_name = next((n for n in archive.namelist() if n.endswith(".dist-info/METADATA")), None)
        if metadata_name is None:
            raise ConfigError(f"{wheel}: not a wheel (no .dist-info/METADATA)")
        metadata = archive.read(metadata_name).decode("utf-8")
    requires = [line.split(":", 1)[1].strip() for line in metadata.splitlines() if line.startswith("Requires-Dist:")]
    return [r for r in requires if "extra ==" not in r.replace('"', "'").replace("extra==", "extra ==")]


def environment_pins(requirements: Iterable[str], exclude: Iterable[str] = ()) -> dict[str, str]:
    """``name -> name==version`` for what ``requirements`` need, as installed in this environment.

    Only the requirements' dependency closure is pinned, so that a test tool added here does not change the
    image's constraints (and its cached layers). Left out: this project, editable and local-path installs
    (their files are on no index), pip's own tools, and whatever is not installed here.
    """
    skip = {canonical(n) for n in (*exclude, PROJECT, *_UNPINNED)}
    installed = {canonical(d.metadata["Name"] or ""): d for d in importlib.metadata.distributions()}
    pins: dict[str, str] = {}
    for name in sorted(_closure(requirements, installed)):
        dist = installed.get(name)
        if dist is not None and name not in skip and not _installed_from_path(dist):
            pins[name] = f"{name}=={dist.version}"
    return pins


def _closure(requirements: Iterable[str], installed: dict[str, importlib.metadata.Distribution]) -> set[str]:
    """Names reached from ``requirements`` through the installed distributions' ``Requires-Dist`` (with extras)."""
    from packaging.requirements import InvalidRequirement, Requirement

    seen: set[str] = set()
    queue: list[tuple[str, frozenset[str]]] = []
    for line in requirements:
        try:
            req = Requirement(line.split("#", 1)[0].strip())
        except InvalidRequirement:
            continue
        queue.append((canonical(req.name), frozenset(req.extras)))
    done: set[tuple[str, frozenset[str]]] = set()
    while queue:
        name, extras = queue.pop()
        if (name, extras) in done:
            continue
        done.add((name, extras))
        seen.add(name)
        dist = installed.get(name)
        for text in (dist.requires or []) if dist is not None else []:
            req = Requirement(text)
            wanted = req.marker is None or any(req.marker.evaluate({"extra": e}) for e in (extras or {""}))
            if wanted:
                queue.append((canonical(req.name), frozenset(req.extras)))
    return seen


def _installed_from_path(dist: importlib.metadata.Distribution) -> bool:
    text = dist.read_text("direct_url.json")
    if not text:
        return False
    try:
        url = json.loads(text).get("url", "")
    except json.JSONDecodeError:
        return True
    return bool(url) and not str(url).startswith(("http://", "https://"))


def constraints_text(pins: dict[str, str], user_files: Sequence[Path]) -> str:
    """This environment's pins, minus the names the user's constraint files pin, then those files."""
    user_lines: list[str] = []
    for path in user_files:
        try:
            user_lines += [f"# from {path}", *path.read_text(encoding="utf-8").splitlines()]
        except OSError as exc:
            raise ConfigError(f"constraint file {str(path)!r} cannot be read: {exc.strerror or exc}") from exc
    overridden = {n for n in (requirement_name(line) for line in user_lines) if n}
    ours = [pin for name, pin in pins.items() if name not in overridden]
    header = "# Versions of the environment that packaged the app (what was tested there), then --constraint files."
    return "\n".join([header, *ours, *user_lines]) + "\n"


def installed_version(*names: str) -> str | None:
    """The version of the first of ``names`` installed here, or ``None``."""
    for name in names:
        try:
            return importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            continue
    return None
