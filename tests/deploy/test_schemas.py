"""Every manifest under ``deploy/`` against the Kubernetes API schemas, offline (no cluster can run here).

Kubernetes objects: ``kubernetes-validate``'s strict schemas (unknown fields refused), for the oldest Kubernetes
release the docs promise and for the newest the installed package knows. KServe's ``InferenceService``: the schema
``kserve_schema.py`` builds from the ``kserve`` SDK wheel that ``make setup`` downloads. Each validator is also
shown a broken copy, so a validator that accepts everything cannot pass.
"""

from __future__ import annotations

import copy
import sys
from pathlib import Path
from typing import Any

import jsonschema
import pytest
from kubernetes_validate import utils as k8s
from referencing import Registry, Resource

from . import kserve_schema
from .manifests import KUSTOMIZATION, Manifest, kustomizations, load_all, one, pod_spec

#: The oldest Kubernetes release docs/fleet.md promises (podFailurePolicy is on by default since 1.26, GA in 1.31).
OLDEST = "1.30"
VERSIONS = (OLDEST, k8s.latest_version())
#: Where ``make setup`` puts the KServe SDK wheel (downloaded, not installed: its server dependencies clash).
KSERVE_WHEELS = Path(sys.prefix) / "wheels"

MANIFESTS = load_all()
KUBERNETES = [m for m in MANIFESTS if m.kind != kserve_schema.KIND]
INFERENCE_SERVICES = [m for m in MANIFESTS if m.kind == kserve_schema.KIND]


def test_manifests_exist() -> None:
    kinds = {m.kind for m in MANIFESTS}
    assert {"Deployment", "Service", "Job", "Ingress", "NetworkPolicy", "InferenceService"} <= kinds


@pytest.mark.parametrize("version", VERSIONS)
@pytest.mark.parametrize("manifest", KUBERNETES, ids=lambda m: m.id)
def test_kubernetes_schema(manifest: Manifest, version: str) -> None:
    try:
        k8s.validate(manifest.doc, version, strict=True)
    except k8s.SchemaNotFoundError as exc:  # an unknown kind must fail, not pass unchecked
        pytest.fail(f"{manifest.id}: {exc.message}")
    except k8s.ValidationError as exc:
        pytest.fail(f"{manifest.id} against Kubernetes {version}: {'.'.join(map(str, exc.path))}: {exc.message}")


def test_kubernetes_validator_refuses_what_a_cluster_would() -> None:
    deployment = copy.deepcopy(one("Deployment", "triton").doc)
    spec = deployment["spec"]["template"]["spec"]
    spec["containers"][0]["livenessprobe"] = spec["containers"][0].pop("livenessProbe")  # a typo kubectl refuses
    with pytest.raises(k8s.ValidationError, match="livenessprobe"):
        k8s.validate(deployment, VERSIONS[-1], strict=True)
    job = copy.deepcopy(one("Job", "brain-tissue-seg-").doc)
    job["spec"]["backoffLimit"] = "two"
    with pytest.raises(k8s.ValidationError, match="two"):
        k8s.validate(job, VERSIONS[-1], strict=True)


@pytest.fixture(scope="module")
def kserve_validator() -> jsonschema.protocols.Validator:
    wheels = sorted(KSERVE_WHEELS.glob("kserve-*.whl"))
    if not wheels:
        pytest.skip(f"no kserve wheel in {KSERVE_WHEELS}: run make setup (pip download --no-deps kserve)")
    folder = f"kubernetes-json-schema/v{k8s.latest_version()}-local-strict"
    definitions = k8s.schema_contents(f"{folder}/_definitions.json", k8s.latest_version())
    schema = kserve_schema.inference_service_schema(kserve_schema.read_models(wheels[-1]), definitions)
    registry: Registry[Any] = Resource.from_contents(definitions) @ Registry()
    return jsonschema.Draft202012Validator(schema, registry=registry)


@pytest.mark.parametrize("manifest", INFERENCE_SERVICES, ids=lambda m: m.id)
def test_inference_service_schema(manifest: Manifest, kserve_validator: jsonschema.protocols.Validator) -> None:
    errors = [f"{'.'.join(map(str, e.path))}: {e.message}" for e in kserve_validator.iter_errors(manifest.doc)]
    assert not errors, f"{manifest.id}: {errors}"


def test_inference_service_validator_refuses_what_kserve_would(
    kserve_validator: jsonschema.protocols.Validator,
) -> None:
    good = INFERENCE_SERVICES[0].doc
    misspelt = copy.deepcopy(good)
    model = misspelt["spec"]["predictor"]["model"]
    model["modelformat"] = model.pop("modelFormat")
    messages = [e.message for e in kserve_validator.iter_errors(misspelt)]
    assert any("'modelformat' was unexpected" in m for m in messages), messages
    assert any("'modelFormat' is a required property" in m for m in messages), messages
    bad_env = copy.deepcopy(good)
    bad_env["spec"]["predictor"]["model"]["env"] = [{"name": "X", "valu": "1"}]  # a Kubernetes type inside
    assert not kserve_validator.is_valid(bad_env)
    bad_kind = copy.deepcopy(good)
    bad_kind["apiVersion"] = "serving.kserve.io/v1alpha1"
    assert not kserve_validator.is_valid(bad_kind)


@pytest.mark.parametrize("folder", sorted(kustomizations()), ids=lambda p: p.name)
def test_kustomization_lists_every_manifest_of_its_folder(folder: Path) -> None:
    """``kubectl apply -k`` applies what is listed: a file left out would silently not be deployed.

    Objects created under a fresh name per run (``generateName``: the app's Job) cannot be applied by kustomize;
    they are the only ones a kustomization may leave out.
    """
    listed = kustomizations()[folder]["resources"]
    files = sorted(p.name for p in folder.glob("*.yaml") if p.name != KUSTOMIZATION)
    generated = {
        m.path.name for m in MANIFESTS if m.path.parent.name == folder.name and "generateName" in m.doc["metadata"]
    }
    assert sorted(listed) == sorted(set(files) - generated)


def test_kustomization_image_override_names_the_deployments_image() -> None:
    """The ``images:`` entry must name the image the Deployment uses, or the override does nothing."""
    image = pod_spec(one("Deployment", "triton"))["containers"][0]["image"]
    fleet = next(k for folder, k in kustomizations().items() if folder.name == "fleet")
    assert [entry["name"] for entry in fleet["images"]] == [image.rsplit(":", 1)[0]]
