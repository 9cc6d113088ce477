"""No secret written into a manifest; pods the "restricted" Pod Security Standard admits; network paths that let
the app reach the fleet and nothing else.

Each checker returns what is wrong, and is also run on a deliberately bad object, so a checker that finds
nothing anywhere cannot pass.
"""

from __future__ import annotations

import copy
import re
from pathlib import Path

from .manifests import (
    DEPLOY,
    REPO,
    WORKLOAD_KINDS,
    Manifest,
    container,
    container_port,
    containers,
    k8s_vars,
    load_all,
    namespace_labels,
    of_kind,
    one,
    pod_labels,
    pod_spec,
    secret_env,
    selects,
    workloads,
)

#: Variable names that hold credentials: their value must come from a Secret, never be written out. A name
#: ending in _FILE, _PATH or _DIR holds where a mounted Secret is, which is how a secret should travel.
SECRETISH = re.compile(r"KEY|TOKEN|PASSWORD|PASSWD|SECRET|CREDENTIAL|CERT|AUTH", re.IGNORECASE)
A_PATH = re.compile(r"_(FILE|PATH|DIR)$")
#: What a key, a certificate or a bearer token looks like when pasted into a file.
PASTED = re.compile(r"-----BEGIN [A-Z ]+-----|\bBearer\s+[A-Za-z0-9._~+/-]{16,}|\bghp_[A-Za-z0-9]{20,}")
#: Triton flags whose value carries a header key and value: ``<apis>:<header>=<value>``.
RESTRICTED_FLAGS = ("grpc-restricted-protocol", "http-restricted-api")


def inlined_secrets(manifest: Manifest) -> list[str]:
    """A Secret object, a credential variable with a literal value, a restricted-API key that is not $(VAR)."""
    problems = []
    if manifest.kind == "Secret":
        problems.append(f"{manifest.id}: a Secret in a manifest (create it out of band: docs/fleet.md)")
    pod_containers = list(containers(pod_spec(manifest))) if manifest.kind in WORKLOAD_KINDS else []
    env_lists = [c.get("env", []) for c in pod_containers]
    if manifest.kind == "InferenceService":
        env_lists.append(manifest.doc["spec"]["predictor"]["model"].get("env", []))
    for env in env_lists:
        for entry in env:
            name = entry["name"]
            if "value" in entry and SECRETISH.search(name) and not A_PATH.search(name):
                problems.append(f"{manifest.id}: {name} has a literal value; use valueFrom.secretKeyRef")
    for c in pod_containers:
        for arg in c.get("args", []):
            flag, _, value = arg.partition("=")
            if flag.lstrip("-") in RESTRICTED_FLAGS:
                header_value = value.partition(":")[2].partition("=")[2]
                names = k8s_vars(header_value)
                if header_value != f"$({''.join(names)})" or names[0] not in secret_env(c):
                    problems.append(f"{manifest.id}: {flag} value is not $(VAR) from a Secret")
    return problems


def test_no_secret_is_written_into_a_manifest() -> None:
    problems = [p for m in load_all() for p in inlined_secrets(m)]
    assert not problems, problems


def test_no_key_certificate_or_token_is_pasted_into_deploy() -> None:
    pasted = [str(p.relative_to(REPO)) for p in DEPLOY.rglob("*") if p.is_file() and PASTED.search(p.read_text())]
    assert not pasted, pasted


def test_secret_checks_find_what_they_are_for() -> None:
    deployment = copy.deepcopy(one("Deployment", "triton").doc)
    server = deployment["spec"]["template"]["spec"]["containers"][0]
    server["args"] = [a.replace("$(TRITON_ADMIN_KEY)", "s3cr3t") if "restricted" in a else a for a in server["args"]]
    server["env"].append({"name": "AUTH_TOKEN", "value": "abc"})
    bad = Manifest(Path("deploy/fleet/deployment.yaml"), 0, deployment)
    found = inlined_secrets(bad)
    assert any("AUTH_TOKEN" in p for p in found), found
    assert sum("--" in p for p in found) == 2, found
    assert PASTED.search("x: -----BEGIN PRIVATE KEY-----\nMIIE")


def test_tls_and_admin_key_are_secrets_referenced_by_name() -> None:
    for ingress in of_kind("Ingress"):
        assert all(tls["secretName"] for tls in ingress.doc["spec"]["tls"])
    server = container(one("Deployment", "triton", "triton"), "tritonserver")
    assert secret_env(server), "the restricted APIs' key must come from a Secret"


