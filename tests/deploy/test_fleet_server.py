"""The fleet Deployment's Triton flags on a real ``tritonserver`` (2.51, the NGC 24.10 release), with the Job's spec.

No cluster can run here, but the Deployment's server can: its flags go to ``LocalTritonServer`` as they are, with
``$(TRITON_ADMIN_KEY)`` expanded as Kubernetes does, except the ones the launcher owns (repository, addresses,
ports: it binds loopback on free ports here, where the pod binds 0.0.0.0). So a flag 2.51 does not know, or a
value it refuses, fails this test rather than a rollout. Then what the manifests rely on: the probes' paths
answer on the HTTP port, the restricted APIs want the key (and take it), no client can load or unload a model,
and the app's backend spec from the Job (host swapped for this server) opens and infers with the sample model,
whose config.pbtxt the app compares with the server's as the MAP does.
"""

from __future__ import annotations

import secrets
import tempfile
import urllib.error
import urllib.request
from collections.abc import Iterator

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from tritonclient.utils import InferenceServerException

from monai_triton_ops import app_args, create_backend
from monai_triton_ops.backends.registry import parse_backend_spec
from monai_triton_ops.server import LocalTritonServer, TritonInstall

from ..server.conftest import stop_and_check
from ..server.conftest import triton_install as triton_install
from .manifests import REPO, container, env_values, expand, flags, one, secret_env

pytestmark = pytest.mark.triton

MODEL = "brain_tissue_seg"
#: Flags ``LocalTritonServer`` sets itself (``server/options.build_argv``): given by the launcher, not the manifest.
LAUNCHER_FLAGS = {
    "model-repository",
    "backend-directory",
    "http-address",
    "http-port",
    "grpc-address",
    "grpc-port",
    "metrics-address",
    "metrics-port",
    "model-control-mode",
    "exit-timeout-secs",
    "log-verbose",
}
#: Flags the launcher sets to the same value the Deployment must have, or this run would not be the pod's.
SAME_AS_LAUNCHER = {"exit-on-error": "true", "strict-readiness": "true"}
HEADER = "triton-admin-key"
#: Triton 2.51 expects a restricted gRPC protocol's header under this prefix (its error message says so).
GRPC_HEADER = f"triton-grpc-protocol-{HEADER}"


def deployment_args(key: str) -> dict[str, str]:
    """The Deployment's flags as the pod sees them: ``$(VAR)`` expanded from its environment (the Secret's key)."""
    server = container(one("Deployment", "triton"), "tritonserver")
    environment = {**env_values(server), **dict.fromkeys(secret_env(server), key)}
    return flags([expand(arg, environment) for arg in server["args"]])


@pytest.fixture(scope="module")
def admin_key() -> str:
    return secrets.token_hex(16)


@pytest.fixture(scope="module")
def fleet_server(
    triton_install: TritonInstall, admin_key: str, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[LocalTritonServer]:
    args = deployment_args(admin_key)
    for flag, value in SAME_AS_LAUNCHER.items():
        assert args.get(flag, value) == value, f"--{flag}={args[flag]}: the local run would not be the pod's"
    extra = [f"--{flag}={value}" for flag, value in args.items() if flag not in LAUNCHER_FLAGS | set(SAME_AS_LAUNCHER)]
    folder = tmp_path_factory.mktemp("fleet_server")
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(tempfile, "tempdir", str(folder))
        server = LocalTritonServer(
            REPO / "model_repository",
            model_control_mode=args["model-control-mode"],
            stop_timeout_s=float(args["exit-timeout-secs"]),
            startup_timeout_s=180.0,
            extra_args=extra,
        )
        try:
            server.start()
            yield server
        finally:
            stop_and_check(server)


def _status(url: str, *, method: str = "GET", headers: dict[str, str] | None = None) -> int:
    request = urllib.request.Request(url, method=method, headers=headers or {}, data=b"" if method == "POST" else None)
    try:
        with urllib.request.urlopen(request, timeout=10) as response:
            return int(response.status)
    except urllib.error.HTTPError as exc:
        return exc.code


def test_probe_paths_answer_on_the_http_port(fleet_server: LocalTritonServer) -> None:
    server = container(one("Deployment", "triton"), "tritonserver")
    for probe in ("livenessProbe", "readinessProbe", "startupProbe"):
        assert _status(fleet_server.http_url + server[probe]["httpGet"]["path"]) == 200, probe


def test_restricted_apis_want_the_admin_key(fleet_server: LocalTritonServer, admin_key: str) -> None:
    status = f"{fleet_server.http_url}/v2/systemsharedmemory/status"
    assert _status(status) == 403
    assert _status(status, headers={HEADER: "wrong"}) == 403
    assert _status(status, headers={HEADER: admin_key}) == 200
    client = grpcclient.InferenceServerClient(fleet_server.grpc_address)
    try:
        with pytest.raises(InferenceServerException, match=GRPC_HEADER):
            client.get_system_shared_memory_status(client_timeout=10)
        with pytest.raises(InferenceServerException, match=GRPC_HEADER):
            client.get_system_shared_memory_status(headers={HEADER: admin_key}, client_timeout=10)
        client.get_system_shared_memory_status(headers={GRPC_HEADER: admin_key}, client_timeout=10)
        # What clients need stays open: health, metadata, the model's config, statistics.
        assert client.is_model_ready(MODEL, client_timeout=10)
        assert client.get_model_config(MODEL, client_timeout=10).config.name == MODEL
        client.get_inference_statistics(MODEL, client_timeout=10)
    finally:
        client.close()


def test_no_client_can_load_or_unload_a_model(fleet_server: LocalTritonServer) -> None:
    client = httpclient.InferenceServerClient(fleet_server.http_address, network_timeout=10)
    try:
        with pytest.raises(InferenceServerException):
            client.unload_model(MODEL)
        assert client.is_model_ready(MODEL)
    finally:
        client.close()


def test_the_jobs_backend_spec_opens_and_infers(fleet_server: LocalTritonServer) -> None:
    app = container(one("Job", "brain-tissue-seg-"), "app")
    spec = env_values(app)[app_args.ENV_BACKEND]
    (url,) = parse_backend_spec(spec).urls
    here = spec.replace(url.split("://", 1)[1], fleet_server.grpc_address, 1)
    # The MAP's model folder holds the same repository: the app compares its config.pbtxt with the server's.
    with create_backend(here, MODEL, model_repository=REPO / "model_repository") as backend:
        image = np.random.default_rng(0).standard_normal((1, 1, 32, 32, 32), dtype=np.float32)
        logits = backend.infer({"x": image})["OUTPUT__0"]
    assert logits.shape == (1, 3, 32, 32, 32)
    assert np.isfinite(logits).all()
