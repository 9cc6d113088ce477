"""``monai-triton repo check`` and ``repo describe``: what a repository holds, whether it holds together, and what for.

``check_repository`` reads every model folder of a repository (or one model folder), whatever kind
it is (``servable.kind_of``): one built by ``repo build``, a hand-written Python-backend model, the
App SDK's client-side folder (``config.pbtxt`` and no version folder), a bare model file with
metadata, another platform's model. It parses each ``config.pbtxt`` and compares it, version by
version, with the MONAI metadata inside the model file where there is some, without loading any
weights (a config that says 2 input channels over a model that takes 1 is found here, not in the
first request), and says what each folder can be used for on this machine. ``describe_path`` gives
the signature a backend would see for a model file or folder.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path

from ..errors import ModelNotFoundError, MonaiTritonError, ServerNotFoundError
from ..signature import ModelSignature, TensorSpec
from . import layout, servable
from .metadata import read_torchscript_metadata, signature_from_metadata
from .signatures import LocalEntry, local_entry

RUNNER_FILENAME = "model.py"


@dataclass(frozen=True, kw_only=True)
class EntryReport:
    """One model folder: its kind, versions, the signature it declares, what is wrong with it, what it is for."""

    name: str
    versions: tuple[int, ...]
    signature: ModelSignature | None
    source: str  # "config.pbtxt", "model metadata" or "-"
    kind: str = "-"
    problems: tuple[str, ...] = ()
    notes: tuple[str, ...] = ()
    uses: tuple[str, ...] = ()
    not_uses: tuple[str, ...] = ()


@dataclass(frozen=True, kw_only=True)
class Description:
    """What ``repo describe`` prints."""

    signature: ModelSignature
    source: str
    verified: bool | None = None  # None: not applicable (a repository entry's config is the truth)
    kind: str | None = None
    uses: tuple[str, ...] = field(default=())
    not_uses: tuple[str, ...] = field(default=())


def model_folders(repository: str | Path) -> list[Path]:
    """The model folders of a repository (hidden folders, e.g. a build's staging folder, excluded).

    A model folder itself (it holds ``config.pbtxt``) is a repository of that one model.
    """
    repo = Path(repository)
    if not repo.is_dir():
        raise ModelNotFoundError(f"model repository {str(repo)!r} does not exist or is not a folder")
    if (repo / layout.CONFIG_FILENAME).is_file():
        return [repo]
    return sorted(p for p in repo.iterdir() if p.is_dir() and not p.name.startswith("."))


def local_capabilities() -> servable.Capabilities | None:
    """What this machine's Triton (the wheel's, or ``$TRITONSERVER_HOME``) can load; ``None`` without one."""
    from ..discovery import find_tritonserver

    try:
        return servable.Capabilities.of_install(find_tritonserver())
    except ServerNotFoundError:
        return None


def check_repository(repository: str | Path) -> list[EntryReport]:
    """One report per model folder, in name order."""
    capabilities = local_capabilities()
    return [check_entry(folder.parent, folder.name, capabilities) for folder in model_folders(repository)]


def check_entry(repository: Path, name: str, capabilities: servable.Capabilities | None = None) -> EntryReport:
    versions = tuple(layout.versions(repository / name))
    try:
        entry = local_entry(repository, name)
        signature = _declared(entry)
    except MonaiTritonError as exc:
        failed = (str(exc), *([] if versions else ["no numeric version folder (e.g. 1/)"]))
        return EntryReport(name=name, versions=versions, signature=None, source="-", problems=failed)
    kind = servable.kind_of(entry.config, bool(versions))
    problems: list[str] = []
    notes = _notes(entry, kind, signature)
    if not versions and entry.config is None:
        problems.append("no numeric version folder (e.g. 1/) and no config.pbtxt: nothing to serve or describe")
    source = "config.pbtxt" if signature is not None else "-"
    for version in versions:
        found, issues = _check_version(repository / name / str(version), entry, kind, signature)
        problems += [f"version {version}: {issue}" for issue in issues]
        if signature is None and found is not None:
            signature, source = found, "model metadata"
    yes, no = servable.uses(kind, entry.config, capabilities)
    return EntryReport(
        name=name, versions=versions, signature=signature, source=source, kind=kind, problems=tuple(problems),
        notes=tuple(notes), uses=tuple(yes), not_uses=tuple(no),
    )  # fmt: skip


def _declared(entry: LocalEntry) -> ModelSignature | None:
    if entry.config is None:
        return None
    from .config import signature_from_config

    return signature_from_config(entry.config)


def _notes(entry: LocalEntry, kind: str, signature: ModelSignature | None) -> list[str]:
    notes = []
    if entry.config is None:
        notes.append("no config.pbtxt: the torch backend reads the model file's metadata; tritonserver needs one")
    if kind == servable.CLIENT_SIDE:
        notes.append("a client-side model folder: config.pbtxt only, the model file is on the server")
    if signature is not None and servable.backend_of(entry.config) == "pytorch":
        from .naming import libtorch_naming

        try:
            notes += libtorch_naming(signature)
        except MonaiTritonError as exc:
            notes.append(str(exc))
    return notes


def _check_version(
    folder: Path, entry: LocalEntry, kind: str, declared: ModelSignature | None
) -> tuple[ModelSignature | None, list[str]]:
    """The signature in this version's model file (if any) and what contradicts the declared one."""
    if kind in (servable.PYTHON_MODEL, servable.WHOLE_VOLUME):
        runner = (folder / RUNNER_FILENAME).is_file()
        issues = [] if runner else [f"no {RUNNER_FILENAME} in {str(folder)!r} for the python backend"]
        network = servable.wrapped_network(entry.config)
        if network is not None and not (folder.parent.parent / network / layout.CONFIG_FILENAME).is_file():
            issues.append(f"it wraps the network {network!r}, which this repository does not hold")
        return None, issues
    if kind in (servable.ONNX, servable.ONNXRUNTIME):
        return _check_onnx(folder, entry, kind, declared)
    if kind not in (servable.TORCHSCRIPT, servable.LIBTORCH, servable.MODEL_FILE):
        return None, []  # another platform's file: Triton checks it when it loads it
    path = folder / entry.model_filename
    if not path.is_file():
        return None, [f"no {entry.model_filename!r} in {str(folder)!r}"]
    issues = []
    if kind == servable.TORCHSCRIPT and not (folder / RUNNER_FILENAME).is_file():
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