def restricted_violations(manifest: Manifest) -> list[str]:
    """What the "restricted" Pod Security Standard refuses, for the fields these manifests use."""
    spec, problems = pod_spec(manifest), []
    pod_security = spec.get("securityContext", {})
    for key in ("hostNetwork", "hostPID", "hostIPC"):
        if spec.get(key):
            problems.append(f"{manifest.id}: {key}")
    for volume in spec.get("volumes", []):
        if not {"persistentVolumeClaim", "emptyDir", "configMap", "secret", "projected"} & set(volume):
            problems.append(f"{manifest.id}: volume {volume['name']} is not of an allowed type")
    for c in containers(spec):
        security = {**pod_security, **c.get("securityContext", {})}
        if security.get("runAsNonRoot") is not True or security.get("runAsUser") == 0:
            problems.append(f"{manifest.id}/{c['name']}: may run as root")
        if security.get("seccompProfile", {}).get("type") not in ("RuntimeDefault", "Localhost"):
            problems.append(f"{manifest.id}/{c['name']}: no RuntimeDefault seccomp profile")
        if security.get("allowPrivilegeEscalation") is not False or security.get("privileged"):
            problems.append(f"{manifest.id}/{c['name']}: privilege escalation allowed")
        if security.get("capabilities", {}).get("drop") != ["ALL"] or security.get("capabilities", {}).get("add"):
            problems.append(f"{manifest.id}/{c['name']}: Linux capabilities kept")
        if "memory" not in c.get("resources", {}).get("limits", {}):
            problems.append(f"{manifest.id}/{c['name']}: no memory limit")
    return problems


def test_pods_in_restricted_namespaces_meet_the_restricted_standard() -> None:
    enforce = "pod-security.kubernetes.io/enforce"
    restricted = {m.name for m in of_kind("Namespace") if m.doc["metadata"]["labels"].get(enforce) == "restricted"}
    checked = [w for w in workloads() if w.namespace in restricted]
    assert {w.kind for w in checked} >= {"Deployment", "Job"}
    problems = [p for w in checked for p in restricted_violations(w)]
    assert not problems, problems


def test_restricted_check_finds_what_admission_refuses() -> None:
    job = copy.deepcopy(one("Job", "brain-tissue-seg-").doc)
    spec = job["spec"]["template"]["spec"]
    del spec["securityContext"]["runAsNonRoot"]
    spec["containers"][0]["securityContext"]["allowPrivilegeEscalation"] = True
    spec["volumes"].append({"name": "host", "hostPath": {"path": "/"}})
    found = restricted_violations(Manifest(Path("deploy/app/job.yaml"), 0, job))
    assert len(found) == 3, found


def _allows(policy: Manifest, direction: str, namespace: str, labels: dict[str, str], port: int) -> bool:
    """Whether ``policy`` admits traffic to (ingress) or from (egress) pods of ``namespace`` with ``labels`` on
    ``port``. Kubernetes' rules: a rule without ports allows every port, a rule without peers every peer, a peer
    without a namespace selector means the policy's own namespace. Named ports resolve against the fleet's
    container (the only pods with named ports here); ``ipBlock`` peers are never pods, so they never match."""
    server = container(one("Deployment", "triton", "triton"), "tritonserver")
    side = "from" if direction == "ingress" else "to"
    for rule in policy.doc["spec"].get(direction, []):
        ports = rule.get("ports")
        if ports is not None and not any(
            "port" not in p or (p["port"] if isinstance(p["port"], int) else container_port(server, p["port"])) == port
            for p in ports
        ):
            continue
        peers = rule.get(side)
        if not peers:
            return True
        for peer in peers:
            if "ipBlock" in peer:
                continue
            if "namespaceSelector" in peer:
                in_namespace = selects(peer["namespaceSelector"], namespace_labels(namespace))
            else:
                in_namespace = namespace == policy.namespace
            if in_namespace and selects(peer.get("podSelector", {}), labels):
                return True
    return False


def _policies(workload: Manifest, policy_type: str) -> list[Manifest]:
    """The NetworkPolicies that isolate ``workload``'s pods for ``policy_type`` (Ingress or Egress)."""
    return [
        p
        for p in of_kind("NetworkPolicy")
        if p.namespace == workload.namespace
        and selects(p.doc["spec"]["podSelector"], pod_labels(workload))
        and policy_type in p.doc["spec"].get("policyTypes", ["Ingress"])
    ]


def test_the_app_reaches_the_fleet_over_grpc_and_nothing_else() -> None:
    job, deployment = one("Job", "brain-tissue-seg-", "monai-apps"), one("Deployment", "triton", "triton")
    grpc = container_port(container(deployment, "tritonserver"), "grpc")
    fleet_in = _policies(deployment, "Ingress")
    assert fleet_in, "the fleet's pods are open to every pod of the cluster"
    assert any(_allows(p, "ingress", job.namespace or "", pod_labels(job), grpc) for p in fleet_in)
    assert not any(_allows(p, "ingress", "default", {}, grpc) for p in fleet_in)  # any other namespace
    app_out = _policies(job, "Egress")
    assert app_out, "the app's egress is not restricted"
    assert any(_allows(p, "egress", deployment.namespace or "", pod_labels(deployment), grpc) for p in app_out)
    assert any(_allows(p, "egress", "kube-system", {"k8s-app": "kube-dns"}, 53) for p in app_out)
    # and nothing else: not the ingress controller, not another pod of the fleet's namespace, not an address
    assert not any(_allows(p, "egress", "ingress-nginx", {}, 443) for p in app_out)
    assert not any(_allows(p, "egress", deployment.namespace or "", {"app": "other"}, grpc) for p in app_out)
    assert not any("ipBlock" in peer for p in app_out for rule in p.doc["spec"]["egress"] for peer in rule["to"])
    assert _policies(job, "Ingress"), "the app's pods accept connections"
    assert not any(
        _allows(p, "ingress", deployment.namespace or "", pod_labels(deployment), grpc)
        for p in _policies(job, "Ingress")
    )
