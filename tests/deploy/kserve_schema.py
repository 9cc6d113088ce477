"""A JSON Schema of KServe's ``InferenceService`` (``serving.kserve.io/v1beta1``), built from the ``kserve`` wheel.

No package on PyPI ships the CRD itself; the ``kserve`` wheel ships the Python SDK's models, which KServe
generates from the same OpenAPI definitions as the CRD: per class, ``openapi_types`` (attribute -> type),
``attribute_map`` (attribute -> JSON field) and a "must not be ``None``" check for each required field. They are
read from the wheel as text (``ast``), never imported: ``kserve`` pulls in a model server we do not need here.
Kubernetes types the models refer to (``V1Container``, ``V1ObjectMeta``...) resolve to the definitions of
``kubernetes-validate``, so a container inside an InferenceService is checked as strictly as one in a Deployment.
What this cannot check: CRD-level validation that the SDK does not carry (patterns, enums, CEL rules) and what the
KServe webhook refuses at admission.
"""

from __future__ import annotations

import ast
import re
import zipfile
from pathlib import Path
from typing import Any

API_VERSION = "serving.kserve.io/v1beta1"
KIND = "InferenceService"
#: The Kubernetes definitions' ``$id`` is ``https://kubernetes.io/api/_definitions.json``; ours sits beside it.
SCHEMA_ID = "https://kubernetes.io/api/kserve/inferenceservice-v1beta1.json"
_K8S_DEFS = "/api/_definitions.json#/$defs/"
_MODELS = "kserve/models/"
_REQUIRED = re.compile(r"Invalid value for `(\w+)`, must not be `None`")
_PRIMITIVES: dict[str, dict[str, Any]] = {
    "str": {"type": "string"},
    "int": {"type": "integer"},
    "float": {"type": "number"},
    "bool": {"type": "boolean"},
    "object": {},
    "datetime": {"type": "string"},
    "date": {"type": "string"},
}
_QUANTITY = "io.k8s.apimachinery.pkg.api.resource.Quantity"
#: Quantities under the SDK's names; the SDK has no class for them (``V1beta1MetricQuantity`` is one in Go).
_QUANTITY_TYPES = frozenset({"ResourceQuantity", "K8sIoApimachineryPkgApiResourceQuantity", "V1beta1MetricQuantity"})


class _Model:
    """One generated SDK class: its JSON fields with their SDK types, and the required ones."""

    def __init__(self, fields: dict[str, str], required: list[str]) -> None:
        self.fields = fields
        self.required = required


def read_models(wheel: Path) -> dict[str, _Model]:
    """Every model class of the wheel's ``kserve/models/`` package, by class name."""
    models: dict[str, _Model] = {}
    with zipfile.ZipFile(wheel) as archive:
        for name in archive.namelist():
            if name.startswith(_MODELS) and name.endswith(".py"):
                models.update(_models_in(archive.read(name).decode()))
    if "V1beta1InferenceService" not in models:
        raise ValueError(f"{wheel} holds no V1beta1InferenceService model: not a kserve SDK wheel?")
    return models


def _models_in(source: str) -> dict[str, _Model]:
    found: dict[str, _Model] = {}
    for node in ast.parse(source).body:
        if not isinstance(node, ast.ClassDef):
            continue
        tables = {
            target.id: ast.literal_eval(stmt.value)
            for stmt in node.body
            if isinstance(stmt, ast.Assign)
            for target in stmt.targets
            if isinstance(target, ast.Name) and target.id in ("openapi_types", "attribute_map")
        }
        if set(tables) != {"openapi_types", "attribute_map"}:
            continue
        types, names = tables["openapi_types"], tables["attribute_map"]
        class_source = ast.get_source_segment(source, node) or ""
        required = sorted({names[attr] for attr in _REQUIRED.findall(class_source) if attr in names})
        found[node.name] = _Model({names[attr]: sdk_type for attr, sdk_type in types.items()}, required)
    return found


def inference_service_schema(models: dict[str, _Model], k8s_definitions: dict[str, Any]) -> dict[str, Any]:
    """The schema of one InferenceService manifest; unknown fields are refused at every level.

    ``status`` is left out: the controller writes it (with Knative types the SDK does not model), a manifest never.
    """
    defs: dict[str, Any] = {}
    pending = ["V1beta1InferenceService"]
    k8s_names = _k8s_index(k8s_definitions)
    while pending:
        name = pending.pop()
        if name in defs:
            continue
        model = models[name]
        fields = {f: t for f, t in model.fields.items() if not (name == "V1beta1InferenceService" and f == "status")}
        properties = {field: _type(sdk, models, k8s_names, pending) for field, sdk in fields.items()}
        defs[name] = {"type": "object", "properties": properties, "additionalProperties": False}
        if model.required:
            defs[name]["required"] = model.required
    root = dict(defs["V1beta1InferenceService"])
    root["properties"] = {**root["properties"], "apiVersion": {"const": API_VERSION}, "kind": {"const": KIND}}
    root["required"] = sorted({*root.get("required", ()), "apiVersion", "kind", "metadata", "spec"})
    return {"$schema": "https://json-schema.org/draft/2020-12/schema", "$id": SCHEMA_ID, **root, "$defs": defs}


def _type(sdk: str, models: dict[str, _Model], k8s: dict[str, str], pending: list[str]) -> dict[str, Any]:
    """One SDK type string (``list[V1EnvVar]``, ``dict(str, str)``, ``V1beta1ModelSpec``...) as a schema."""
    if sdk.startswith("list[") and sdk.endswith("]"):
        return {"type": "array", "items": _type(sdk[5:-1], models, k8s, pending)}
    if sdk.startswith("dict(str, ") and sdk.endswith(")"):
        return {"type": "object", "additionalProperties": _type(sdk[10:-1], models, k8s, pending)}
    if sdk in _PRIMITIVES:
        return _PRIMITIVES[sdk]
    if sdk in _QUANTITY_TYPES:
        return {"$ref": _K8S_DEFS + _QUANTITY}
    if sdk in models:
        pending.append(sdk)
        return {"$ref": f"#/$defs/{sdk}"}
    if sdk in k8s:
        return {"$ref": _K8S_DEFS + k8s[sdk]}
    raise ValueError(f"kserve SDK type {sdk!r} is neither a kserve model nor a Kubernetes definition")


def _k8s_index(definitions: dict[str, Any]) -> dict[str, str]:
    """SDK class names of Kubernetes types -> definition keys.

    The SDK names a Kubernetes type by its version and kind (``V1Container``; core and meta first when a kind is in
    several groups), or by its Go package path when that is ambiguous (``K8sIoApiAppsV1DeploymentStrategy``).
    """
    index: dict[str, str] = {}
    preference = ("io.k8s.api.core.", "io.k8s.apimachinery.pkg.apis.meta.")
    keys = sorted(definitions["$defs"], key=lambda k: (not k.startswith(preference), not k.startswith(preference[0])))
    for key in keys:
        parts = key.split(".")
        if len(parts) < 4 or parts[:2] != ["io", "k8s"]:
            continue
        version, kind = parts[-2], parts[-1]
        index.setdefault(version[:1].upper() + version[1:] + kind, key)
        go_path = ["k8s", "io", *parts[2:]]
        index.setdefault("".join(p[:1].upper() + p[1:] for p in go_path), key)
    return index