def _check_onnx(
    folder: Path, entry: LocalEntry, kind: str, declared: ModelSignature | None
) -> tuple[ModelSignature | None, list[str]]:
    """An ONNX entry: its file parses as ONNX, and its graph has and takes every declared tensor."""
    from .onnx_model import DEFAULT_ONNX_FILENAME, graph_conflicts, read_onnx

    filename = (
        entry.model_filename
        if entry.config is None or entry.config.default_model_filename or kind == servable.ONNX
        else DEFAULT_ONNX_FILENAME
    )
    path = folder / filename
    if not path.is_file():
        return None, [f"no {filename!r} in {str(folder)!r}"]
    issues = []
    if kind == servable.ONNX and not (folder / RUNNER_FILENAME).is_file():
        issues.append(f"no {RUNNER_FILENAME} runner for the python backend (rebuild with 'monai-triton repo build')")
    try:
        model = read_onnx(path, entry.name)
        in_file = model.signature(entry.name)
    except MonaiTritonError as exc:
        return None, [*issues, str(exc)]
    if declared is not None:
        issues += graph_conflicts(declared, model)
    return in_file, issues


def differences(
    declared: ModelSignature, in_file: ModelSignature, theirs_label: str = "the model file's metadata"
) -> list[str]:
    """Where ``config.pbtxt`` and another description of the model disagree, tensor by tensor (names aside)."""
    found = []
    for kind, ours, theirs in (
        ("input", declared.inputs, in_file.inputs),
        ("output", declared.outputs, in_file.outputs),
    ):
        if len(ours) != len(theirs):
            found.append(f"config.pbtxt declares {len(ours)} {kind}(s), {theirs_label} {len(theirs)}")
            continue
        for position, (a, b) in enumerate(zip(ours, theirs, strict=True)):
            if (a.dtype, a.shape) != (b.dtype, b.shape):
                found.append(
                    f"{kind} {position} ({a.name}): config.pbtxt says {a.dtype} {list(a.shape)}, "
                    f"{theirs_label} {b.dtype} {list(b.shape)}"
                )
    return found


