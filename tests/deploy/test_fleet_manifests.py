"""What docs/fleet.md promises about the fleet's manifests, beyond what a schema can see.

Probes on the right paths and ports, Triton listening beyond loopback, the headless Service answering with the
Deployment's ready pods on their own ports, the ingress routing gRPC to the gRPC port with a referenced TLS
Secret, a disruption budget that keeps replicas, shutdown that fits its grace period, and every volume claim
present in the namespace that mounts it.
"""

from __future__ import annotations

from typing import Any

from .manifests import (
    Manifest,
    container,
    container_port,
    flags,
    load_all,
    of_kind,
    one,
    pod_labels,
    pod_spec,
    selects,
    workloads,
)

LIVE = "/v2/health/live"
READY = "/v2/health/ready"
LOOPBACK = ("127.0.0.1", "localhost", "::1")


def triton() -> tuple[Manifest, dict[str, Any], dict[str, str]]:
    deployment = one("Deployment", "triton", "triton")
    server = container(deployment, "tritonserver")
    return deployment, server, flags(server["args"])


def test_probes_ask_triton_health_endpoints_on_its_http_port() -> None:
    _, server, args = triton()
    http = int(args.get("http-port", 8000))
    probes = {kind: server[kind]["httpGet"] for kind in ("livenessProbe", "readinessProbe", "startupProbe")}
    assert probes["livenessProbe"]["path"] == LIVE  # alive while loading: never restarted for a slow load
    assert probes["readinessProbe"]["path"] == READY
    assert probes["startupProbe"]["path"] == READY
    for kind, probe in probes.items():
        assert container_port(server, probe["port"]) == http, f"{kind} is not on --http-port {http}"


def test_readiness_means_every_model_is_loaded() -> None:
    _, _, args = triton()
    assert args.get("strict-readiness", "true") == "true"
    assert args["model-control-mode"] in ("none", "explicit")  # never poll: replicas would drift apart


def test_startup_allows_minutes_to_load_models() -> None:
    _, server, _ = triton()
    startup = server["startupProbe"]
    assert startup["periodSeconds"] * startup["failureThreshold"] >= 300


def test_triton_listens_on_the_pod_ip_not_loopback() -> None:
    _, server, args = triton()
    for service in ("http", "grpc", "metrics"):
        assert args.get(f"{service}-address", "0.0.0.0") not in LOOPBACK  # noqa: S104 - the pod's own interfaces
        assert container_port(server, service) == int(args[f"{service}-port"])


def test_model_repository_is_the_read_only_volume() -> None:
    deployment, server, args = triton()
    mount = next(m for m in server["volumeMounts"] if m["mountPath"] == args["model-repository"])
    assert mount.get("readOnly") is True
    volume = next(v for v in pod_spec(deployment)["volumes"] if v["name"] == mount["name"])
    assert "persistentVolumeClaim" in volume


def test_shutdown_fits_the_grace_period() -> None:
    """preStop, then Triton's wait for requests in flight, must end before Kubernetes' SIGKILL."""
    deployment, server, args = triton()
    command = server["lifecycle"]["preStop"]["exec"]["command"]
    assert command[0] == "sleep"
    needed = int(command[1]) + int(args["exit-timeout-secs"])
    assert pod_spec(deployment)["terminationGracePeriodSeconds"] > needed


def test_headless_service_answers_with_the_deployments_pods_on_their_own_ports() -> None:
    deployment, server, args = triton()
    headless = one("Service", "triton-headless", "triton").doc["spec"]
    assert headless["clusterIP"] == "None"
    assert headless.get("publishNotReadyAddresses", False) is False  # only ready replicas in the DNS answer
    assert headless["selector"] == deployment.doc["spec"]["selector"]["matchLabels"]
    assert selects(headless["selector"], pod_labels(deployment))
    ports = {p["name"]: p for p in headless["ports"]}
    # A client of a headless Service dials the pod IPs: the Service port must be the container port.
    for port in ports.values():
        assert port["port"] == container_port(server, port["targetPort"])
    assert ports["grpc"]["port"] == int(args["grpc-port"])
    assert ports["grpc"]["appProtocol"] == "kubernetes.io/h2c"


def test_clusterip_service_selects_the_same_pods_with_metrics() -> None:
    deployment, server, _ = triton()
    service = one("Service", "triton", "triton").doc["spec"]
    assert service.get("clusterIP") != "None"
    assert selects(service["selector"], pod_labels(deployment))
    names = {p["name"] for p in service["ports"]}
    assert {"http", "grpc", "metrics"} <= names
    for port in service["ports"]:
        container_port(server, port["targetPort"])  # every target exists


def test_ingress_routes_grpc_to_the_grpc_port_with_a_tls_secret() -> None:
    services = {(m.namespace, m.name): m.doc["spec"] for m in of_kind("Service")}
    protocols = set()
    for ingress in of_kind("Ingress"):
        spec, annotations = ingress.doc["spec"], ingress.doc["metadata"].get("annotations", {})
        protocol = annotations["nginx.ingress.kubernetes.io/backend-protocol"]
        protocols.add(protocol)
        tls_hosts = {h for tls in spec["tls"] for h in tls["hosts"]}
        assert all(tls["secretName"] for tls in spec["tls"]), f"{ingress.id}: TLS without a Secret"
        for rule in spec["rules"]:
            assert rule["host"] in tls_hosts, f"{ingress.id}: {rule['host']} is served without TLS"
            for path in rule["http"]["paths"]:
                backend = path["backend"]["service"]
                service = services[(ingress.namespace, backend["name"])]
                port = next(p for p in service["ports"] if p["name"] == backend["port"]["name"])
                assert port["appProtocol"] == ("kubernetes.io/h2c" if protocol == "GRPC" else "http"), ingress.id
    assert "GRPC" in protocols


def test_disruption_budget_keeps_replicas_serving() -> None:
    deployment, _, _ = triton()
    budget = one("PodDisruptionBudget", "triton", "triton").doc["spec"]
    assert selects(budget["selector"], pod_labels(deployment))
    assert 0 < budget["maxUnavailable"] < deployment.doc["spec"]["replicas"]
    assert deployment.doc["spec"]["strategy"]["rollingUpdate"]["maxUnavailable"] == 0


def test_every_claim_a_pod_mounts_is_in_its_namespace() -> None:
    claims = {(m.namespace, m.name) for m in of_kind("PersistentVolumeClaim")}
    for workload in workloads():
        for volume in pod_spec(workload).get("volumes", []):
            if "persistentVolumeClaim" in volume:
                claim = volume["persistentVolumeClaim"]["claimName"]
                assert (workload.namespace, claim) in claims, f"{workload.id}: no claim {claim!r}"
    for service in of_kind("InferenceService"):
        uri = service.doc["spec"]["predictor"]["model"]["storageUri"]
        assert uri.startswith("pvc://")
        assert (service.namespace, uri[len("pvc://") :].split("/")[0]) in claims, service.id


def test_every_namespaced_object_has_its_namespace_in_deploy() -> None:
    """Applying deploy/ to an empty cluster needs no namespace made by hand."""
    namespaces = {m.name for m in of_kind("Namespace")}
    for manifest in load_all():
        if manifest.kind != "Namespace":
            assert manifest.namespace in namespaces, f"{manifest.id}: namespace {manifest.namespace!r}"
