"""``monai-triton repo check`` and ``repo describe``: what a repository holds, and whether it holds together.

``check_repository`` parses every model's ``config.pbtxt`` and compares it, version by version,
with the MONAI metadata inside the model file where there is some, without loading any weights:
a config that says 2 input channels over a model that takes 1 is found here, not in the first
request. ``describe_path`` gives the signature a backend would see for a model file or folder.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from ..errors import ModelNotFoundError, MonaiTritonError
from ..signature import ModelSignature, TensorSpec
from . import layout
from .metadata import read_torchscript_metadata, signature_from_metadata
from .signatures import LocalEntry, local_entry

RUNNER_FILENAME = "model.py"


@dataclass(frozen=True, kw_only=True)
class EntryReport:
    """One model folder: its versions, the signature it declares, and what is wrong with it."""

    name: str
    versions: tuple[int, ...]
    signature: ModelSignature | None
    source: str  # "config.pbtxt", "model metadata" or "-"
    problems: tuple[str, ...] = ()
    notes: tuple[str, ...] = ()


@dataclass(frozen=True, kw_only=True)
class Description:
    """What ``repo describe`` prints."""

    signature: ModelSignature
    source: str
    verified: bool | None = None  # None: not applicable (a repository entry's config is the truth)


def model_folders(repository: str | Path) -> list[Path]:
    """The model folders of a repository (hidden folders, e.g. a build's staging folder, excluded)."""
    repo = Path(repository)
    if not repo.is_dir():
        raise ModelNotFoundError(f"model repository {str(repo)!r} does not exist or is not a folder")
    return sorted(p for p in repo.iterdir() if p.is_dir() and not p.name.startswith("."))


def check_repository(repository: str | Path) -> list[EntryReport]:
    """One report per model folder, in name order."""
    return [check_entry(folder.parent, folder.name) for folder in model_folders(repository)]


def check_entry(repository: Path, name: str) -> EntryReport:
    versions = tuple(layout.versions(repository / name))
    problems: list[str] = [] if versions else ["no numeric version folder (e.g. 1/)"]
    try:
        entry = local_entry(repository, name)
        signature, flavor = _declared(entry)
    except MonaiTritonError as exc:
        return EntryReport(name=name, versions=versions, signature=None, source="-", problems=(str(exc), *problems))
    notes = []
    if entry.config is None:
        notes.append("no config.pbtxt: the torch backend reads the model file's metadata; tritonserver needs one")
    source = "config.pbtxt" if signature is not None else "-"
    for version in versions:
        found, issues = _check_version(repository / name / str(version), entry, signature, flavor)
        problems += [f"version {version}: {issue}" for issue in issues]
        if signature is None and found is not None:
            signature, source = found, "model metadata"
    return EntryReport(
        name=name, versions=versions, signature=signature, source=source, problems=tuple(problems), notes=tuple(notes)
    )


def _declared(entry: LocalEntry) -> tuple[ModelSignature | None, str | None]:
    if entry.config is None:
        return None, None
    from .config import options_from_config, signature_from_config

    return signature_from_config(entry.config), options_from_config(entry.config).flavor


def _check_version(
    folder: Path, entry: LocalEntry, declared: ModelSignature | None, flavor: str | None
) -> tuple[ModelSignature | None, list[str]]:
    """The signature in this version's model file (if any) and what contradicts the declared one."""
    path = folder / entry.model_filename
    if not path.is_file():
        return None, [f"no {entry.model_filename!r} in {str(folder)!r}"]
    issues = []
    if flavor == "python" and not (folder / RUNNER_FILENAME).is_file():
        issues.append(f"no {RUNNER_FILENAME} runner for the python backend (rebuild with 'monai-triton repo build')")
    try:
        meta = read_torchscript_metadata(path)
        if meta is None:
            if declared is None:
                issues.append(f"{path.name} carries no MONAI metadata and there is no config.pbtxt")
            return None, issues
        batch = declared.max_batch_size if declared is not None else 0
        in_file = signature_from_metadata(entry.name, meta, max_batch_size=batch)
    except MonaiTritonError as exc:
        return None, [*issues, str(exc)]
    if declared is not None:
        issues += differences(declared, in_file)
    return in_file, issues


def differences(declared: ModelSignature, in_file: ModelSignature) -> list[str]:
    """Where ``config.pbtxt`` and the model file's metadata disagree, tensor by tensor (names aside)."""
    found = []
    for kind, ours, theirs in (
        ("input", declared.inputs, in_file.inputs),
        ("output", declared.outputs, in_file.outputs),
    ):
        if len(ours) != len(theirs):
            found.append(f"config.pbtxt declares {len(ours)} {kind}(s), the model file's metadata {len(theirs)}")
            continue
        for position, (a, b) in enumerate(zip(ours, theirs, strict=True)):
            if (a.dtype, a.shape) != (b.dtype, b.shape):
                found.append(
                    f"{kind} {position} ({a.name}): config.pbtxt says {a.dtype} {list(a.shape)}, "
                    f"the model file's metadata {b.dtype} {list(b.shape)}"
                )
    return found


def describe_path(
    path: str | Path, input_shapes: Sequence[Sequence[int]] | None = None, bundle_metadata: str | Path | None = None
) -> Description:
    """A model file (its metadata, checked by a run, or a probe) or a repository's model folder (as backends see it)."""
    target = Path(path)
    if target.is_file():
        from .describe import describe_model

        found = describe_model(target, target.stem, input_shapes=input_shapes, bundle_metadata=bundle_metadata)
        return Description(signature=found.signature, source=found.source, verified=found.verified)
    if not target.is_dir():
        raise ModelNotFoundError(f"{str(target)!r} is neither a model file nor a model folder")
    version, folder = layout.resolve_version(target.parent, target.name)
    entry = local_entry(target.parent, target.name)
    model = layout.model_file(folder, target.name, entry.model_filename)
    names: Sequence[str] = ()
    if entry.config is None:  # input names follow forward(), as the torch backend names them
        from .probe import load_model

        names = load_model(model, target.name).argument_names
    signature = entry.signature(version, path=model, schema_names=names)
    return Description(signature=signature, source="config.pbtxt" if entry.config else "model metadata")


def render_description(description: Description) -> str:
    signature = description.signature
    version = f" (version {signature.version})" if signature.version is not None else ""
    checked = {None: "", True: ", checked by running the model", False: ", not checked by a run"}[description.verified]
    batch = signature.max_batch_size
    batching = f"implicit, up to {batch} per request" if batch else "explicit: the first dim of each shape"
    rows = [
        ("model", f"{signature.name}{version}"),
        ("source", f"{description.source}{checked}"),
        ("batch", batching),
        *((f"input {i}", _tensor(s, batch)) for i, s in enumerate(signature.inputs)),
        *((f"output {i}", _tensor(s, batch)) for i, s in enumerate(signature.outputs)),
    ]
    width = max(len(k) for k, _ in rows)
    return "".join(f"{k:<{width}}  {v}\n" for k, v in rows) + "(-1: any size)\n"


def render_reports(reports: Sequence[EntryReport]) -> str:
    """The table of models, versions, inputs, outputs and status, then every problem and note."""
    header = ("MODEL", "VERSIONS", "INPUTS", "OUTPUTS", "STATUS")
    rows = [header]
    for r in reports:
        batch = r.signature.max_batch_size if r.signature else 0
        inputs = "; ".join(_tensor(s, batch) for s in r.signature.inputs) if r.signature else "-"
        outputs = "; ".join(_tensor(s, batch) for s in r.signature.outputs) if r.signature else "-"
        status = f"{len(r.problems)} problem(s)" if r.problems else "ok"
        rows.append((r.name, ",".join(map(str, r.versions)) or "-", inputs, outputs, status))
    widths = [max(len(row[i]) for row in rows) for i in range(len(header))]
    lines = ["  ".join(cell.ljust(w) for cell, w in zip(row, widths, strict=True)).rstrip() for row in rows]
    for r in reports:
        lines += [f"{r.name}: {p}" for p in r.problems] + [f"{r.name}: note: {n}" for n in r.notes]
    return "\n".join(lines) + "\n"


def _tensor(spec: TensorSpec, max_batch_size: int) -> str:
    return f"{spec.name} {spec.dtype} {list(spec.full_shape(max_batch_size))}"
