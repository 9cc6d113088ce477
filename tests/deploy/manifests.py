"""The manifests under ``deploy/``, read once, and the small lookups the tests share.

Every YAML document of every file is a :class:`Manifest`; ``kustomization.yaml`` files are kustomize's
configuration, not Kubernetes objects, and are read apart (:func:`kustomizations`).
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from dataclasses import dataclass
from functools import cache
from pathlib import Path
from typing import Any

import yaml

REPO = Path(__file__).resolve().parents[2]
DEPLOY = REPO / "deploy"
KUSTOMIZATION = "kustomization.yaml"
#: Kubernetes expands ``$(VAR)`` in a container's command and args from the container's environment.
_K8S_VAR = re.compile(r"\$\(([A-Za-z_][A-Za-z0-9_]*)\)")


@dataclass(frozen=True)
class Manifest:
    """One Kubernetes object: the file it is in (relative to the repository), its place there, its content."""

    path: Path
    index: int
    doc: dict[str, Any]

    @property
    def kind(self) -> str:
        return str(self.doc["kind"])

    @property
    def name(self) -> str:
        """``metadata.name``, or ``generateName`` for objects created with a fresh name each time."""
        meta = self.doc["metadata"]
        return str(meta.get("name") or meta["generateName"])

    @property
    def namespace(self) -> str | None:
        return self.doc["metadata"].get("namespace")

    @property
    def id(self) -> str:
        return f"{self.path.relative_to('deploy')}#{self.index}:{self.kind}/{self.name}"


@cache
def load_all() -> tuple[Manifest, ...]:
    """Every object in every ``deploy/**/*.yaml`` except kustomizations, in file order."""
    found = []
    for path in sorted(DEPLOY.rglob("*.yaml")):
        if path.name == KUSTOMIZATION:
            continue
        docs = [d for d in yaml.safe_load_all(path.read_text()) if d is not None]
        found += [Manifest(path.relative_to(REPO), i, doc) for i, doc in enumerate(docs)]
    return tuple(found)


def kustomizations() -> dict[Path, dict[str, Any]]:
    """``{folder: kustomization}`` for every folder of ``deploy/`` that has one."""
    return {p.parent: yaml.safe_load(p.read_text()) for p in sorted(DEPLOY.rglob(KUSTOMIZATION))}


def one(kind: str, name: str, namespace: str | None = None) -> Manifest:
    """The single object of ``kind`` named ``name`` (and in ``namespace``, when given)."""
    hits = [m for m in load_all() if m.kind == kind and m.name == name and namespace in (None, m.namespace)]
    assert len(hits) == 1, f"expected one {kind} {name!r} in deploy/, found {[m.id for m in hits]}"
    return hits[0]


def of_kind(kind: str) -> list[Manifest]:
    return [m for m in load_all() if m.kind == kind]


def pod_spec(manifest: Manifest) -> dict[str, Any]:
    """The pod a workload runs: a Pod's spec, or a Deployment's or Job's pod template spec."""
    spec = manifest.doc["spec"]
    return spec if manifest.kind == "Pod" else spec["template"]["spec"]


def pod_labels(manifest: Manifest) -> dict[str, str]:
    meta = manifest.doc["metadata"] if manifest.kind == "Pod" else manifest.doc["spec"]["template"]["metadata"]
    return dict(meta.get("labels", {}))


WORKLOAD_KINDS = frozenset({"Pod", "Deployment", "Job", "StatefulSet", "DaemonSet"})


def workloads() -> list[Manifest]:
    """Everything that runs a pod."""
    return [m for m in load_all() if m.kind in WORKLOAD_KINDS]


def containers(spec: dict[str, Any]) -> Iterator[dict[str, Any]]:
    yield from spec.get("initContainers", [])
    yield from spec["containers"]


def container(manifest: Manifest, name: str) -> dict[str, Any]:
    hits = [c for c in containers(pod_spec(manifest)) if c["name"] == name]
    assert len(hits) == 1, f"{manifest.id}: expected one container {name!r}"
    return hits[0]


def flags(args: list[str]) -> dict[str, str]:
    """``["--a=1", "--b=x"]`` -> ``{"a": "1", "b": "x"}``; a flag given twice is an error (which one wins?)."""
    parsed: dict[str, str] = {}
    for arg in args:
        assert arg.startswith("--"), f"expected --flag=value, got {arg!r}"
        assert "=" in arg, f"expected --flag=value, got {arg!r}"
        key, value = arg[2:].split("=", 1)
        assert key not in parsed, f"--{key} given twice"
        parsed[key] = value
    return parsed


def env_values(c: dict[str, Any]) -> dict[str, str]:
    """A container's literal environment (``value:`` entries only)."""
    return {e["name"]: e["value"] for e in c.get("env", []) if "value" in e}


def secret_env(c: dict[str, Any]) -> dict[str, tuple[str, str]]:
    """``{VAR: (secret, key)}`` for the container's variables that come from a Secret."""
    found = {}
    for e in c.get("env", []):
        ref = e.get("valueFrom", {}).get("secretKeyRef")
        if ref:
            found[e["name"]] = (ref["name"], ref["key"])
    return found


def k8s_vars(text: str) -> list[str]:
    """The ``$(VAR)`` references Kubernetes expands in ``text``."""
    return _K8S_VAR.findall(text)


def expand(text: str, env: dict[str, str]) -> str:
    """What Kubernetes makes of ``text`` in a container whose environment is ``env``."""
    return _K8S_VAR.sub(lambda m: env.get(m.group(1), m.group(0)), text)


def container_port(c: dict[str, Any], port: int | str) -> int:
    """A Service's or probe's ``targetPort``/``port`` (a number, or a container port's name) as a number."""
    if isinstance(port, int):
        assert any(p["containerPort"] == port for p in c.get("ports", [])), f"no container port {port}"
        return port
    hits = [p["containerPort"] for p in c.get("ports", []) if p.get("name") == port]
    assert len(hits) == 1, f"container {c['name']!r} has no port named {port!r}"
    return int(hits[0])


def namespace_labels(name: str) -> dict[str, str]:
    """A Namespace's labels, with the ``kubernetes.io/metadata.name`` label Kubernetes adds to every namespace.

    A namespace that ``deploy/`` does not create (``kube-system``, the ingress controller's) has only that one.
    """
    found = [m for m in of_kind("Namespace") if m.name == name]
    labels = dict(found[0].doc["metadata"].get("labels", {})) if found else {}
    return {**labels, "kubernetes.io/metadata.name": name}


def selects(selector: dict[str, Any], labels: dict[str, str]) -> bool:
    """Whether a label selector (``matchLabels`` form, or a Service's plain map) matches ``labels``."""
    if "matchExpressions" in selector:
        raise NotImplementedError("matchExpressions: not used in deploy/, not evaluated here")
    wanted = selector.get("matchLabels", selector)
    return all(labels.get(k) == v for k, v in wanted.items())