def describe_path(
    path: str | Path, input_shapes: Sequence[Sequence[int]] | None = None, bundle_metadata: str | Path | None = None
) -> Description:
    """A model file (its metadata, checked by a run, or a probe) or a model folder (as backends see it)."""
    target = Path(path)
    if target.is_file():
        from .describe import describe_model

        found = describe_model(target, target.stem, input_shapes=input_shapes, bundle_metadata=bundle_metadata)
        return Description(signature=found.signature, source=found.source, verified=found.verified)
    if not target.is_dir():
        raise ModelNotFoundError(f"{str(target)!r} is neither a model file nor a model folder")
    entry = local_entry(target.parent, target.name)
    versions = layout.versions(target)
    kind = servable.kind_of(entry.config, bool(versions))
    yes, no = servable.uses(kind, entry.config, local_capabilities())
    if entry.config is not None:  # the config is what every backend and server goes by; no file needed
        from .config import signature_from_config

        signature = signature_from_config(entry.config, version=versions[-1] if versions else None)
        return Description(signature=signature, source="config.pbtxt", kind=kind, uses=tuple(yes), not_uses=tuple(no))
    version, folder = layout.resolve_version(target.parent, target.name)
    model = layout.model_file(folder, target.name, entry.model_filename)
    from .probe import load_model  # input names follow forward(), as the torch backend names them

    names = load_model(model, target.name).argument_names
    signature = entry.signature(version, path=model, schema_names=names)
    return Description(signature=signature, source="model metadata", kind=kind, uses=tuple(yes), not_uses=tuple(no))


def render_description(description: Description) -> str:
    signature = description.signature
    version = f" (version {signature.version})" if signature.version is not None else ""
    checked = {None: "", True: ", checked by running the model", False: ", not checked by a run"}[description.verified]
    batch = signature.max_batch_size
    batching = f"implicit, up to {batch} per request" if batch else "explicit: the first dim of each shape"
    rows = [
        ("model", f"{signature.name}{version}"),
        *((("kind", description.kind),) if description.kind else ()),
        ("source", f"{description.source}{checked}"),
        ("batch", batching),
        *((f"input {i}", _tensor(s, batch)) for i, s in enumerate(signature.inputs)),
        *((f"output {i}", _tensor(s, batch)) for i, s in enumerate(signature.outputs)),
        *(("use", use) for use in description.uses),
        *(("not", use) for use in description.not_uses),
    ]
    width = max(len(k) for k, _ in rows)
    return "".join(f"{k:<{width}}  {v}\n" for k, v in rows) + "(-1: any size)\n"


def render_reports(reports: Sequence[EntryReport]) -> str:
    """The table of models, kinds, versions, inputs, outputs and status, then every problem, note and use."""
    header = ("MODEL", "KIND", "VERSIONS", "INPUTS", "OUTPUTS", "STATUS")
    rows = [header]
    for r in reports:
        rows.append((r.name, r.kind, ",".join(map(str, r.versions)) or "-", *_tensors(r.signature), _status(r)))
    lines = table(rows)
    for r in reports:
        lines += [f"{r.name}: {p}" for p in r.problems] + [f"{r.name}: note: {n}" for n in r.notes]
        lines += [f"{r.name}: use: {u}" for u in r.uses] + [f"{r.name}: not: {u}" for u in r.not_uses]
    return "\n".join(lines) + "\n"


def table(rows: Sequence[Sequence[str]]) -> list[str]:
    """Rows as left-aligned columns two spaces apart (the first row is the header)."""
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    return ["  ".join(cell.ljust(w) for cell, w in zip(row, widths, strict=True)).rstrip() for row in rows]


def _tensors(signature: ModelSignature | None) -> tuple[str, str]:
    if signature is None:
        return "-", "-"
    batch = signature.max_batch_size
    return (
        "; ".join(_tensor(s, batch) for s in signature.inputs),
        "; ".join(_tensor(s, batch) for s in signature.outputs),
    )


def _status(report: EntryReport) -> str:
    return f"{len(report.problems)} problem(s)" if report.problems else "ok"


def _tensor(spec: TensorSpec, max_batch_size: int) -> str:
    return f"{spec.name} {spec.dtype} {list(spec.full_shape(max_batch_size))}"


def replace_problems(report: EntryReport, extra: Sequence[str], notes: Sequence[str] = ()) -> EntryReport:
    """``report`` with more problems and notes (the comparison with a server adds them)."""
    return replace(report, problems=(*report.problems, *extra), notes=(*report.notes, *notes))
